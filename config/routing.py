"""Websocket URL patterns of every app, mounted by config.asgi."""

from chat.routing import websocket_urlpatterns as chat_websockets
from knowledge.web.routing import websocket_urlpatterns as knowledge_websockets

websocket_urlpatterns: list = [*knowledge_websockets, *chat_websockets]
