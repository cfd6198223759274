"""The ask service: a question validated once, answered as one stream of typed events.

Every way of asking is a thin adapter over this module: the chat websocket (chat/consumers.py,
which also keeps the conversation), the HTTP API (knowledge/api/http.py), the `query` command and
the evaluation runner. Each of them

1. builds an AskRequest with `ask_request` (or `ask_request_from_json`), the only place a
   question is validated, against the one set of limits below;
2. passes the gate for every question: `workspace_for_asking` (may this user still ask in this
   workspace, and is there anything to ask about?), or, for an operator at the command line,
   `check_workspace_ready`;
3. turns the events of `ask_stream` (a RetrievalEvent, TokenEvents, then a DoneEvent; or an
   ErrorEvent where it failed) into its own protocol.

Retrieval blocks (SQL, embeddings, the keyword call), so it runs on a thread of the event loop's
default executor, never on asgiref's one shared thread, where one slow question would hold up
every other socket and request of the process.
"""

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import ClassVar

from channels.db import database_sync_to_async
from django.db import connection
from django.http import Http404

from knowledge.models import Answer, Chunk, Document, Role, Workspace
from knowledge.rag import llm
from knowledge.rag.answer import DEFAULT_RESPONSE_TYPE, answer_is_extractive, astream_answer
from knowledge.rag.answer.citations import answer_citations
from knowledge.rag.retrieval import (
    DEFAULT_CHUNK_TOP_K,
    DEFAULT_MODE,
    DEFAULT_TOP_K,
    MODES,
    Budgets,
    Keywords,
    RetrievalResult,
    Scope,
    retrieve,
)
from knowledge.selectors import workspace_for_user
from knowledge.services import answers
from knowledge.services.answers import Asker
from knowledge.services.ratelimits import RateLimited, rate_limit_check

logger = logging.getLogger(__name__)

# The one set of limits, whoever asks (docs/asking.md). 8,000 characters hold a
# pasted paragraph and its question and leave most of the 30,000-token budget to the context.
# The entity and relation budgets (6,000 and 8,000 tokens) hold about 200 short rows, so a
# larger top_k only makes the searches slower; chunk_top_k shares the bound.
QUESTION_MAX_CHARS = 8000
TOP_K_MAX = 200
RESPONSE_TYPE_MAX_CHARS = 100
BUDGET_MAX_TOKENS = 1_000_000

# The fields of a request as protocols spell them (LightRAG's names).
ASK_FIELDS = (
    "question",
    "mode",
    "top_k",
    "chunk_top_k",
    "keywords",
    "history",
    "response_type",
    "max_entity_tokens",
    "max_relation_tokens",
    "max_total_tokens",
    "context_only",
    "filters",
)

ENGINE_LLM = "llm"
ENGINE_EXTRACTIVE = "extractive"
INTERNAL_ERROR_MESSAGE = "Something went wrong while answering; the error was logged. Try again, or try another mode."


class AskError(Exception):
    """A question that will not be answered; the message tells the asker what to do instead."""


class AskInvalid(AskError):
    """The request itself is wrong (HTTP 400)."""


class AskDenied(AskError):
    """The asker may not ask in this workspace: not, or no longer, a member (HTTP 404, websocket 4403)."""


class AskRefused(AskError):
    """The asker may ask, but not now: nothing in the workspace can answer yet (HTTP 409)."""


