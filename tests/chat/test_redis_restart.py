"""Redis restarted under an open chat: a real daphne on a Redis of the test's own, stopped and started."""

import asyncio

import pytest

from tests.chat.sockets import session_cookie
from tests.processes import PrivateRedis, daphne, process_env

pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "Who wrote the first algorithm for the Analytical Engine?"


def test_a_chat_open_while_redis_restarts_answers_its_next_question(handbook_workspace, viewer, chat_model, tmp_path):
    import websockets

    redis = PrivateRedis(tmp_path)
    redis.start()
    cookie = session_cookie(viewer)
    try:
        with daphne(process_env(REDIS_URL=redis.url)) as server:
            url = server.url.replace("http", "ws") + f"/ws/workspaces/{handbook_workspace.slug}/chat/"

            async def ask(socket) -> list[dict]:
                import json

                await socket.send(json.dumps({"type": "ask", "question": QUESTION}))
                events = []
                while not events or events[-1]["type"] not in {"done", "error"}:
                    events.append(json.loads(await asyncio.wait_for(socket.recv(), timeout=120)))
                return events

            async def chat() -> tuple[list[dict], list[dict]]:
                headers = {"Cookie": f"sessionid={cookie}", "Origin": server.url}
                async with websockets.connect(url, additional_headers=headers) as socket:
                    before = await ask(socket)
                    loop = asyncio.get_running_loop()
                    await loop.run_in_executor(None, redis.stop)
                    await asyncio.sleep(2)  # the server notices: its layer's reads fail meanwhile
                    await loop.run_in_executor(None, redis.start)
                    after = await ask(socket)
                return before, after

            before, after = asyncio.run(chat())
            log = server.log()
    finally:
        redis.stop()

    assert before[-1]["type"] == "done"
    assert after[-1]["type"] == "done", f"{after[-1]}\n{log[-3000:]}"
    assert "".join(event.get("text", "") for event in after if event["type"] == "token")
