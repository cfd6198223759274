import pytest
from asgiref.sync import sync_to_async
from channels.auth import AuthMiddlewareStack
from channels.layers import get_channel_layer
from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from django.db import connections
from django.test import Client

from config.routing import websocket_urlpatterns
from knowledge.models import Role
from tests.factories import make_document, make_user, make_workspace

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def private_channel_layer(settings):
    # Other test runs share this Redis; a prefix keeps their events out of these sockets.
    settings.CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [settings.REDIS_URL], "prefix": "test-teams-consumers"},
        }
    }


@pytest.fixture(autouse=True)
async def close_worker_connections():
    """ORM calls made through sync_to_async run on asgiref's worker thread; its connection must
    close before the test database can be flushed and dropped."""
    yield
    await sync_to_async(connections.close_all)()


@pytest.fixture
def team(transactional_db):
    owner, viewer, stranger = make_user("owner"), make_user("viewer"), make_user("stranger")
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER, viewer: Role.VIEWER})
    return {"owner": owner, "viewer": viewer, "stranger": stranger, "workspace": workspace}


def _cookie(user) -> list[tuple[bytes, bytes]]:
    if user is None:
        return []
    client = Client()
    client.force_login(user)
    return [(b"cookie", f"sessionid={client.cookies['sessionid'].value}".encode())]


async def _socket(user, slug="acme") -> WebsocketCommunicator:
    app = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
    headers = await sync_to_async(_cookie)(user)
    return WebsocketCommunicator(app, f"/ws/workspaces/{slug}/events/", headers=headers)


def _progress(document, **changes) -> dict:
    row = {
        "id": document.pk,
        "title": document.title,
        "status": "processing",
        "chunks_done": 3,
        "chunk_count": 8,
        "entity_count": 12,
        "relation_count": 9,
        "prompt_tokens": 1000,
        "completion_tokens": 234,
        "error": "",
    }
    return {"type": "document.progress", "document": {**row, **changes}}


async def test_it_closes_an_anonymous_socket_with_4401(team):
    socket = await _socket(None)
    connected, _ = await socket.connect()

    assert connected
    assert await socket.receive_output() == {"type": "websocket.close", "code": 4401}


async def test_it_closes_a_non_members_socket_with_4403(team):
    socket = await _socket(team["stranger"])
    await socket.connect()

    assert await socket.receive_output() == {"type": "websocket.close", "code": 4403}


async def test_it_closes_a_socket_to_a_missing_workspace_with_4403(team):
    socket = await _socket(team["owner"], slug="nope")
    await socket.connect()

    assert await socket.receive_output() == {"type": "websocket.close", "code": 4403}


async def test_it_pushes_the_documents_row_as_an_out_of_band_swap(team):
    document = await _make_document(team["workspace"])
    socket = await _socket(team["owner"])
    assert (await socket.connect())[0]

    await get_channel_layer().group_send(f"workspace-{team['workspace'].pk}", _progress(document))
    html = await socket.receive_from(timeout=5)

    assert html.startswith(f'<tr id="document-{document.pk}" hx-swap-oob="true"')
    assert "3/8" in html
    assert ">1234<" in html
    assert "Delete" in html
    await socket.disconnect()


async def test_it_shows_viewers_the_row_without_actions_and_escapes_the_title(team):
    document = await _make_document(team["workspace"])
    socket = await _socket(team["viewer"])
    assert (await socket.connect())[0]

    event = _progress(document, title="<img src=x onerror=alert(1)>", status="failed", error="No text found.")
    await get_channel_layer().group_send(f"workspace-{team['workspace'].pk}", event)
    html = await socket.receive_from(timeout=5)

    assert "&lt;img src=x onerror=alert(1)&gt;" in html
    assert "No text found." in html
    assert "Delete" not in html
    assert "Retry" not in html
    await socket.disconnect()


async def test_it_sends_nothing_from_another_workspace(team):
    other = await _make_workspace("other")
    document = await _make_document(other)
    socket = await _socket(team["owner"])
    assert (await socket.connect())[0]

    await get_channel_layer().group_send(f"workspace-{other.pk}", _progress(document))

    assert await socket.receive_nothing(timeout=0.5)
    await socket.disconnect()


async def test_it_removes_a_deleted_documents_row(team):
    socket = await _socket(team["owner"])
    assert (await socket.connect())[0]

    await get_channel_layer().group_send(
        f"workspace-{team['workspace'].pk}", {"type": "document.deleted", "document": {"id": 41}}
    )

    assert await socket.receive_from(timeout=5) == '<tr id="document-41" hx-swap-oob="delete"></tr>'
    await socket.disconnect()


