import json

import pytest
from asgiref.sync import sync_to_async
from django.db import connection
from django.test import AsyncClient, Client
from django.urls import reverse

from knowledge.models import ApiToken, Document, Role
from knowledge.services.api_tokens import api_token_create
from tests.factories import make_chunk, make_document, make_user
from tests.knowledge.team_graph import HIGH, LOW, QUESTION, axis, build_science_graph, build_team_graph

# The ask service retrieves on pool threads with connections of their own, which see only what
# is committed.
pytestmark = pytest.mark.django_db(transaction=True)

QUESTION_TEXT = "Who works with whom?"
GIVEN_KEYWORDS = {"high_level": ["collaboration"], "low_level": ["Alice", "Bob"]}


def url(slug="acme"):
    return reverse("knowledge:api_query", args=[slug])


@pytest.fixture
def graph(workspace):
    return build_team_graph(workspace)


@pytest.fixture
def token(owner):
    _, secret = api_token_create(user=owner, name="tests")
    return secret


@pytest.fixture
def model(openai_double):
    """The double embeds the test graph's query texts onto the axes its vectors lean towards."""
    axes = {"Alice, Bob": axis(LOW), "collaboration": axis(HIGH), QUESTION_TEXT: axis(QUESTION)}
    default = openai_double.embedding_handler
    openai_double.embedding_handler = lambda text: axes.get(text) or default(text)
    openai_double.reply("Bob works with Carol [R1]; they met Alice [S2].")
    return openai_double


def post(client, body, *, token=None, **extra):
    if token:
        extra["HTTP_AUTHORIZATION"] = f"Bearer {token}"
    data = body if isinstance(body, str | bytes) else json.dumps(body)
    return client.post(url(), data, content_type="application/json", **extra)


def test_it_answers_a_token_holder_with_the_context_and_its_citations(graph, token, model):
    response = post(Client(), {"question": QUESTION_TEXT, "mode": "hybrid", "keywords": GIVEN_KEYWORDS}, token=token)

    assert response.status_code == 200
    data = response.json()
    assert data["answer"] == "Bob works with Carol [R1]; they met Alice [S2]."
    assert data["answer_engine"] == "llm"
    assert data["mode"] == "hybrid"
    assert data["keywords"]["low_level"] == ["Alice", "Bob"]
    assert [row["name"] for row in data["entities"]][:2] == ["Bob", "Carol"]
    assert data["relations"][0]["id"] == "R1"
    assert {citation["id"] for citation in data["citations"]} >= {"E1", "R1", "S1"}
    assert data["subgraph"]["nodes"]
    assert data["stats"]["sql_queries"] > 0
    assert "context" not in data
    assert data["usage"]["completion_tokens"] > 0
    assert ApiToken.objects.get().last_used_at is not None


def test_filters_scope_the_question_to_tagged_documents(graph, token, model, workspace):
    _, _, chunks = graph
    elsewhere = make_document(workspace, title="Elsewhere")
    make_chunk(elsewhere, text="The office is in Paris.", embedding=axis(QUESTION))
    Document.objects.filter(pk=chunks["shared"].document_id).update(tags=["team"])
    body = {"question": QUESTION_TEXT, "mode": "mix", "keywords": GIVEN_KEYWORDS}

    everything = post(Client(), body, token=token).json()
    scoped = post(Client(), {**body, "filters": {"tags": ["Team"]}}, token=token).json()

    assert {citation["document_title"] for citation in everything["citations"]} >= {"Team notes", "Elsewhere"}
    assert {citation["document_title"] for citation in scoped["citations"]} == {"Team notes"}


def test_it_extracts_keywords_with_the_model_when_none_are_given(graph, token, model):
    model.reply(lambda body: '{"high_level_keywords": ["collaboration"], "low_level_keywords": ["Alice", "Bob"]}')

    response = post(Client(), {"question": QUESTION_TEXT, "mode": "local", "context_only": True}, token=token)

    assert response.status_code == 200
    assert response.json()["keywords"]["source"] == "llm"
    assert [row["name"] for row in response.json()["entities"]] == ["Bob", "Carol", "Alice"]


def test_it_returns_only_the_context_when_asked(graph, token, model):
    response = post(
        Client(), {"question": QUESTION_TEXT, "keywords": GIVEN_KEYWORDS, "context_only": True}, token=token
    )

    data = response.json()
    assert data["answer"] is None
    assert data["context"].startswith("-----Entities-----")
    assert model.chat_requests() == []


async def test_it_streams_ndjson_events(graph, token, model):
    body = {"question": QUESTION_TEXT, "mode": "mix", "keywords": GIVEN_KEYWORDS, "stream": True}
    response = await AsyncClient().post(
        url(), json.dumps(body), content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )

    assert response.status_code == 200
    assert response["Content-Type"] == "application/x-ndjson"
    lines = b"".join([part async for part in response.streaming_content]).decode().splitlines()
    events = [json.loads(line) for line in lines]
    assert events[0]["type"] == "retrieval"
    assert events[0]["citations"]
    tokens = [event["text"] for event in events[1:-1]]
    assert {event["type"] for event in events[1:-1]} == {"token"}
    assert len(tokens) > 1
    done = events[-1]
    assert done == {
        "type": "done",
        "answer_id": events[0]["answer_id"],
        "answer": "Bob works with Carol [R1]; they met Alice [S2].",
        "citations": done["citations"],
        "usage": done["usage"],
    }
    cited = {citation["id"]: citation for citation in done["citations"]}
    # R1 has no source chunk; S2 is cited for "they met Alice"; S1 is not cited.
    assert [cited[row_id]["sentence"] for row_id in ("R1", "S2", "S1")] == [
        None,
        "Alice, Bob and Carol met Dave.",
        None,
    ]
    assert "".join(tokens) == events[-1]["answer"]
    await _disconnect()


