"""Every URL pattern of the project, checked for who may use it.

`CASES` has one entry per named URL pattern; `test_it_has_a_permission_case_for_every_url`
fails when a pattern is added without one. For each case: anonymous visitors go to the login
page (the HTTP API answers 401), non-members get 404 (a workspace's existence never leaks),
members below the needed role are refused, and members with it get through. The OpenAI and
Ollama APIs take API tokens only, so their cases send the user's token.

The MCP server at /mcp is an ASGI app beside Django, not a URL pattern: the last test here checks
that it turns away requests without a valid token; tests/knowledge/test_mcp_server.py checks
that each of its tools answers an outsider as if the workspace did not exist.
"""

import json
import uuid
from dataclasses import dataclass, field

import pytest
from asgiref.sync import sync_to_async
from django.conf import settings
from django.core import signing
from django.db import connection
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from chat.models import Conversation, Message
from knowledge.models import Answer, EntitySource, EvaluationRun, EvaluationSet, Membership, Role, Source
from knowledge.services.accounts import SIGNUP_SALT
from knowledge.services.api_tokens import api_token_create
from knowledge.services.invitations import invitation_create, invitation_token
from tests.factories import make_chunk, make_document, make_entity, make_user, make_workspace

# Django's admin checks staff status itself and scopes curation querysets by membership;
# tests/knowledge/test_admin.py covers it.
EXCLUDED_NAMESPACES = {"admin"}
# The Models page is the installation's, not a workspace's: anyone logged in reads it, staff alone
# change it (tests/knowledge/web/test_model_settings.py walks each of these URLs for that).
INSTALLATION_PAGES = {
    "knowledge:models",
    "knowledge:model_endpoint_add",
    "knowledge:model_ollama_connect",
    "knowledge:model_endpoint_check",
    "knowledge:model_endpoint_key",
    "knowledge:model_endpoint_delete",
    "knowledge:model_chat_pick",
    "knowledge:model_embedding_pick",
    "knowledge:model_reembedding",
    "knowledge:model_reembedding_retry",
}


@dataclass(frozen=True)
class Case:
    args: tuple = ("slug",)
    method: str = "get"
    data: dict = field(default_factory=dict)
    content_type: str | None = None
    # Parameters whose values are ids from the `world` fixture, e.g. {"entity": "entity"}.
    data_from: dict = field(default_factory=dict)
    min_role: str | None = Role.VIEWER
    # "login": anonymous visitors are sent to the login page; "401": the API answers 401;
    # "public": anyone may use it.
    anonymous: str = "login"
    # What a member below `min_role` gets: 403 where membership is already known to them.
    below_role: int = 403
    # "session": users log in; "token": they send their API token (the OpenAI and Ollama APIs
    # take nothing else); "metrics": the scraper sends METRICS_TOKEN.
    auth: str = "session"


LOGIN_ONLY = Case(args=(), min_role=None)
TOKEN_ONLY = Case(args=(), min_role=None, anonymous="401", auth="token")
JSON = "application/json"
ASKED = [{"role": "user", "content": "Who is Ada?"}]

