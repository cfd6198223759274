"""Token scopes on every door, the HTTP API's document endpoints, and one question limit per user
across every door (issue 29). The MCP server's share is in test_mcp_server.py."""

import json
from datetime import timedelta

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from knowledge.models import ApiToken, AuditEvent, Document, Role
from knowledge.services.api_tokens import SCOPE_ASK, SCOPE_READ, SCOPE_WRITE, api_token_create, api_token_revoke
from tests.chat.sockets import ask as ask_on_socket
from tests.chat.sockets import open_socket
from tests.factories import make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


# The workspace has no documents: a question let through the gate gets 409 ("nothing to ask
# about yet"), so 409 means authenticated and in scope; 401, 403, 404 and 429 mean refused first.
LET_IN = 409


def _bearer(secret):
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def _json(client, method, url, body, **headers):
    return getattr(client, method)(url, json.dumps(body), content_type="application/json", **headers)


# Each door, with what it does: (name, scope it needs, request(client, headers) -> response).
def _query(client, **headers):
    return _json(client, "post", reverse("knowledge:api_query", args=["acme"]), {"question": "Anything?"}, **headers)


def _openai(client, **headers):
    body = {"model": "acme", "messages": [{"role": "user", "content": "Anything?"}]}
    return _json(client, "post", reverse("knowledge:openai_chat_completions"), body, **headers)


def _ollama_chat(client, **headers):
    body = {"model": "acme:latest", "messages": [{"role": "user", "content": "Anything?"}], "stream": False}
    return _json(client, "post", reverse("knowledge:ollama_chat"), body, **headers)


def _ollama_generate(client, **headers):
    body = {"model": "acme:latest", "prompt": "Anything?", "stream": False}
    return _json(client, "post", reverse("knowledge:ollama_generate"), body, **headers)


def _models(client, **headers):
    return client.get(reverse("knowledge:openai_models"), **headers)


def _tags(client, **headers):
    return client.get(reverse("knowledge:ollama_tags"), **headers)


def _list_documents(client, **headers):
    return client.get(reverse("knowledge:api_documents", args=["acme"]), **headers)


def _upload(client, name="notes.txt", data=b"Ada Lovelace wrote the first program.", **headers):
    upload = SimpleUploadedFile(name, data)
    return client.post(reverse("knowledge:api_documents", args=["acme"]), {"file": [upload]}, **headers)


ASKING_DOORS = {"http": _query, "openai": _openai, "ollama_chat": _ollama_chat, "ollama_generate": _ollama_generate}
READING_DOORS = {"openai_models": _models, "ollama_tags": _tags, "documents": _list_documents}


@pytest.mark.parametrize("door", sorted(READING_DOORS))
def test_a_read_token_reads_on_every_door(workspace, owner, door):
    _, secret = api_token_create(user=owner, name="reader", scope=SCOPE_READ)

    assert READING_DOORS[door](Client(), **_bearer(secret)).status_code == 200


@pytest.mark.parametrize("door", sorted(ASKING_DOORS))
def test_a_read_token_cannot_ask_on_any_door_and_an_ask_token_can(workspace, owner, door):
    _, reader = api_token_create(user=owner, name="reader", scope=SCOPE_READ)
    _, asker = api_token_create(user=owner, name="asker", scope=SCOPE_ASK)

    refused = ASKING_DOORS[door](Client(), **_bearer(reader))

    assert refused.status_code == 403
    assert "does not allow asking questions" in refused.content.decode()
    assert ASKING_DOORS[door](Client(), **_bearer(asker)).status_code == LET_IN


def test_only_a_write_token_uploads_and_deletes(workspace, owner, media):
    _, asker = api_token_create(user=owner, name="asker", scope=SCOPE_ASK)
    _, writer = api_token_create(user=owner, name="writer", scope=SCOPE_WRITE)

    refused = _upload(Client(), **_bearer(asker))
    created = _upload(Client(), **_bearer(writer))

    assert refused.status_code == 403
    assert "does not allow uploading or deleting documents" in refused.json()["error"]
    assert created.status_code == 201
    [result] = created.json()["results"]
    document = Document.objects.get(pk=result["document"]["id"])
    assert (document.workspace, document.created_by, document.status) == (workspace, owner, "pending")
    listed = _list_documents(Client(), **_bearer(asker)).json()["documents"]
    assert [row["title"] for row in listed] == ["notes.txt"]
    url = reverse("knowledge:api_document", args=["acme", document.pk])
    assert Client().delete(url, **_bearer(asker)).status_code == 403
    deleted = Client().delete(url, **_bearer(writer))
    assert deleted.status_code == 200
    assert not Document.objects.filter(pk=document.pk).exists()
    assert AuditEvent.objects.filter(workspace=workspace, action="document.delete", actor=owner).count() == 1


