import pytest
from asgiref.sync import async_to_sync

from knowledge.asking import (
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
from knowledge.models import Document
from knowledge.retrieval import Budgets, Keywords
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


def test_it_reports_a_failing_model_as_an_error_event_and_nothing_after_it(science, openai_double, settings):
    settings.LLM_MAX_RETRIES = 0
    openai_double.fail(1, status=503)

    [error] = _collect(science, ask_request(question=QUESTION, mode="local"))

    assert isinstance(error, ErrorEvent)
    assert error.reason == "model"
    assert "answered 503" in error.message
