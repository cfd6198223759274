"""Websocket URL patterns of every app, mounted by config.asgi."""

websocket_urlpatterns: list = []
