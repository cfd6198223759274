"""Talking to the chat websocket from tests, as the browser does (session cookie, origin, host)."""

from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client

from config.asgi import application

TIMEOUT = 30


def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


async def open_socket(user=None, slug="acme") -> WebsocketCommunicator:
    headers = [(b"origin", b"http://localhost"), (b"host", b"localhost")]
    if user is not None:
        cookie = await sync_to_async(session_cookie)(user)
        headers.append((b"cookie", f"sessionid={cookie}".encode()))
    communicator = WebsocketCommunicator(application, f"/ws/workspaces/{slug}/chat/", headers=headers)
    connected, _ = await communicator.connect(timeout=TIMEOUT)
    assert connected
    return communicator


async def events_until(communicator, *types: str) -> list[dict]:
    """Every event up to and including the first whose type is in `types`."""
    events = []
    while True:
        event = await communicator.receive_json_from(timeout=TIMEOUT)
        events.append(event)
        if event["type"] in types:
            return events


async def ask(communicator, question="Who wrote the first algorithm for the Analytical Engine?", **extra) -> list[dict]:
    await communicator.send_json_to({"type": "ask", "question": question, **extra})
    return await events_until(communicator, "done", "error")
