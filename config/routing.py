"""Websocket URL patterns of every app, mounted by config.asgi."""

from knowledge.routing import websocket_urlpatterns as knowledge_websockets

websocket_urlpatterns: list = [*knowledge_websockets]