CASES: dict[str, list[Case]] = {
    "login": [Case(args=(), min_role=None, anonymous="public")],
    "logout": [Case(args=(), method="post", min_role=None, anonymous="public")],
    "home": [LOGIN_ONLY],
    "account": [LOGIN_ONLY, Case(args=(), method="post", min_role=None, data={"form": "name", "first_name": "Vi"})],
    # Single sign-on is off in this walk (the login page says so); tests/knowledge/web/test_sso.py has it on.
    "sso_login": [Case(args=(), min_role=None, anonymous="public")],
    "sso_callback": [Case(args=(), min_role=None, anonymous="public")],
    "signup": [Case(args=(), min_role=None, anonymous="public")],
    "signup_complete": [Case(args=("signup_token",), min_role=None, anonymous="public")],
    # Anyone holding the link may read it; accepting needs the invited address (test_people.py).
    "invitation": [Case(args=("invitation_token",), min_role=None, anonymous="public")],
    # The container healthcheck: says only "ok" (tests/test_deployment.py).
    "healthz": [Case(args=(), min_role=None, anonymous="public")],
    # For Prometheus, not people: the operators' METRICS_TOKEN, never a session or an API token.
    "metrics": [Case(args=(), min_role=None, anonymous="401", auth="metrics")],
    "knowledge:workspace_new": [LOGIN_ONLY],
    "knowledge:workspace": [Case()],
    "knowledge:documents": [Case()],
    "knowledge:upload": [Case(min_role=Role.EDITOR), Case(method="post", min_role=Role.EDITOR)],
    "knowledge:document": [Case(args=("slug", "document"))],
    "knowledge:document_retry": [Case(args=("slug", "document"), method="post", min_role=Role.EDITOR)],
    "knowledge:document_delete": [
        Case(args=("slug", "document"), min_role=Role.EDITOR),
        Case(args=("slug", "document"), method="post", min_role=Role.EDITOR),
    ],
    "knowledge:document_label": [
        Case(args=("slug", "document"), method="post", min_role=Role.EDITOR, data={"tags": "a", "enabled": "on"})
    ],
    "knowledge:document_replace": [Case(args=("slug", "document"), method="post", min_role=Role.EDITOR)],
    # Refused for the current version with a message (a redirect); an older one goes.
    "knowledge:document_version_prune": [Case(args=("slug", "document"), method="post", min_role=Role.EDITOR)],
    "knowledge:documents_delete": [
        Case(method="post", min_role=Role.EDITOR, data_from={"documents": "document"}),
    ],
    "knowledge:sources": [
        Case(),
        Case(method="post", min_role=Role.OWNER, data={"name": "Docs", "kind": "web", "location": "https://x.test/"}),
    ],
    "knowledge:source": [Case(args=("slug", "source"))],
    "knowledge:source_sync": [Case(args=("slug", "source"), method="post", min_role=Role.EDITOR)],
    "knowledge:source_delete": [Case(args=("slug", "source"), method="post", min_role=Role.OWNER)],
    "knowledge:entities": [Case()],
    "knowledge:entity": [Case(args=("slug", "entity"))],
    "knowledge:graph": [Case()],
    "knowledge:graph_json": [Case()],
    "knowledge:graph_export": [Case(args=("slug", export_format)) for export_format in ("graphml", "csv", "json")],
    "knowledge:members": [Case(min_role=Role.OWNER)],
    "knowledge:member_add": [Case(method="post", min_role=Role.OWNER, data={"identifier": "x", "role": "viewer"})],
    "knowledge:member_role": [
        Case(args=("slug", "viewer_membership"), method="post", min_role=Role.OWNER, data={"role": "editor"})
    ],
    # Anyone may leave; removing someone else needs the owner role (see the test below).
    "knowledge:member_remove": [Case(args=("slug", "viewer_membership"), method="post", min_role=Role.OWNER)],
    "knowledge:settings": [Case(min_role=Role.OWNER), Case(method="post", min_role=Role.OWNER)],
    "knowledge:workspace_delete": [
        Case(min_role=Role.OWNER),
        Case(method="post", min_role=Role.OWNER, data={"confirm_name": "wrong"}),
    ],
    "knowledge:audit": [Case(min_role=Role.OWNER)],
    "knowledge:invitation_create": [
        Case(method="post", min_role=Role.OWNER, data={"email": "new@example.org", "role": "viewer"})
    ],
    "knowledge:invitation_resend": [Case(args=("slug", "invitation"), method="post", min_role=Role.OWNER)],
    "knowledge:invitation_revoke": [Case(args=("slug", "invitation"), method="post", min_role=Role.OWNER)],
    "knowledge:analytics": [Case(min_role=Role.OWNER)],
    "knowledge:analytics_csv": [Case(min_role=Role.OWNER)],
    "knowledge:analytics_answer": [Case(args=("slug", "answer"), min_role=Role.OWNER)],
    # Feedback by the answer's id: the asker's own answers only (tests/knowledge/api/test_feedback_api.py).
    "knowledge:api_answer_feedback": [
        Case(args=("slug", "answer_uuid"), method="post", anonymous="401", content_type=JSON, data={"rating": "up"})
    ],
    "knowledge:openai_completion": [
        Case(args=("completion_id",), min_role=None, anonymous="401", auth="token"),
        Case(
            args=("completion_id",),
            method="post",
            min_role=None,
            anonymous="401",
            auth="token",
            content_type=JSON,
            data={"metadata": {"rating": "down"}},
        ),
    ],
    "knowledge:ollama_feedback": [
        Case(
            args=(),
            method="post",
            min_role=None,
            anonymous="401",
            auth="token",
            content_type=JSON,
            data={"rating": "up"},
            data_from={"id": "answer_uuid"},
        )
    ],
    # Uploads through the API: tests/knowledge/api/test_scopes_and_limits.py (multipart, scopes, limits).
    "knowledge:api_documents": [Case(anonymous="401")],
    # A viewer is told the document is not there for writing, as an outsider is.
    "knowledge:api_document": [
        Case(args=("slug", "document"), method="delete", min_role=Role.EDITOR, anonymous="401", below_role=404)
    ],
    "knowledge:api_query": [
        Case(method="post", anonymous="401", content_type="application/json", data={"question": "Who is Ada?"})
    ],
    "knowledge:openai_models": [TOKEN_ONLY],
    "knowledge:openai_chat_completions": [
        Case(
            args=(),
            method="post",
            anonymous="401",
            auth="token",
            content_type=JSON,
            data={"model": "acme", "messages": ASKED},
        )
    ],
    "knowledge:ollama_version": [TOKEN_ONLY],
    "knowledge:ollama_tags": [TOKEN_ONLY],
    "knowledge:ollama_ps": [TOKEN_ONLY],
    "knowledge:ollama_chat": [
        Case(
            args=(),
            method="post",
            anonymous="401",
            auth="token",
            content_type=JSON,
            data={"model": "acme:latest", "messages": ASKED, "stream": False},
        )
    ],
    "knowledge:ollama_generate": [
        Case(
            args=(),
            method="post",
            anonymous="401",
            auth="token",
            content_type=JSON,
            data={"model": "acme", "prompt": "Who is Ada?", "stream": False},
        )
    ],
    "knowledge:evaluation": [Case()],
    "knowledge:evaluation_run": [Case(args=("slug", "evaluation_run"))],
    "chat:new": [Case()],
    "chat:conversations": [Case()],
    "chat:conversation": [Case(args=("slug", "conversation"))],
    "chat:preferences": [Case(method="post", data={"mode": "local", "top_k": "12"})],
    "chat:rename": [Case(args=("slug", "conversation"), method="post", data={"title": "Renamed"})],
    "chat:share": [Case(args=("slug", "conversation"), method="post", data={"shared": "on"})],
    "chat:delete": [Case(args=("slug", "conversation"), method="post")],
    "chat:neighbours": [Case(data_from={"entity": "entity"})],
    "chat:sources": [Case(args=("slug", "answer_message"))],
    "chat:feedback": [
        Case(args=("slug", "answer_message")),
        Case(args=("slug", "answer_message"), method="post", data={"rating": "down", "comment": "Missed it."}),
    ],
}