class AskLimited(AskError):
    """The asker's question limit (RATE_LIMIT_ASK) is spent for now (HTTP 429, with Retry-After)."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True)
class AskRequest:
    """One question and how to answer it. Build it with `ask_request`, which validates it."""

    question: str
    mode: str = DEFAULT_MODE
    top_k: int = DEFAULT_TOP_K
    chunk_top_k: int = DEFAULT_CHUNK_TOP_K
    # Given keywords skip the keyword call.
    keywords: Keywords | None = None
    # Earlier turns, oldest first, as {"role", "content"}; retrieval and the answer use the last few.
    history: tuple[dict, ...] = ()
    response_type: str = DEFAULT_RESPONSE_TYPE
    budgets: Budgets = Budgets()
    # Retrieve and stop: the stream ends with a DoneEvent whose answer is None.
    context_only: bool = False
    # The documents the question may read (tags, documents); empty: every enabled document.
    scope: Scope = Scope()


def ask_request(
    *,
    question: object,
    mode: object = None,
    top_k: object = None,
    chunk_top_k: object = None,
    keywords: object = None,
    history: object = None,
    response_type: object = None,
    max_entity_tokens: object = None,
    max_relation_tokens: object = None,
    max_total_tokens: object = None,
    context_only: object = None,
    filters: object = None,
) -> AskRequest:
    """The one validation of a question. Values come as a protocol carried them (JSON, command
    line, tool arguments); None means the default. Raises AskInvalid with a message for the asker."""
    if not isinstance(question, str) or not question.strip():
        raise AskInvalid("'question' is required: the text to ask.")
    question = question.strip()
    if len(question) > QUESTION_MAX_CHARS:
        raise AskInvalid(f"'question' is too long ({len(question):,} characters; at most {QUESTION_MAX_CHARS:,}).")
    mode = DEFAULT_MODE if mode is None else mode
    if mode not in MODES:
        raise AskInvalid(f"Unknown mode {mode!r}: use one of {', '.join(MODES)}.")
    response_type = DEFAULT_RESPONSE_TYPE if response_type is None else response_type
    if not isinstance(response_type, str) or not response_type.strip() or len(response_type) > RESPONSE_TYPE_MAX_CHARS:
        raise AskInvalid(
            f"'response_type' must be a short text (at most {RESPONSE_TYPE_MAX_CHARS} characters) "
            'such as "Multiple Paragraphs" or "Bullet Points".'
        )
    try:
        keywords = None if keywords is None else Keywords.coerce(keywords)
        scope = Scope.coerce(filters)
    except ValueError as exc:
        raise AskInvalid(str(exc)) from None
    return AskRequest(
        question=question,
        mode=mode,
        top_k=_whole_number("top_k", top_k, DEFAULT_TOP_K, TOP_K_MAX),
        chunk_top_k=_whole_number("chunk_top_k", chunk_top_k, DEFAULT_CHUNK_TOP_K, TOP_K_MAX),
        keywords=keywords,
        history=_history(history),
        response_type=response_type.strip(),
        budgets=Budgets(
            entities=_whole_number("max_entity_tokens", max_entity_tokens, Budgets.entities, BUDGET_MAX_TOKENS),
            relations=_whole_number("max_relation_tokens", max_relation_tokens, Budgets.relations, BUDGET_MAX_TOKENS),
            total=_whole_number("max_total_tokens", max_total_tokens, Budgets.total, BUDGET_MAX_TOKENS),
        ),
        context_only=check_flag("context_only", context_only),
        scope=scope,
    )


def ask_request_from_json(body: Mapping, *, fields: Sequence[str] = ASK_FIELDS, also: Sequence[str] = ()) -> AskRequest:
    """The request in a decoded JSON object. `fields` are the request fields this protocol
    accepts (`question` among them); `also` its own fields, which it reads itself. Anything else
    is refused, so a misspelt field is never silently ignored."""
    accepted = {*fields, *also}
    unknown = sorted(set(body) - accepted)
    if unknown:
        raise AskInvalid(f"Unknown field '{unknown[0]}'. Accepted fields: {', '.join(sorted(accepted))}.")
    return ask_request(**{name: body.get(name) for name in fields})


def _whole_number(name: str, value: object, default: int, high: int) -> int:
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= high:
        raise AskInvalid(f"'{name}' must be a whole number from 1 to {high:,}, got {value!r}.")
    return value


def check_flag(name: str, value: object, *, default: bool = False) -> bool:
    """A protocol's true/false field (None: the default); the adapters check their own flags here too."""
    if value is None:
        return default
    if not isinstance(value, bool):
        raise AskInvalid(f"'{name}' must be true or false, got {value!r}.")
    return value


