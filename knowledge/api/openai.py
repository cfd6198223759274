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
from django.http import JsonResponse, StreamingHttpResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from knowledge.api.auth import CHALLENGE, abearer_user
from knowledge.api.protocols import (
    UnknownModel,
    chat_request,
    cited_sources,
    conversation,
    model_names,
    parse_model,
    sources_text,
)
from knowledge.selectors import workspaces_for_user
from knowledge.services.asking import (
    AskDenied,
    AskInvalid,
    AskRefused,
    DoneEvent,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    ask_stream,
    check_flag,
    workspace_for_asking,
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
_ERROR_STATUS = {"model": 502, "internal": 500}


def _error(status: int, message: str, *, code: str | None = None, param: str | None = None) -> JsonResponse:
    body = {"error": {"message": message, "type": _ERROR_TYPE[status], "param": param, "code": code}}
    response = JsonResponse(body, status=status)
    if status == 401:
        response["WWW-Authenticate"] = CHALLENGE
    return response


def _no_such_model(name: object) -> JsonResponse:
    return _error(
        404,
        f"The model {name!r} does not exist or you do not have access to it.",
        code="model_not_found",
        param="model",
    )


async def _user(request):
    """(user, None) or (None, a 401, 403 or 429)."""
    bearer = await abearer_user(request.headers.get("Authorization", ""), ip=request.META.get("REMOTE_ADDR"))
    if bearer.user is not None:
        return bearer.user, None
    codes = {401: "invalid_api_key", 403: "insufficient_scope", 429: "rate_limit_exceeded"}
    response = _error(bearer.status, bearer.error, code=codes.get(bearer.status))
    if bearer.retry_after is not None:
        response["Retry-After"] = str(bearer.retry_after)
    return None, response


@csrf_exempt
@require_GET
async def models(request):
    user, denied = await _user(request)
    if denied is not None:
        return denied
    workspaces = await sync_to_async(list)(workspaces_for_user(user).order_by("slug"))
    data = [
        {"id": name, "object": "model", "created": int(workspace.created_at.timestamp()), "owned_by": workspace.name}
        for workspace in workspaces
        for name, _mode in model_names(workspace)
    ]
    return JsonResponse({"object": "list", "data": data})


@csrf_exempt
@require_POST
async def chat_completions(request):
    user, denied = await _user(request)
    if denied is not None:
        return denied
    try:
        body = json.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        return _error(400, 'The body must be a JSON object: {"model": "<workspace>", "messages": [...]}.')
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
        workspace = await sync_to_async(workspace_for_asking)(user=user, slug=model.slug, mode=ask.mode)
    except AskInvalid as invalid:
        return _error(400, str(invalid))
    except AskDenied:
        return _no_such_model(body["model"])
    except AskRefused as refusal:
        return _error(409, str(refusal), code="workspace_not_ready")
    events = ask_stream(workspace=workspace, request=ask)
    retrieval = await anext(events)
    if isinstance(retrieval, ErrorEvent):
        await events.aclose()
        return _error(_ERROR_STATUS[retrieval.reason], retrieval.message)
    completion = _Completion(
        model=body["model"], base_url=request.build_absolute_uri("/"), workspace_slug=workspace.slug
    )
    if stream:
        response = StreamingHttpResponse(
            completion.server_sent_events(retrieval, events, include_usage=include_usage),
            content_type="text/event-stream",
        )
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    async with aclosing(events):
        async for last in events:
            if isinstance(last, ErrorEvent):
                return _error(_ERROR_STATUS[last.reason], last.message)
    return JsonResponse(completion.whole(retrieval, last))


class _Completion:
    """One answer in OpenAI's chat-completion shapes."""

    def __init__(self, *, model: str, base_url: str, workspace_slug: str):
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
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
