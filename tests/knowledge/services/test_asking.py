import json
import threading
from io import StringIO

import pytest
from asgiref.sync import async_to_sync
from django.core.management import CommandError, call_command
from django.db import connections
from django.test import Client
from django.urls import reverse

from knowledge.models import Document
from knowledge.rag.retrieval import Budgets, Keywords
from knowledge.services import asking
from knowledge.services.api_tokens import api_token_create
from knowledge.services.asking import (
    QUESTION_MAX_CHARS,
    TOP_K_MAX,
    AskDenied,
    AskInvalid,
    AskRefused,
    DoneEvent,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    ask_request,
    ask_request_from_json,
    ask_stream,
    workspace_for_asking,
)
from tests.chat.sockets import ask, open_socket
from tests.factories import make_document, make_user
from tests.knowledge.team_graph import build_science_graph

# The ask service retrieves on pool threads with connections of their own, which see only what
# is committed.
pytestmark = pytest.mark.django_db(transaction=True)

QUESTION = "Who discovered radium?"


@pytest.fixture
def science(workspace, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    build_science_graph(workspace)
    return workspace


@pytest.fixture
def token(owner):
    _, secret = api_token_create(user=owner, name="tests")
    return secret


def _collect(workspace, request) -> list:
    async def run():
        return [event async for event in ask_stream(workspace=workspace, request=request)]

    return async_to_sync(run)()


# The request: one validation, one set of limits -----------------------------------------------


def test_it_fills_in_the_defaults_and_keeps_what_is_given():
    request = ask_request(
        question="  Who?  ",
        top_k=TOP_K_MAX,
        chunk_top_k=1,
        keywords={"high_level": ["history"], "low_level": ["Curie"]},
        history=[{"role": "user", "content": "Hi", "name": "ignored"}],
        max_total_tokens=5000,
    )

    assert request.question == "Who?"
    assert (request.mode, request.top_k, request.chunk_top_k) == ("mix", TOP_K_MAX, 1)
    assert request.keywords == Keywords(high_level=("history",), low_level=("Curie",))
    assert request.history == ({"role": "user", "content": "Hi"},)
    assert request.response_type == "Multiple Paragraphs"
    assert request.budgets == Budgets(total=5000)
    assert request.context_only is False
    assert ask_request(question="x" * QUESTION_MAX_CHARS).question == "x" * QUESTION_MAX_CHARS


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"question": None}, "'question' is required: the text to ask."),
        ({"question": "x" * (QUESTION_MAX_CHARS + 1)}, "'question' is too long (8,001 characters; at most 8,000)."),
        ({"mode": "deep"}, "Unknown mode 'deep': use one of mix, hybrid, local, global, naive, bypass."),
        ({"top_k": 0}, "'top_k' must be a whole number from 1 to 200, got 0."),
        ({"top_k": TOP_K_MAX + 1}, "'top_k' must be a whole number from 1 to 200, got 201."),
        ({"chunk_top_k": True}, "'chunk_top_k' must be a whole number from 1 to 200, got True."),
        ({"max_entity_tokens": "5"}, "'max_entity_tokens' must be a whole number from 1 to 1,000,000, got '5'."),
        ({"response_type": "x" * 101}, "'response_type' must be a short text (at most 100 characters)"),
        ({"keywords": ["a"]}, "keywords must be an object"),
        ({"history": [{"role": "system", "content": "x"}]}, "'history' must be a list"),
        ({"context_only": "yes"}, "'context_only' must be true or false, got 'yes'."),
    ],
)
def test_it_refuses_what_is_out_of_bounds_with_a_message_that_says_what_to_fix(values, message):
    with pytest.raises(AskInvalid) as refused:
        ask_request(**{"question": "Hi", **values})

    assert str(refused.value).startswith(message)


def test_it_refuses_fields_a_protocol_does_not_accept():
    with pytest.raises(AskInvalid, match="Unknown field 'topk'. Accepted fields: chunk_top_k, "):
        ask_request_from_json({"question": "Hi", "topk": 5})
    with pytest.raises(AskInvalid, match="Unknown field 'history'. Accepted fields: conversation, question, type."):
        ask_request_from_json({"question": "Hi", "history": []}, fields=["question"], also=["type", "conversation"])

    assert ask_request_from_json({"question": "Hi", "type": "ask"}, fields=["question"], also=["type"]).question == "Hi"


# The gate ----------------------------------------------------------------------------------


def test_the_gate_denies_non_members_and_refuses_what_nothing_can_answer_yet(workspace, owner):
    with pytest.raises(AskDenied, match="not a member"):
        workspace_for_asking(user=make_user("stranger"), slug="acme", mode="mix")
    with pytest.raises(AskRefused, match="no documents yet"):
        workspace_for_asking(user=owner, slug="acme", mode="mix")
    assert workspace_for_asking(user=owner, slug="acme", mode="bypass") == workspace

    pending = make_document(workspace, title="Pending")
    Document.objects.filter(pk=pending.pk).update(status=Document.Status.PROCESSING)

    with pytest.raises(AskRefused, match="still being processed"):
        workspace_for_asking(user=owner, slug="acme", mode="naive")