def _history(value: object) -> tuple[dict, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(
        isinstance(turn, Mapping) and turn.get("role") in {"user", "assistant"} and isinstance(turn.get("content"), str)
        for turn in value
    ):
        raise AskInvalid('\'history\' must be a list of {"role": "user" or "assistant", "content": text}.')
    return tuple({"role": turn["role"], "content": turn["content"]} for turn in value)


def workspace_for_asking(*, user, slug: str, mode: str) -> Workspace:
    """The gate every question of a member passes, however long ago their socket opened: may
    this user (still) ask in this workspace, has the user questions left (RATE_LIMIT_ASK, one
    budget per user across every door), and is there anything to ask about in this mode?
    Raises AskDenied, AskRefused or AskLimited; returns the workspace, read afresh."""
    try:
        workspace = workspace_for_user(user, slug)
    except Http404:
        raise AskDenied("No such workspace, or you are not a member of it.") from None
    try:
        rate_limit_check(limit="RATE_LIMIT_ASK", user=user)
    except RateLimited as limited:
        raise AskLimited(str(limited), limited.retry_after) from None
    check_workspace_ready(workspace=workspace, mode=mode)
    return workspace


def check_workspace_ready(*, workspace: Workspace, mode: str) -> None:
    """Refuse a question that nothing in the workspace can answer yet (bypass needs no documents)."""
    # A published document is one whose chunks carry vectors; an unfinished one serves nothing yet.
    if mode == "bypass" or Chunk.objects.filter(workspace=workspace, embedding__isnull=False).exists():
        return
    if Document.objects.filter(
        workspace=workspace, status__in=[Document.Status.PENDING, Document.Status.PROCESSING]
    ).exists():
        raise AskRefused("Your documents are still being processed; ask again when they show as processed.")
    raise AskRefused("This workspace has no documents yet. Upload one on the workspace page, then ask again.")


@dataclass(frozen=True)
class RetrievalEvent:
    """What the answer is built from; the first event of every stream that got that far."""

    type: ClassVar[str] = "retrieval"
    result: RetrievalResult
    # What answers: ENGINE_LLM (the chat model) or ENGINE_EXTRACTIVE (the sources' own sentences).
    engine: str
    # The answer's record (knowledge.models.Answer.uuid) when an asker was given; its id for clients.
    answer_id: uuid.UUID | None = None


@dataclass(frozen=True)
class TokenEvent:
    type: ClassVar[str] = "token"
    text: str


@dataclass(frozen=True)
class DoneEvent:
    type: ClassVar[str] = "done"
    # The whole answer as streamed; None when only the context was asked for.
    answer: str | None
    engine: str
    # Every model call of the question: keywords, embeddings when remote, the answer.
    usage: llm.Usage
    # The retrieval's citations with the sentences the answer cites (answer.answer_citations).
    citations: list[dict]
    answer_id: uuid.UUID | None = None


@dataclass(frozen=True)
class ErrorEvent:
    type: ClassVar[str] = "error"
    message: str
    # "model": a model call failed after its retries (HTTP 502); "internal": a bug, logged (HTTP 500).
    reason: str
    # The model's failure, for a caller that knows who asks (ask_stream words it for the asker).
    error: llm.LLMError | None = field(default=None, compare=False, repr=False)


AskEvent = RetrievalEvent | TokenEvent | DoneEvent | ErrorEvent


def answer_engine() -> str:
    return ENGINE_EXTRACTIVE if answer_is_extractive() else ENGINE_LLM


async def ask_stream(
    *, workspace: Workspace, request: AskRequest, usage: llm.Usage | None = None, asker: Asker | None = None
) -> AsyncIterator[AskEvent]:
    """Retrieve, then answer, as events: RetrievalEvent, TokenEvents, DoneEvent; or an ErrorEvent
    where it failed, and nothing after it. Model usage adds up in `usage` (pass your own to read
    it after a cancel). Cancelling the consumer, or closing the stream, stops the model's stream.

    With an `asker` (every door's question; not the command's or the evaluation's), the question
    is recorded (knowledge.services.answers) before anything is retrieved and completed when the
    stream ends, however it ends; its id rides on the RetrievalEvent and the DoneEvent."""
    usage = llm.Usage() if usage is None else usage
    if asker is None:
        async with aclosing(_ask(workspace, request, usage, answer_id=None)) as events:
            async for event in events:
                yield event
        return
    started = time.perf_counter()
    record = await _on_pool_thread(
        answers.answer_start,
        workspace=workspace,
        asker=asker,
        question=request.question,
        mode=request.mode,
        model=answers.model_name(answer_engine()),
    )
    tally = answers.Tally(answer_id=record.uuid, started=started, door=asker.door, mode=request.mode)
    finished = False
    try:
        async with aclosing(_ask(workspace, request, usage, answer_id=record.uuid)) as events:
            async for event in events:
                _note(tally, event)
                if isinstance(event, DoneEvent | ErrorEvent):
                    # Complete before the door hears the end, so a next question finds it done.
                    await _on_pool_thread(answers.answer_finish, tally=tally, usage=usage, ended=time.perf_counter())
                    finished = True
                yield event
    finally:
        if not finished:
            # The reader stopped early (a cancel, a closed connection): the record says so.
            await _on_pool_thread(answers.answer_finish, tally=tally, usage=usage, ended=time.perf_counter())


async def _on_pool_thread(function, **arguments):
    """A short write off the event loop and off asgiref's shared thread, like retrieval."""

    def run():
        try:
            return function(**arguments)
        finally:
            # Pool threads are many: a connection left open there idles until the process exits.
            connection.close()

    return await database_sync_to_async(run, thread_sensitive=False)()


def _note(tally: "answers.Tally", event: AskEvent) -> None:
    if isinstance(event, RetrievalEvent):
        tally.citations = event.result.citations
    elif isinstance(event, TokenEvent):
        if tally.first_token is None:
            tally.first_token = time.perf_counter()
        tally.pieces.append(event.text)
    elif isinstance(event, DoneEvent):
        tally.outcome, tally.citations = Answer.Outcome.ANSWERED, event.citations
    elif isinstance(event, ErrorEvent):
        tally.outcome = Answer.Outcome.FAILED


async def _ask(
    workspace: Workspace, request: AskRequest, usage: llm.Usage, *, answer_id: uuid.UUID | None
) -> AsyncIterator[AskEvent]:
    started = time.perf_counter()
    try:
        result = await database_sync_to_async(_retrieve, thread_sensitive=False)(workspace, request, usage)
    except llm.LLMError as exc:
        yield _model_error(exc, workspace)
        return
    except Exception:
        logger.exception("Retrieval for a question in workspace %s failed", workspace.slug)
        yield ErrorEvent(message=INTERNAL_ERROR_MESSAGE, reason="internal")
        return
    result.stats["timings"]["total"] = round((time.perf_counter() - started) * 1000, 2)
    yield RetrievalEvent(result=result, engine=answer_engine(), answer_id=answer_id)
    async with aclosing(answer_stream(request=request, result=result, usage=usage)) as events:
        async for event in events:
            if isinstance(event, ErrorEvent) and event.error is not None:
                event = _model_error(event.error, workspace)
            elif isinstance(event, DoneEvent):
                event = dataclasses.replace(event, answer_id=answer_id)
            yield event


def _model_error(exc: llm.LLMError, workspace: Workspace) -> "ErrorEvent":
    """The failure as this asker may read it: owners get the detail (endpoint host, the provider's
    words, keys masked), everyone else what to do about it. The log always gets the detail."""
    logger.warning("A model call for a question in workspace %s failed: %s", workspace.slug, exc)
    role = getattr(workspace, "role", None)
    return ErrorEvent(message=str(exc) if role == Role.OWNER else exc.public, reason="model")


async def answer_stream(
    *, request: AskRequest, result: RetrievalResult, usage: llm.Usage
) -> AsyncIterator[TokenEvent | DoneEvent | ErrorEvent]:
    """The answering half of ask_stream, for callers that retrieved in a way of their own (the
    evaluation's baselines): TokenEvents, then a DoneEvent or an ErrorEvent."""
    engine = answer_engine()
    if request.context_only:
        yield DoneEvent(answer=None, engine=engine, usage=usage, citations=result.citations)
        return
    pieces = []
    stream = astream_answer(
        question=request.question,
        result=result,
        history=request.history,
        response_type=request.response_type,
        usage=usage,
    )
    try:
        async with aclosing(stream):
            async for piece in stream:
                pieces.append(piece)
                yield TokenEvent(text=piece)
    except llm.LLMError as exc:
        yield ErrorEvent(message=exc.public, reason="model", error=exc)
        return
    except Exception:
        logger.exception("Answering a question failed")
        yield ErrorEvent(message=INTERNAL_ERROR_MESSAGE, reason="internal")
        return
    answer = "".join(pieces)
    # Off the event loop: segmenting the cited chunks takes a moment.
    citations = await asyncio.to_thread(answer_citations, answer, result)
    yield DoneEvent(answer=answer, engine=engine, usage=usage, citations=citations)


def _retrieve(workspace: Workspace, request: AskRequest, usage: llm.Usage) -> RetrievalResult:
    try:
        return retrieve(
            workspace=workspace,
            question=request.question,
            mode=request.mode,
            top_k=request.top_k,
            chunk_top_k=request.chunk_top_k,
            keywords=request.keywords,
            history=request.history,
            budgets=request.budgets,
            scope=request.scope,
            usage=usage,
        )
    finally:
        # This runs on a pool thread, one of many: a connection left open there would idle
        # until the process exits, whatever CONN_MAX_AGE says.
        connection.close()
