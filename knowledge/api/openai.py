"""The OpenAI-compatible API (GET /v1/models, POST /v1/chat/completions), an adapter over the ask service.

Chat clients that speak OpenAI's API (the `openai` packages, Open WebUI, LibreChat, ...) ask a
workspace as if it were a model: `acme` in the default mode, `acme:local` in local mode (see
knowledge/api/protocols.py). Authenticated by our API tokens only (`Authorization: Bearer`,
which is how every OpenAI client sends its key). Errors have OpenAI's shape:
{"error": {"message", "type", "param", "code"}}.
"""

import json
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.http import JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from knowledge.api.protocols import (
    UnknownModel,
    chat_request,
    cited_sources,
    conversation,
    model_names,
    parse_model,
    sources_text,
)
from knowledge.api.responses import (
    ANSWER_ERROR_STATUS,
    Door,
    ask_error_status,
    feedback_from_json,
    feedback_json,
    gate,
    json_body,
    last_event,
    start_answer,
    streaming,
)
from knowledge.models import Answer
from knowledge.selectors import answer_for_user, workspaces_with_tags
from knowledge.services.answers import FeedbackInvalid
from knowledge.services.api_tokens import SCOPE_ASK, SCOPE_READ
from knowledge.services.asking import (
    AskDenied,
    Asker,
    AskError,
    AskInvalid,
    DoneEvent,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    check_flag,
)

_ERROR_TYPE = {
    400: "invalid_request_error",
    401: "invalid_request_error",
    403: "permission_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
    429: "rate_limit_error",
    500: "server_error",
    502: "server_error",
}
DOOR = Door(
    body=lambda status, message, code: {
        "error": {
            "message": message,
            "type": _ERROR_TYPE.get(status, "server_error" if status >= 500 else "invalid_request_error"),
            "param": "model" if code == "model_not_found" else None,
            "code": code,
        }
    }
)
# OpenAI's codes for the refusals of a key.
_TOKEN_CODES = {401: "invalid_api_key", 403: "insufficient_scope", 429: "rate_limit_exceeded"}
_ASK_CODES = {409: "workspace_not_ready", 429: "rate_limit_exceeded"}


def _no_such_model(name: object) -> JsonResponse:
    return DOOR.error(
        404, f"The model {name!r} does not exist or you do not have access to it.", code="model_not_found"
    )


@csrf_exempt
@require_GET
async def models(request):
    user, denied = await DOOR.token_user(request, scope=SCOPE_READ, codes=_TOKEN_CODES)
    if denied is not None:
        return denied
    workspaces = await sync_to_async(list)(workspaces_with_tags(user).order_by("slug"))
    data = [
        {"id": name, "object": "model", "created": int(workspace.created_at.timestamp()), "owned_by": workspace.name}
        for workspace in workspaces
        for name, _mode in model_names(workspace, tags=workspace.tags)
    ]
    return JsonResponse({"object": "list", "data": data})


@csrf_exempt
@require_POST
async def chat_completions(request):
    user, denied = await DOOR.token_user(request, scope=SCOPE_ASK, codes=_TOKEN_CODES)
    if denied is not None:
        return denied
    body = json_body(request)
    if body is None:
        return DOOR.error(400, 'The body must be a JSON object: {"model": "<workspace>", "messages": [...]}.')
    try:
        model = parse_model(body.get("model"))
    except UnknownModel:
        return _no_such_model(body.get("model"))
    try:
        question, history = conversation(body.get("messages"))
        ask = chat_request(model=model, question=question, history=history, options=body)
        stream = check_flag("stream", body.get("stream"))
        stream_options = body.get("stream_options") or {}
        if not isinstance(stream_options, dict):
            raise AskInvalid("'stream_options' must be an object.")
        include_usage = check_flag("stream_options.include_usage", stream_options.get("include_usage"))
        workspace = await gate(user=user, slug=model.slug, request=ask)
    except AskDenied:
        return _no_such_model(body["model"])
    except AskError as refusal:
        return DOOR.ask_refused(refusal, code=_ASK_CODES.get(ask_error_status(refusal)))
    started = await start_answer(workspace=workspace, request=ask, asker=Asker(user=user, door=Answer.Door.OPENAI))
    if isinstance(started, ErrorEvent):
        return DOOR.error(ANSWER_ERROR_STATUS[started.reason], started.message)
    completion = _Completion(
        answer_id=started.retrieval.answer_id,
        model=body["model"],
        base_url=request.build_absolute_uri("/"),
        workspace_slug=workspace.slug,
    )
    if stream:
        events = completion.server_sent_events(started.retrieval, started.events, include_usage=include_usage)
        return streaming(events, content_type="text/event-stream")
    last = await last_event(started.events)
    if isinstance(last, ErrorEvent):
        return DOOR.error(ANSWER_ERROR_STATUS[last.reason], last.message)
    return JsonResponse(completion.whole(started.retrieval, last))