async def test_it_streams_an_error_event_when_the_model_fails_midway(graph, token, model, settings):
    settings.LLM_MAX_RETRIES = 0
    model.fail(1, status=500)
    body = {"question": QUESTION_TEXT, "keywords": GIVEN_KEYWORDS, "stream": True}
    response = await AsyncClient().post(
        url(), json.dumps(body), content_type="application/json", headers={"Authorization": f"Bearer {token}"}
    )

    lines = b"".join([part async for part in response.streaming_content]).decode().splitlines()
    events = [json.loads(line) for line in lines]
    assert [event["type"] for event in events] == ["retrieval", "error"]
    assert events[-1]["message"]
    await _disconnect()


def test_it_asks_for_credentials_with_a_json_401(workspace):
    for extra in [{}, {"HTTP_AUTHORIZATION": "Bearer not-a-token"}, {"HTTP_AUTHORIZATION": "Basic abc"}]:
        response = Client().post(url(), json.dumps({"question": "Hi"}), content_type="application/json", **extra)

        assert response.status_code == 401
        assert response.json()["error"]
        assert response["WWW-Authenticate"].startswith("Bearer")


def test_it_hides_workspaces_from_non_members(workspace):
    _, stranger_token = api_token_create(user=make_user("stranger"), name="x")

    response = post(Client(), {"question": "Hi"}, token=stranger_token)

    assert response.status_code == 404
    assert response.json() == {"error": "No such workspace, or you are not a member of it."}


def test_it_keeps_the_csrf_check_for_session_users_only(graph, workspace, owner, token, model):
    viewer = make_user("viewer")
    workspace.memberships.create(user=viewer, role=Role.VIEWER)
    browser = Client(enforce_csrf_checks=True)
    browser.force_login(viewer)
    body = {"question": QUESTION_TEXT, "context_only": True}

    refused = post(browser, body)
    browser.cookies["csrftoken"] = csrf_secret = "a" * 32
    accepted = post(browser, body, HTTP_X_CSRFTOKEN=csrf_secret)
    by_token = post(Client(enforce_csrf_checks=True), body, token=token)

    assert refused.status_code == 403
    assert "CSRF" in refused.json()["error"]
    assert accepted.status_code == 200
    assert by_token.status_code == 200


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "must be a JSON object"),
        ([1, 2], "must be a JSON object"),
        ({}, "'question' is required"),
        ({"question": "   "}, "'question' is required"),
        ({"question": "Hi", "mode": "deep"}, "Unknown mode 'deep'"),
        ({"question": "Hi", "top_k": 0}, "'top_k' must be a whole number from 1 to 200"),
        ({"question": "Hi", "top_k": "5"}, "'top_k' must be a whole number"),
        ({"question": "Hi", "stream": "yes"}, "'stream' must be true or false"),
        ({"question": "Hi", "keywords": ["a"]}, "keywords must be an object"),
        ({"question": "Hi", "history": [{"role": "system", "content": "x"}]}, "'history' must be a list"),
        ({"question": "Hi", "max_total_tokens": -1}, "'max_total_tokens' must be a whole number"),
        ({"question": "Hi", "topk": 5}, "Unknown field 'topk'"),
        ({"question": "Hi", "filters": ["handbook"]}, "'filters' must be an object"),
        ({"question": "Hi", "filters": {"documents": ["7"]}}, "'filters.documents' must be a list of document ids"),
    ],
)
def test_it_rejects_bad_input_with_a_clear_message(workspace, token, body, message):
    response = post(Client(), body, token=token)

    assert response.status_code == 400
    assert message in response.json()["error"]


def test_it_refuses_a_workspace_without_documents_with_409(workspace, token):
    response = post(Client(), {"question": "Hi"}, token=token)

    assert response.status_code == 409
    assert response.json() == {
        "error": "This workspace has no documents yet. Upload one on the workspace page, then ask again."
    }


def test_it_reports_a_failing_keyword_model_as_502(graph, token, model, settings):
    settings.LLM_MAX_RETRIES = 0
    model.fail(1, status=503)

    response = post(Client(), {"question": QUESTION_TEXT, "mode": "local"}, token=token)

    assert response.status_code == 502
    assert response.json()["error"]


def test_it_answers_extractively_without_a_model(workspace, token, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    build_science_graph(workspace)

    response = post(Client(), {"question": "Who discovered radium?", "mode": "mix"}, token=token)

    data = response.json()
    assert data["answer_engine"] == "extractive"
    assert data["answer"].startswith("- ")
    assert "Marie Curie discovered radium in 1898 together with Pierre Curie. [S1]" in data["answer"]
    assert data["keywords"]["source"] == "nlp"
    assert data["chunks"][0]["document_title"] == "History of radium"


async def _disconnect():
    # The view's worker thread keeps a connection that would outlive the test database.
    def close():
        connection.close()

    await sync_to_async(close)()
