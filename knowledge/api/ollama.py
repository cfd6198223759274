"""The Ollama-compatible API (/api/version, /api/tags, /api/chat, /api/generate), an adapter over
the ask service, so Ollama clients and Open WebUI's Ollama connection talk to a workspace.

A model is a workspace asked in a mode: `acme:latest` (the default mode) or `acme:local`; a
LightRAG query prefix at the start of the question ("/local ...", "/context ...") chooses the
mode for one question (knowledge/api/protocols.py). Authenticated by our API tokens
(`Authorization: Bearer`; the `ollama` client sends it with `headers=`, Open WebUI from the
connection's key). Replies stream as NDJSON unless `"stream": false`, as Ollama's do; errors are
{"error": "..."}, which the `ollama` client raises as ResponseError.
"""

import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing

from asgiref.sync import sync_to_async
from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from knowledge.api.protocols import (
    DEFAULT_TAG,
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
    feedback_from_json,
    feedback_json,
    gate,
    json_body,
    last_event,
    ndjson_line,
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

# The Ollama release whose API this one follows (LightRAG's emulation answers the same).
OLLAMA_VERSION = "0.9.3"
DOOR = Door(body=lambda status, message, code: {"error": message})


def _no_such_model(name: object) -> JsonResponse:
    return DOOR.error(404, f"model {name!r} not found, or you do not have access to it")


@csrf_exempt
@require_GET
async def version(request):
    _, denied = await DOOR.token_user(request, scope=SCOPE_READ)
    return denied or JsonResponse({"version": OLLAMA_VERSION})


@csrf_exempt
@require_GET
async def tags(request):
    user, denied = await DOOR.token_user(request, scope=SCOPE_READ)
    if denied is not None:
        return denied
    workspaces = await sync_to_async(list)(workspaces_with_tags(user).order_by("slug"))
    models = [
        {
            "name": name,
            "model": name,
            "modified_at": workspace.created_at.isoformat(),
            "size": 0,
            "digest": "",
            "details": {
                "parent_model": "",
                "format": "",
                "family": "graphrag-teams",
                "families": ["graphrag-teams"],
                "parameter_size": "",
                "quantization_level": "",
                "mode": mode,
            },
        }
        for workspace in workspaces
        for name, mode in model_names(workspace, default_tag=DEFAULT_TAG, tags=workspace.tags)
    ]
    return JsonResponse({"models": models})


@csrf_exempt
@require_GET
async def ps(request):
    """No model is loaded in memory here (a workspace is not one); Open WebUI polls this on every
    model refresh and logs an error for anything but Ollama's answer."""
    _, denied = await DOOR.token_user(request, scope=SCOPE_READ)
    return denied or JsonResponse({"models": []})


@csrf_exempt
@require_POST
async def chat(request):
    return await _answer(request, asked=_chat_asked, piece=_chat_piece)


@csrf_exempt
@require_POST
async def generate(request):
    return await _answer(request, asked=_generate_asked, piece=_generate_piece)


def _chat_asked(body: dict) -> tuple[str, list[dict]]:
    return conversation(body.get("messages"))


def _chat_piece(text: str) -> dict:
    return {"message": {"role": "assistant", "content": text}}


def _generate_asked(body: dict) -> tuple[str, list[dict]]:
    prompt = body.get("prompt")
    if not isinstance(prompt, str):
        raise AskInvalid("'prompt' is required: the question to ask.")
    return prompt, []


def _generate_piece(text: str) -> dict:
    return {"response": text}


class _Reply:
    """An answer in Ollama's reply shape; `piece` puts a text where /api/chat or /api/generate has it."""

    def __init__(self, *, model: str, base_url: str, workspace_slug: str, piece: Callable[[str], dict]):
        self.model = model
        self.base_url = base_url
        self.workspace_slug = workspace_slug
        self.piece = piece
        self.started = time.monotonic_ns()

    def _line(self, text: str, *, done: bool = False, **extra) -> dict:
        return {
            "model": self.model,
            "created_at": timezone.now().isoformat(),
            **self.piece(text),
            "done": done,
            **extra,
        }

    def _sources(self, done: DoneEvent) -> list[dict]:
        return cited_sources(
            answer=done.answer, citations=done.citations, base_url=self.base_url, workspace_slug=self.workspace_slug
        )

    def _final(self, text: str, done: DoneEvent, sources: list[dict]) -> dict:
        return self._line(
            text,
            done=True,
            done_reason="stop",
            total_duration=time.monotonic_ns() - self.started,
            load_duration=0,
            prompt_eval_count=done.usage.prompt_tokens,
            eval_count=done.usage.completion_tokens,
            sources=sources,
            answer_engine=done.engine,
            # The stored answer's id: feedback comes back by it (POST /api/feedback).
            id=str(done.answer_id),
        )

    def whole(self, retrieval: RetrievalEvent, done: DoneEvent) -> dict:
        sources = self._sources(done)
        # Asked for the context only ("/context ..."), the context is the reply.
        text = retrieval.result.context if done.answer is None else done.answer
        return self._final(text + sources_text(sources), done, sources)

    async def lines(self, retrieval: RetrievalEvent, events: AsyncIterator) -> AsyncIterator[bytes]:
        async with aclosing(events):
            async for event in events:
                if isinstance(event, TokenEvent):
                    yield ndjson_line(self._line(event.text))
                elif isinstance(event, ErrorEvent):
                    yield ndjson_line({"error": event.message})
                elif isinstance(event, DoneEvent):
                    sources = self._sources(event)
                    tail = (retrieval.result.context if event.answer is None else "") + sources_text(sources)
                    yield ndjson_line(self._final(tail, event, sources))


async def _answer(request, *, asked: Callable[[dict], tuple[str, list[dict]]], piece: Callable[[str], dict]):
    user, denied = await DOOR.token_user(request, scope=SCOPE_ASK)
    if denied is not None:
        return denied
    body = json_body(request)
    if body is None:
        return DOOR.error(400, 'The body must be a JSON object: {"model": "<workspace>:latest", ...}.')
    try:
        model = parse_model(body.get("model"))
    except UnknownModel:
        return _no_such_model(body.get("model"))
    options = body.get("options")
    try:
        if options is not None and not isinstance(options, dict):
            raise AskInvalid("'options' must be an object.")
        question, history = asked(body)
        # Our answer options ride in Ollama's `options` object, next to the sampling ones we
        # ignore; its `top_k` is one of those (top-k sampling), not our graph rows per search.
        ours = {name: value for name, value in (options or {}).items() if name != "top_k"}
        ask = chat_request(model=model, question=question, history=history, options=ours)
        # Ollama streams unless told not to.
        stream = check_flag("stream", body.get("stream"), default=True)
        workspace = await gate(user=user, slug=model.slug, request=ask)
    except AskDenied:
        return _no_such_model(body["model"])
    except AskError as refusal:
        return DOOR.ask_refused(refusal)
    started = await start_answer(workspace=workspace, request=ask, asker=Asker(user=user, door=Answer.Door.OLLAMA))
    if isinstance(started, ErrorEvent):
        return DOOR.error(ANSWER_ERROR_STATUS[started.reason], started.message)
    reply = _Reply(
        model=body["model"], base_url=request.build_absolute_uri("/"), workspace_slug=workspace.slug, piece=piece
    )
    if stream:
        return streaming(reply.lines(started.retrieval, started.events), content_type="application/x-ndjson")
    last = await last_event(started.events)
    if isinstance(last, ErrorEvent):
        return DOOR.error(ANSWER_ERROR_STATUS[last.reason], last.message)
    return JsonResponse(reply.whole(started.retrieval, last))


@csrf_exempt
@require_POST
async def feedback(request):
    """Feedback on an answer this API gave (Ollama has no such call; the id is on our `done`
    line): {"id": "...", "rating": "up" | "down", "comment": "..."}."""
    user, denied = await DOOR.token_user(request, scope=SCOPE_ASK)
    if denied is not None:
        return denied
    body = json_body(request)
    if body is None:
        return DOOR.error(400, 'The body must be a JSON object: {"id": "<answer id>", "rating": "down", ...}.')
    answer = await sync_to_async(answer_for_user)(user, body.pop("id", None))
    if answer is None:
        return DOOR.error(404, "answer not found: send the 'id' of a reply you were given")
    try:
        given = await sync_to_async(feedback_from_json)(answer=answer, user=user, body=body)
    except FeedbackInvalid as invalid:
        return DOOR.error(400, str(invalid))
    return JsonResponse(feedback_json(given))