class _Completion:
    """One answer in OpenAI's chat-completion shapes."""

    def __init__(self, *, answer_id: uuid.UUID, model: str, base_url: str, workspace_slug: str):
        # The stored answer's id: feedback comes back by it (POST /v1/chat/completions/<id>).
        self.id = completion_id(answer_id)
        self.created = int(time.time())
        self.model = model
        self.base_url = base_url
        self.workspace_slug = workspace_slug

    def _head(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def _sources(self, done: DoneEvent) -> list[dict]:
        return cited_sources(
            answer=done.answer,
            citations=done.citations,
            base_url=self.base_url,
            workspace_slug=self.workspace_slug,
        )

    @staticmethod
    def _usage(done: DoneEvent) -> dict:
        usage = done.usage
        total = usage.prompt_tokens + usage.completion_tokens
        return {
            "prompt_tokens": usage.prompt_tokens,
            "completion_tokens": usage.completion_tokens,
            "total_tokens": total,
        }

    def whole(self, retrieval: RetrievalEvent, done: DoneEvent) -> dict:
        sources = self._sources(done)
        # Asked for the context only ("/context ..."), the context is the reply.
        text = retrieval.result.context if done.answer is None else done.answer
        message = {"role": "assistant", "content": text + sources_text(sources)}
        return {
            **self._head("chat.completion"),
            "choices": [{"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}],
            "usage": self._usage(done),
            "sources": sources,
            "answer_engine": done.engine,
        }

    def _chunk(self, delta: dict, *, finish_reason: str | None = None, **extra) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}
        return _event({**self._head("chat.completion.chunk"), "choices": [choice], **extra})

    async def server_sent_events(
        self, retrieval: RetrievalEvent, events: AsyncIterator, *, include_usage: bool
    ) -> AsyncIterator[bytes]:
        yield self._chunk({"role": "assistant", "content": ""})
        async with aclosing(events):
            async for event in events:
                if isinstance(event, TokenEvent):
                    yield self._chunk({"content": event.text})
                elif isinstance(event, ErrorEvent):
                    yield _event(
                        {"error": {"message": event.message, "type": "server_error", "param": None, "code": None}}
                    )
                elif isinstance(event, DoneEvent):
                    sources = self._sources(event)
                    tail = (retrieval.result.context if event.answer is None else "") + sources_text(sources)
                    if tail:
                        yield self._chunk({"content": tail})
                    yield self._chunk({}, finish_reason="stop", sources=sources, answer_engine=event.engine)
                    if include_usage:
                        yield _event(
                            {**self._head("chat.completion.chunk"), "choices": [], "usage": self._usage(event)}
                        )
        yield b"data: [DONE]\n\n"


def _event(data: dict) -> bytes:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


COMPLETION_PREFIX = "chatcmpl-"


def completion_id(answer_id: uuid.UUID) -> str:
    return f"{COMPLETION_PREFIX}{answer_id.hex}"


@csrf_exempt
@require_http_methods(["GET", "POST"])
async def completion(request, completion_id: str):
    """OpenAI's stored completion: GET reads an answer this token's user was given, POST
    {"metadata": {"rating": "up" | "down", "comment": "..."}} gives feedback on it (what the
    `openai` package's chat.completions.retrieve() and .update() send)."""
    scope = SCOPE_ASK if request.method == "POST" else SCOPE_READ
    user, denied = await DOOR.token_user(request, scope=scope, codes=_TOKEN_CODES)
    if denied is not None:
        return denied
    answer = await sync_to_async(answer_for_user)(user, completion_id.removeprefix(COMPLETION_PREFIX))
    if answer is None:
        return DOOR.error(404, f"No chat completion found with id {completion_id!r}.", code="not_found")
    metadata = {}
    if request.method == "POST":
        body = json_body(request)
        metadata = body.get("metadata") if body is not None else None
        if not isinstance(metadata, dict):
            return DOOR.error(400, 'Send {"metadata": {"rating": "up" or "down", "comment": "..."}}.')
        try:
            feedback = await sync_to_async(feedback_from_json)(answer=answer, user=user, body=metadata)
        except FeedbackInvalid as invalid:
            return DOOR.error(400, str(invalid), code="invalid_metadata")
        metadata = {key: value for key, value in feedback_json(feedback).items() if key != "answer_id"}
    return JsonResponse(
        {
            "id": completion_id,
            "object": "chat.completion",
            "created": int(answer.created_at.timestamp()),
            "model": f"{answer.workspace.slug}:{answer.mode}",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": answer.text},
                    "finish_reason": "stop",
                    "logprobs": None,
                }
            ],
            "usage": {
                "prompt_tokens": answer.prompt_tokens,
                "completion_tokens": answer.completion_tokens,
                "total_tokens": answer.prompt_tokens + answer.completion_tokens,
            },
            "metadata": metadata,
        }
    )
