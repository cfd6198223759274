import re

import pytest
from asgiref.sync import async_to_sync, sync_to_async
from django.db import connection

from knowledge.answer import (
    EXTRACTIVE_LABEL,
    NO_CONTEXT_ANSWER,
    answer_is_extractive,
    astream_answer,
)
from knowledge.llm import LLMError, Usage
from knowledge.models import LLMCacheEntry
from knowledge.retrieval import retrieve
from tests.knowledge.team_graph import ask, build_team_graph

HISTORY = [{"role": "user" if n % 2 == 0 else "assistant", "content": f"turn {n}"} for n in range(8)]


@pytest.fixture
def graph(workspace):
    return build_team_graph(workspace)


@pytest.fixture
def no_chat_model(settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""


async def collect(stream) -> list[str]:
    return [piece async for piece in stream]


@pytest.mark.django_db(transaction=True)
async def test_it_streams_the_models_cited_answer_from_the_context(graph, workspace, openai_double):
    openai_double.reply("Bob works with Carol [R1] and pairs with Erin [S3].")
    result = await _ask(workspace, "mix")
    usage = Usage()

    pieces = await collect(
        astream_answer(
            question="Who works with whom?",
            result=result,
            history=HISTORY,
            response_type="Bullet Points",
            usage=usage,
        )
    )

    assert "".join(pieces) == "Bob works with Carol [R1] and pairs with Erin [S3]."
    assert len(pieces) > 1
    (request,) = openai_double.chat_requests()
    system, *turns, question = request.messages
    assert result.context in system["content"]
    assert "[E3]" in system["content"]
    assert "does not contain the answer" in system["content"]
    assert "Bullet Points" in system["content"]
    assert [turn["content"] for turn in turns] == [f"turn {n}" for n in range(2, 8)]
    assert question == {"role": "user", "content": "Who works with whom?"}
    assert usage.completion_tokens > 0
    assert usage.calls == 1


@pytest.mark.django_db(transaction=True)
async def test_it_raises_a_readable_error_when_the_model_fails(graph, workspace, openai_double, settings):
    settings.LLM_MAX_RETRIES = 1
    openai_double.fail(5, status=500)
    result = await _ask(workspace, "local")

    with pytest.raises(LLMError, match=r"\S"):
        await collect(astream_answer(question="Who works with whom?", result=result))


@pytest.mark.django_db(transaction=True)
async def test_it_asks_the_model_without_context_in_bypass_mode(workspace, openai_double):
    openai_double.reply("Hello.")
    result = await _ask(workspace, "bypass")

    assert "".join(await collect(astream_answer(question="Say hello", result=result))) == "Hello."
    (request,) = openai_double.chat_requests()
    assert "---Context---" not in request.messages[0]["content"]


def test_it_answers_extractively_from_the_best_supported_sentences(graph, workspace, no_chat_model):
    result = ask(workspace, "local")

    pieces = _collect_sync(astream_answer(question="Did Bob meet Carol?", result=result))
    answer = "".join(pieces)

    assert answer_is_extractive()
    assert answer.startswith(EXTRACTIVE_LABEL)
    assert len(pieces) > 3
    lines = [line for line in answer.splitlines() if line.startswith("- ")]
    assert lines[0] == "- Alice, Bob and Carol met Dave. [S1]"
    cited = set(re.findall(r"\[(S\d+)\]", answer))
    assert cited <= {row.id for row in result.chunks}
    assert {row.id: row.text for row in result.chunks}["S1"] == "Alice, Bob and Carol met Dave."


def test_it_says_so_when_nothing_was_retrieved(workspace, no_chat_model):
    result = ask(workspace, "mix")

    answer = "".join(_collect_sync(astream_answer(question="Who works with whom?", result=result)))

    assert result.context == ""
    assert answer == NO_CONTEXT_ANSWER


@pytest.mark.django_db(transaction=True)
async def test_it_does_not_call_the_model_when_nothing_was_retrieved(workspace, openai_double):
    result = await _ask(workspace, "local")

    answer = "".join(await collect(astream_answer(question="Who works with whom?", result=result)))

    assert answer == NO_CONTEXT_ANSWER
    assert openai_double.chat_requests() == []


def test_it_extracts_keywords_with_one_cached_model_call(graph, workspace, openai_double):
    openai_double.reply(
        'Here they are:\n```json\n{"high_level_keywords": ["teamwork"], "low_level_keywords": ["Bob"]}\n```'
    )
    history = [{"role": "user", "content": "Tell me about Bob."}, {"role": "assistant", "content": "Bob is here."}]

    first = retrieve(workspace=workspace, question="Who does he work with?", mode="local", history=history)
    second = retrieve(workspace=workspace, question="Who does he work with?", mode="local", history=history)

    assert first.keywords.high_level == ("teamwork",)
    assert first.keywords.low_level == ("Bob",)
    assert first.keywords.source == "llm"
    assert second.keywords == first.keywords
    (request,) = openai_double.chat_requests()
    assert "Tell me about Bob." in request.last_user_message
    assert LLMCacheEntry.objects.filter(kind="keywords").count() == 1
    assert len(openai_double.embedding_requests()) == 2


def test_it_falls_back_to_nlp_keywords_when_the_reply_has_no_json(graph, workspace, openai_double):
    openai_double.reply("I am not sure what you mean.")

    result = retrieve(workspace=workspace, question="What does Alice Smith do?", mode="local")

    assert result.keywords.source == "nlp"
    assert result.keywords.low_level == ("Alice Smith",)


def test_it_skips_the_keyword_call_when_keywords_are_given(graph, workspace, openai_double):
    result = retrieve(
        workspace=workspace,
        question="Who works with whom?",
        mode="hybrid",
        keywords={"high_level": ["teamwork"], "low_level": ["Bob"]},
    )

    assert result.keywords.source == "given"
    assert openai_double.chat_requests() == []
    (request,) = openai_double.embedding_requests()
    assert request.body["input"] == ["Bob", "teamwork"]


async def _ask(workspace, mode):
    def ask_and_disconnect():
        # The executor thread's connection would otherwise outlive the test database.
        try:
            return ask(workspace, mode)
        finally:
            connection.close()

    return await sync_to_async(ask_and_disconnect)()


def _collect_sync(stream) -> list[str]:
    return async_to_sync(collect)(stream)
