import asyncio
import threading

import pytest
import redis
from django.conf import settings

from knowledge.rag.llm.background import BackgroundLoop
from knowledge.services import events


def test_a_call_that_outlives_its_timeout_is_cancelled():
    loop, cancelled = BackgroundLoop(), threading.Event()

    async def forever():
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    with pytest.raises(TimeoutError):
        loop.run(forever(), timeout=0.05)
    assert cancelled.wait(5)


def test_progress_events_reuse_one_redis_connection():
    """Each event on a loop of its own opened a connection: ~10 ms of a worker's time per event."""
    server = redis.Redis.from_url(settings.REDIS_URL)
    events._send("workspace-background-test", {"type": "document.deleted", "document": {"id": 1}})
    before = server.info("stats")["total_connections_received"]
    for index in range(20):
        events._send("workspace-background-test", {"type": "document.deleted", "document": {"id": index}})
    # Other clients of the same Redis may connect meanwhile; twenty events must not.
    assert server.info("stats")["total_connections_received"] - before < 5
