"""The live document list's websocket against daphne and the real Redis, held open and idle."""

import asyncio
import time

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.test import Client

from knowledge.models import Role
from knowledge.services.events import workspace_group
from tests.factories import make_user, make_workspace
from tests.processes import daphne, process_env

pytestmark = pytest.mark.django_db(transaction=True)

IDLE_SECONDS = 35


def test_an_idle_event_socket_stays_connected_on_the_real_redis_with_nothing_logged():
    import websockets

    user = make_user("watcher")
    workspace = make_workspace(slug="live", members={user: Role.VIEWER})
    client = Client()
    client.force_login(user)
    cookie = f"sessionid={client.cookies['sessionid'].value}"

    with daphne(process_env(LOG_LEVEL="INFO")) as server:
        url = server.url.replace("http", "ws") + f"/ws/workspaces/{workspace.slug}/events/"

        async def hold_and_listen() -> str:
            headers = {"Cookie": cookie, "Origin": server.url}
            async with websockets.connect(url, additional_headers=headers) as socket:
                began = time.monotonic()
                with pytest.raises(TimeoutError):
                    # Idle: the consumer sits in channels_redis' blocking pop the whole time.
                    await asyncio.wait_for(socket.recv(), timeout=IDLE_SECONDS)
                assert time.monotonic() - began >= IDLE_SECONDS
                await asyncio.get_running_loop().run_in_executor(None, _announce_deletion, workspace.pk)
                return await asyncio.wait_for(socket.recv(), timeout=30)

        received = asyncio.run(hold_and_listen())
        log = server.log()

    assert 'id="document-999999"' in received  # still subscribed after the idle stretch
    assert "Timeout reading" not in log
    assert "Traceback" not in log
    assert " ERROR " not in log


def _announce_deletion(workspace_id: int) -> None:
    event = {"type": "document.deleted", "document": {"id": 999999}}
    async_to_sync(get_channel_layer().group_send)(workspace_group(workspace_id), event)


def test_the_layer_reads_outlast_channels_redis_blocking_pop(settings):
    from channels_redis.core import RedisChannelLayer

    (host,) = settings.CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]
    assert host["socket_timeout"] > RedisChannelLayer.brpop_timeout