ROLE_BELOW = {Role.EDITOR: Role.VIEWER, Role.OWNER: Role.EDITOR}


def _named_patterns(patterns, namespace: str | None = None):
    for pattern in patterns:
        if isinstance(pattern, URLResolver):
            inner = pattern.namespace or namespace
            if inner in EXCLUDED_NAMESPACES:
                continue
            qualified = ":".join(part for part in (namespace, pattern.namespace) if part) or None
            yield from _named_patterns(pattern.url_patterns, qualified)
        elif isinstance(pattern, URLPattern):
            if pattern.name is None:
                raise AssertionError(f"URL pattern {pattern.pattern} has no name, so it cannot have a permission case")
            yield f"{namespace}:{pattern.name}" if namespace else pattern.name


def test_it_has_a_permission_case_for_every_url():
    names = set(_named_patterns(get_resolver().url_patterns))

    assert sorted(names - set(CASES) - INSTALLATION_PAGES) == [], "add a permission case for these URL names"
    assert sorted(set(CASES) - names) == [], "these cases name URLs that no longer exist"


@pytest.fixture
def world(db, settings):
    # A hundred cases each create four users; the default hasher would spend most of the run hashing.
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.METRICS_TOKEN = "walk-metrics"  # noqa: S105 - the walk's own
    owner, editor, viewer, stranger = (make_user(name) for name in ("owner", "editor", "viewer", "stranger"))
    workspace = make_workspace(
        slug="acme", members={owner: Role.OWNER, editor: Role.EDITOR, viewer: Role.VIEWER}, name="Acme"
    )
    document = make_document(workspace, title="Report")
    chunk = make_chunk(document)
    entity = make_entity(workspace, "Ada")
    EntitySource.objects.create(entity=entity, chunk=chunk, name="Ada")
    evaluation_set = EvaluationSet.objects.create(workspace=workspace, name="Questions")
    run = EvaluationRun.objects.create(
        workspace=workspace, evaluation_set=evaluation_set, system_a="naive", system_b="mix"
    )
    # The conversation belongs to the viewer: the role that must get through is the one using it.
    conversation = Conversation.objects.create(workspace=workspace, user=viewer, title="Questions")
    message = Message.objects.create(conversation=conversation, role="assistant", content="Ada.", mode="mix")
    answer = Answer.objects.create(
        uuid=uuid.uuid4(),
        workspace=workspace,
        user=viewer,
        door="chat",
        question="Who?",
        mode="mix",
        model="extractive",
        conversation_id=conversation.pk,
        message_id=message.pk,
    )
    source = Source.objects.create(workspace=workspace, name="Site", kind="web", location="https://x.test/")
    invitation = invitation_create(
        workspace=workspace, actor=owner, email="invited@example.org", role="viewer", base_url="http://testserver/"
    )
    settings.SIGNUP_ENABLED = True
    values = {
        "answer": answer.pk,
        "answer_uuid": str(answer.uuid),
        "answer_message": message.pk,
        "completion_id": f"chatcmpl-{answer.uuid.hex}",
        "invitation": invitation.pk,
        "invitation_token": invitation_token(invitation),
        "signup_token": signing.TimestampSigner(salt=SIGNUP_SALT).sign_object({"email": "new@example.org"}),
        "conversation": conversation.pk,
        "evaluation_run": run.pk,
        "slug": workspace.slug,
        "document": document.pk,
        "source": source.pk,
        "chunk": chunk.pk,
        "entity": entity.pk,
        "viewer_membership": Membership.objects.get(user=viewer, workspace=workspace).pk,
        **{export_format: export_format for export_format in ("graphml", "csv", "json")},
    }
    users = {Role.OWNER: owner, Role.EDITOR: editor, Role.VIEWER: viewer, "stranger": stranger}
    return {"values": values, "users": users}