async def _make_document(workspace):
    return await sync_to_async(make_document)(workspace, title="Report")


async def _make_workspace(slug):
    return await sync_to_async(make_workspace)(slug=slug)


def _websocket_paths() -> list[str]:
    """Every websocket route of the project, filled in for the `acme` workspace."""
    paths = []
    for pattern in websocket_urlpatterns:
        route = str(pattern.pattern)
        assert "<slug:slug>" in route, f"{route}: every socket belongs to a workspace; add its permission test"
        paths.append("/" + route.replace("<slug:slug>", "acme"))
    return paths


@pytest.mark.parametrize("path", _websocket_paths())
async def test_every_socket_turns_away_anonymous_visitors_and_non_members(team, path):
    app = AuthMiddlewareStack(URLRouter(websocket_urlpatterns))
    for user, code in [(None, 4401), (team["stranger"], 4403)]:
        socket = WebsocketCommunicator(app, path, headers=await sync_to_async(_cookie)(user))
        await socket.connect()
        assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": code}


def _membership(workspace, user):
    from knowledge.models import Membership

    return Membership.objects.get(workspace=workspace, user=user)


async def test_it_closes_a_removed_members_socket_with_4403_before_the_next_event(team):
    from knowledge.services.workspaces import membership_remove

    document = await _make_document(team["workspace"])
    socket = await _socket(team["viewer"])
    assert (await socket.connect())[0]
    group = f"workspace-{team['workspace'].pk}"
    await get_channel_layer().group_send(group, _progress(document))
    assert (await socket.receive_from(timeout=5)).startswith("<tr")

    membership = await sync_to_async(_membership)(team["workspace"], team["viewer"])
    await sync_to_async(membership_remove)(membership=membership, actor=team["owner"])
    await get_channel_layer().group_send(group, _progress(document, title="After the removal"))

    assert await socket.receive_output(timeout=5) == {"type": "websocket.close", "code": 4403}
    assert await socket.receive_nothing(timeout=0.5)


async def test_it_keeps_the_socket_of_members_whose_membership_did_not_change(team):
    from knowledge.services.workspaces import membership_remove

    document = await _make_document(team["workspace"])
    socket = await _socket(team["owner"])
    assert (await socket.connect())[0]

    membership = await sync_to_async(_membership)(team["workspace"], team["viewer"])
    await sync_to_async(membership_remove)(membership=membership, actor=team["owner"])
    await get_channel_layer().group_send(f"workspace-{team['workspace'].pk}", _progress(document))

    assert "Delete" in await socket.receive_from(timeout=5)
    await socket.disconnect()


async def test_it_drops_the_write_actions_of_a_demoted_editor_at_once(team):
    from knowledge.models import Membership
    from knowledge.services.workspaces import membership_set_role

    editor = await sync_to_async(make_user)("editor")
    membership = await sync_to_async(Membership.objects.create)(
        workspace=team["workspace"], user=editor, role=Role.EDITOR
    )
    document = await _make_document(team["workspace"])
    socket = await _socket(editor)
    assert (await socket.connect())[0]
    group = f"workspace-{team['workspace'].pk}"
    await get_channel_layer().group_send(group, _progress(document))
    assert "Delete" in await socket.receive_from(timeout=5)

    await sync_to_async(membership_set_role)(membership=membership, actor=team["owner"], role=Role.VIEWER)
    await get_channel_layer().group_send(group, _progress(document))

    html = await socket.receive_from(timeout=5)
    assert html.startswith("<tr")
    assert "Delete" not in html
    await socket.disconnect()


async def test_it_shows_the_error_detail_to_owners_only(team):
    document = await _make_document(team["workspace"])
    event = _progress(
        document,
        status="failed",
        error="The chat model refused the request; an owner should check LLM settings.",
        error_detail="The chat model at http://llm.internal:8080/v1 refused the API key (401).",
    )
    owner, viewer = await _socket(team["owner"]), await _socket(team["viewer"])
    assert (await owner.connect())[0]
    assert (await viewer.connect())[0]

    await get_channel_layer().group_send(f"workspace-{team['workspace'].pk}", event)
    seen_by_owner, seen_by_viewer = await owner.receive_from(timeout=5), await viewer.receive_from(timeout=5)

    assert "an owner should check LLM settings" in seen_by_viewer
    assert "llm.internal" not in seen_by_viewer
    assert "http://llm.internal:8080/v1 refused the API key" in seen_by_owner
    await owner.disconnect()
    await viewer.disconnect()