def test_uploads_through_the_api_meet_the_browsers_limits_and_refusals(workspace, owner, media, settings):
    settings.UPLOAD_MAX_MB = 1
    settings.RATE_LIMIT_UPLOAD = (2, 3600)
    _, writer = api_token_create(user=owner, name="writer", scope=SCOPE_WRITE)

    too_big = _upload(Client(), name="big.txt", data=b"a" * (2**20 + 1), **_bearer(writer))
    binary = _upload(Client(), name="fake.txt", data=b"\x00\x01\x02" * 100, **_bearer(writer))
    limited = _upload(Client(), **_bearer(writer))

    assert too_big.status_code == 400
    assert "larger than the 1 MB upload limit" in too_big.json()["results"][0]["error"]
    assert binary.status_code == 400
    assert limited.status_code == 429
    assert "Too many uploads" in limited.json()["error"]
    assert not Document.objects.exists()


def test_writing_needs_the_editor_role_whatever_the_token(workspace, media):
    viewer = make_user("viewer")
    workspace.memberships.create(user=viewer, role=Role.VIEWER)
    _, writer = api_token_create(user=viewer, name="writer", scope=SCOPE_WRITE)

    refused = _upload(Client(), **_bearer(writer))

    assert refused.status_code == 404
    assert "needs the editor role" in refused.json()["error"]
    assert _list_documents(Client(), **_bearer(writer)).status_code == 200


def test_a_session_uploads_with_its_csrf_token_as_the_browser_does(workspace, owner, media):
    client = Client(enforce_csrf_checks=True)
    client.force_login(owner)

    refused = _upload(client)
    client.get(reverse("knowledge:upload", args=["acme"]))
    created = _upload(client, HTTP_X_CSRFTOKEN=client.cookies["csrftoken"].value)

    assert refused.status_code == 403
    assert created.status_code == 201


@pytest.mark.parametrize("door", sorted({**ASKING_DOORS, **READING_DOORS}))
def test_every_token_door_refuses_a_revoked_or_expired_token(workspace, owner, door):
    request = {**ASKING_DOORS, **READING_DOORS}[door]
    revoked, revoked_secret = api_token_create(user=owner, name="revoked", scope=SCOPE_WRITE)
    expired, expired_secret = api_token_create(user=owner, name="expired", scope=SCOPE_WRITE)
    assert request(Client(), **_bearer(revoked_secret)).status_code in (200, LET_IN)

    api_token_revoke(token=revoked)
    ApiToken.objects.filter(pk=expired.pk).update(expires_at=timezone.now() - timedelta(seconds=1))

    for secret in (revoked_secret, expired_secret):
        response = request(Client(), **_bearer(secret))
        assert response.status_code == 401
        assert response["WWW-Authenticate"].startswith("Bearer")


# --- One question limit per user, whichever door the questions come through ----------------


def _session_query(owner):
    client = Client()
    client.force_login(owner)
    return _query(client)


@pytest.mark.parametrize("door", [*sorted(ASKING_DOORS), "session"])
def test_the_question_limit_spent_on_other_doors_refuses_each_door_with_429(
    workspace, owner, settings, ten_seconds_into_an_hour, door
):
    settings.RATE_LIMIT_ASK = (len(ASKING_DOORS) + 1, 3600)
    settings.RATE_LIMIT_API = (100, 3600)
    _, secret = api_token_create(user=owner, name="bot")
    # One question through each door, the one under test last: the budget is shared.
    others = [name for name in ASKING_DOORS if name != door]
    for name in others:
        assert ASKING_DOORS[name](Client(), **_bearer(secret)).status_code == LET_IN
    assert _session_query(owner).status_code == LET_IN
    if door != "session":
        assert ASKING_DOORS[door](Client(), **_bearer(secret)).status_code == LET_IN

    refused = _session_query(owner) if door == "session" else ASKING_DOORS[door](Client(), **_bearer(secret))

    assert refused.status_code == 429
    assert int(refused["Retry-After"]) == 3590
    assert "Too many questions" in refused.content.decode()


@pytest.mark.django_db(transaction=True)
async def test_the_chat_socket_shares_the_question_limit_of_the_api(
    workspace, owner, settings, ten_seconds_into_an_hour
):
    from asgiref.sync import sync_to_async

    settings.RATE_LIMIT_ASK = (1, 3600)
    _, secret = await sync_to_async(api_token_create)(user=owner, name="bot")
    assert (await sync_to_async(_query)(Client(), **_bearer(secret))).status_code == LET_IN
    communicator = await open_socket(owner)

    [error] = await ask_on_socket(communicator)

    assert error["type"] == "error"
    assert error["message"].startswith("Too many questions for now")
    assert error["retry_after"] == 3590
    await communicator.disconnect()