ALL_CASES = [(name, index, case) for name, cases in CASES.items() for index, case in enumerate(cases)]
# Only pages inside a workspace can answer 404 to outsiders, and only pages that need more
# than viewer can turn a member away; the other combinations have nothing to check.
WORKSPACE_CASES = [(name, index, case) for name, index, case in ALL_CASES if case.min_role is not None]
RANKED_CASES = [(name, index, case) for name, index, case in ALL_CASES if case.min_role in ROLE_BELOW]


def _ids(cases):
    return [f"{name}[{case.method}#{index}]" for name, index, case in cases]


def _request(client, world, name, case, user=None):
    path = reverse(name, args=[world["values"][arg] for arg in case.args])
    data = {**case.data, **{param: world["values"][key] for param, key in case.data_from.items()}}
    headers = {}
    if case.auth == "token" and user is not None:
        headers["Authorization"] = f"Bearer {api_token_create(user=user, name='walk')[1]}"
    if case.auth == "metrics" and user is not None:
        headers["Authorization"] = f"Bearer {settings.METRICS_TOKEN}"
    if case.content_type:
        return getattr(client, case.method)(path, data, content_type=case.content_type, headers=headers)
    return getattr(client, case.method)(path, data, headers=headers)


def _as(client, user):
    """The client acting as `user`: logged in; token cases add the user's token to the request."""
    client.force_login(user)
    return user


