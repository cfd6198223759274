from django.urls import path

from knowledge.web.consumers import WorkspaceEventsConsumer

websocket_urlpatterns = [
    path("ws/workspaces/<slug:slug>/events/", WorkspaceEventsConsumer.as_asgi()),
]
