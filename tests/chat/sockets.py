"""Talking to the chat websocket from tests, as the browser does (session cookie, origin, host)."""

import json

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


PAGE_HEADERS = {"HX-Request": "true", "HX-Trigger": "ask-form", "HX-Current-URL": "http://localhost/"}


async def ask_as_page(
    communicator, question="Who wrote the first algorithm for the Analytical Engine?", **fields
) -> list[dict | str]:
    """Ask as the chat page's form does through htmx's websocket extension (every value a string,
    its HEADERS added); every frame up to the `done` or `error` event: events decoded, partials as
    the HTML they are."""
    await communicator.send_json_to({"type": "ask", "question": question, **fields, "HEADERS": PAGE_HEADERS})
    frames = []
    while True:
        text = (await communicator.receive_output(timeout=TIMEOUT))["text"]
        frame = json.loads(text) if text.startswith("{") else text
        frames.append(frame)
        if isinstance(frame, dict) and frame["type"] in {"done", "error"}:
            return frames