@pytest.mark.parametrize(("name", "index", "case"), ALL_CASES, ids=_ids(ALL_CASES))
def test_it_turns_away_anonymous_visitors(client, world, name, index, case):
    response = _request(client, world, name, case)

    if case.anonymous == "login":
        assert response.status_code == 302
        assert response.url.startswith(reverse("login"))
    elif case.anonymous == "401":
        assert response.status_code == 401
    else:
        assert response.status_code < 400


@pytest.mark.parametrize(("name", "index", "case"), WORKSPACE_CASES, ids=_ids(WORKSPACE_CASES))
def test_it_answers_404_to_non_members(client, world, name, index, case):
    stranger = _as(client, world["users"]["stranger"])

    assert _request(client, world, name, case, stranger).status_code == 404


@pytest.mark.parametrize(("name", "index", "case"), RANKED_CASES, ids=_ids(RANKED_CASES))
def test_it_refuses_members_below_the_needed_role(client, world, name, index, case):
    member = _as(client, world["users"][ROLE_BELOW[case.min_role]])

    assert _request(client, world, name, case, member).status_code == case.below_role


@pytest.mark.parametrize(("name", "index", "case"), ALL_CASES, ids=_ids(ALL_CASES))
def test_it_lets_members_with_the_role_through(client, world, name, index, case):
    user = _as(client, world["users"][case.min_role or Role.VIEWER])

    response = _request(client, world, name, case, user)

    assert response.status_code not in (401, 403, 404, 405)
    assert response.status_code < 500


def test_it_refuses_a_viewer_removing_someone_else_but_lets_them_leave(client, world):
    viewer, editor = world["users"][Role.VIEWER], world["users"][Role.EDITOR]
    editor_membership = Membership.objects.get(user=editor)
    client.force_login(viewer)

    removing = client.post(reverse("knowledge:member_remove", args=["acme", editor_membership.pk]))
    leaving = client.post(reverse("knowledge:member_remove", args=["acme", world["values"]["viewer_membership"]]))

    assert removing.status_code == 403
    assert leaving.status_code == 302
    assert not Membership.objects.filter(user=viewer).exists()


def test_it_does_not_reach_into_another_workspace_through_ids(client, world):
    other = make_workspace(slug="other", members={world["users"][Role.OWNER]: Role.OWNER})
    client.force_login(world["users"][Role.OWNER])
    values = world["values"]

    for name, arg in [("knowledge:document", "document"), ("knowledge:entity", "entity")]:
        assert client.get(reverse(name, args=[other.slug, values[arg]])).status_code == 404
    response = client.post(reverse("knowledge:member_role", args=[other.slug, values["viewer_membership"]]))
    assert response.status_code == 404


def test_it_keeps_a_private_conversation_from_other_members(client, world):
    client.force_login(world["users"][Role.OWNER])
    values = world["values"]

    assert client.get(reverse("chat:conversation", args=["acme", values["conversation"]])).status_code == 404
    assert client.post(reverse("chat:delete", args=["acme", values["conversation"]])).status_code == 404
    assert Conversation.objects.filter(pk=values["conversation"]).exists()


@pytest.mark.parametrize("authorization", [None, b"Bearer grt_not-a-token", b"Basic abc"])
async def test_the_mcp_endpoint_turns_away_requests_without_a_valid_token(transactional_db, authorization):
    from channels.testing import HttpCommunicator

    from config.asgi import application

    headers = [(b"host", b"localhost"), (b"content-type", b"application/json")]
    if authorization:
        headers.append((b"authorization", authorization))
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}).encode()

    response = await HttpCommunicator(application, "POST", "/mcp", body=body, headers=headers).get_response()
    # The token was looked up on asgiref's thread, whose connection would outlive the test database.
    await sync_to_async(_close_connection)()

    assert response["status"] == 401
    assert json.loads(response["body"])["error"]


def _close_connection():
    connection.close()