# The stream --------------------------------------------------------------------------------


def test_it_streams_the_retrieval_then_tokens_then_done_with_engine_and_usage(science):
    events = _collect(science, ask_request(question=QUESTION, mode="local"))

    retrieval, *tokens, done = events
    assert isinstance(retrieval, RetrievalEvent)
    assert retrieval.engine == done.engine == "extractive"
    assert retrieval.result.entities[0].name == "Marie Curie"
    assert retrieval.result.stats["timings"]["total"] > 0
    assert tokens
    assert all(isinstance(event, TokenEvent) for event in tokens)
    assert isinstance(done, DoneEvent)
    assert done.answer == "".join(event.text for event in tokens)
    assert "Marie Curie discovered radium" in done.answer
    assert done.usage.calls == 0


def test_it_ends_without_an_answer_when_only_the_context_is_asked_for(science):
    retrieval, done = _collect(science, ask_request(question=QUESTION, mode="global", context_only=True))

    assert retrieval.result.context.startswith("-----Entities-----")
    assert isinstance(done, DoneEvent)
    assert done.answer is None


def test_it_reports_a_failing_model_as_an_error_event_and_nothing_after_it(science, openai_double, settings, caplog):
    settings.LLM_MAX_RETRIES = 0
    openai_double.fail(1, status=503)

    [error] = _collect(science, ask_request(question=QUESTION, mode="local"))

    assert isinstance(error, ErrorEvent)
    assert error.reason == "model"
    # Not asked as an owner: what to do, not where the model lives; the log has the detail.
    assert "an owner should check LLM settings" in error.message
    assert "503" not in error.message
    assert "answered 503" in caplog.text


# The adapters: the same limits, and retrieval off the shared thread, in every one ------------


def _websocket(user, body: dict) -> list[dict]:
    async def talk():
        communicator = await open_socket(user)
        events = await ask(communicator, **body)
        await communicator.disconnect()
        return events

    return async_to_sync(talk)()


def _api(token, body: dict):
    return Client().post(
        reverse("knowledge:api_query", args=["acme"]),
        json.dumps(body),
        content_type="application/json",
        HTTP_AUTHORIZATION=f"Bearer {token}",
    )


def _command(body: dict) -> str:
    args = ["query", "--workspace", "acme", body["question"]]
    for name, flag in [("mode", "--mode"), ("top_k", "--top-k"), ("chunk_top_k", "--chunk-top-k")]:
        if name in body:
            args += [flag, str(body[name])]
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


@pytest.mark.parametrize(
    "body",
    [
        pytest.param({"question": "   "}, id="blank"),
        pytest.param({"question": "x" * (QUESTION_MAX_CHARS + 1)}, id="too-long"),
        pytest.param({"question": "Hi", "mode": "psychic"}, id="unknown-mode"),
        pytest.param({"question": "Hi", "top_k": 0}, id="top_k-0"),
        pytest.param({"question": "Hi", "top_k": TOP_K_MAX + 1}, id="top_k-above"),
        pytest.param({"question": "Hi", "chunk_top_k": TOP_K_MAX + 1}, id="chunk_top_k-above"),
    ],
)
def test_the_same_invalid_question_gets_the_same_message_from_websocket_api_and_command(workspace, owner, token, body):
    with pytest.raises(AskInvalid) as invalid:
        ask_request(**body)
    message = str(invalid.value)

    [from_socket] = _websocket(owner, body)
    from_api = _api(token, body)
    with pytest.raises(CommandError) as from_command:
        _command(body)

    assert from_socket == {"type": "error", "message": message}
    assert (from_api.status_code, from_api.json()) == (400, {"error": message})
    assert str(from_command.value) == message


@pytest.mark.parametrize("adapter", ["websocket", "api", "command"])
def test_retrieval_runs_on_a_pool_thread_that_closes_its_connection_in_every_adapter(
    science, owner, token, monkeypatch, adapter
):
    seen = []
    retrieve = asking.retrieve

    def spy(**arguments):
        seen.append((threading.current_thread(), connections["default"]))
        return retrieve(**arguments)

    monkeypatch.setattr(asking, "retrieve", spy)
    body = {"question": QUESTION, "mode": "local"}

    if adapter == "websocket":
        assert _websocket(owner, body)[-1]["type"] == "done"
    elif adapter == "api":
        assert _api(token, body).status_code == 200
    else:
        assert "Marie Curie" in _command(body)

    [(thread, connection)] = seen
    # Not the thread that runs thread-sensitive calls (here the main thread, to which
    # async_to_sync sends them) but one of the event loop's default executor, where
    # thread_sensitive=False sends work.
    assert thread is not threading.main_thread()
    assert thread.name.startswith("asyncio_")
    assert connection.connection is None
