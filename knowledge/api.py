"""The HTTP API: POST /api/workspaces/<slug>/query.

Authenticated by the session (with its CSRF check) or by `Authorization: Bearer <token>`;
the caller must be a member of the workspace. Errors are JSON: {"error": "..."}.
"""

import json
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field

from asgiref.sync import sync_to_async
from django.http import Http404, JsonResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from knowledge.answer import DEFAULT_RESPONSE_TYPE, answer_is_extractive, astream_answer
from knowledge.api_tokens import user_for_api_token
from knowledge.llm import LLMError, Usage
from knowledge.retrieval import DEFAULT_TOP_K, MODES, Keywords, RetrievalResult, retrieve
from knowledge.selectors import workspace_for_user

MAX_QUESTION_CHARS = 8000
_FIELDS = {
    "question",
    "mode",
    "top_k",
    "chunk_top_k",
    "keywords",
    "response_type",
    "stream",
    "context_only",
    "history",
    "max_entity_tokens",
    "max_relation_tokens",
    "max_total_tokens",
}


@dataclass
class QueryRequest:
    question: str
    mode: str = "mix"
    top_k: int = DEFAULT_TOP_K
    chunk_top_k: int | None = None
    keywords: Keywords | None = None
    response_type: str = DEFAULT_RESPONSE_TYPE
    stream: bool = False
    context_only: bool = False
    history: list[dict] = field(default_factory=list)
    budgets: dict = field(default_factory=dict)


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="api"'
    return response


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request, reason):
        return reason


def _csrf_failure(request) -> str | None:
    check = _CsrfCheck(lambda request: None)
    check.process_request(request)
    return check.process_view(request, None, (), {})


async def _authenticate(request):
    """(user, None) or (None, an error response). A token needs no CSRF token; a session does."""
    header = request.headers.get("Authorization", "")
    if header:
        scheme, _, secret = header.partition(" ")
        if scheme.casefold() != "bearer" or not secret.strip():
            return None, _error(401, "Send the API token as 'Authorization: Bearer <token>'.")
        user = await sync_to_async(user_for_api_token)(secret.strip())
        if user is None:
            return None, _error(401, "This API token is not valid (revoked, mistyped, or its user is inactive).")
        return user, None
    user = await request.auser()
    if not user.is_authenticated:
        return None, _error(401, "Log in, or send an API token as 'Authorization: Bearer <token>'.")
    reason = _csrf_failure(request)
    if reason:
        return None, _error(403, f"CSRF check failed ({reason}). Send the X-CSRFToken header, or use an API token.")
    return user, None


def _whole_number(body: dict, name: str, default, *, low: int, high: int):
    value = body.get(name, default)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise ValueError(f"'{name}' must be a whole number from {low} to {high}, got {value!r}.")
    return value


def _flag(body: dict, name: str) -> bool:
    value = body.get(name, False)
    if not isinstance(value, bool):
        raise ValueError(f"'{name}' must be true or false, got {value!r}.")
    return value


def _history(value) -> list[dict]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(
        isinstance(turn, dict) and turn.get("role") in {"user", "assistant"} and isinstance(turn.get("content"), str)
        for turn in value
    ):
        raise ValueError('\'history\' must be a list of {"role": "user" or "assistant", "content": text}.')
    return value


def parse_query_request(raw: bytes) -> QueryRequest:
    """The request body as a QueryRequest; ValueError with a message fit for the caller."""
    try:
        body = json.loads(raw or b"")
    except (ValueError, UnicodeDecodeError):
        raise ValueError('The body must be a JSON object, e.g. {"question": "...", "mode": "mix"}.') from None
    if not isinstance(body, dict):
        raise ValueError('The body must be a JSON object, e.g. {"question": "...", "mode": "mix"}.')
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ValueError(f"Unknown field '{unknown[0]}'. Accepted fields: {', '.join(sorted(_FIELDS))}.")
    question = body.get("question")
    if not isinstance(question, str) or not question.strip():
        raise ValueError("'question' is required: the text to ask.")
    if len(question) > MAX_QUESTION_CHARS:
        raise ValueError(f"'question' is too long ({len(question)} characters; at most {MAX_QUESTION_CHARS}).")
    mode = body.get("mode", "mix")
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}: use one of {', '.join(MODES)}.")
    response_type = body.get("response_type", DEFAULT_RESPONSE_TYPE)
    if not isinstance(response_type, str) or not response_type.strip() or len(response_type) > 100:
        raise ValueError('\'response_type\' must be a short text such as "Multiple Paragraphs" or "Bullet Points".')
    keywords = body.get("keywords")
    return QueryRequest(
        question=question.strip(),
        mode=mode,
        top_k=_whole_number(body, "top_k", DEFAULT_TOP_K, low=1, high=500),
        chunk_top_k=_whole_number(body, "chunk_top_k", None, low=1, high=500),
        keywords=None if keywords is None else Keywords.coerce(keywords),
        response_type=response_type.strip(),
        stream=_flag(body, "stream"),
        context_only=_flag(body, "context_only"),
        history=_history(body.get("history")),
        budgets={
            budget: _whole_number(body, f"max_{budget}_tokens", None, low=1, high=1_000_000)
            for budget in ("entity", "relation", "total")
        },
    )


def _retrieve(workspace, ask: QueryRequest, usage: Usage) -> RetrievalResult:
    return retrieve(
        workspace=workspace,
        question=ask.question,
        mode=ask.mode,
        top_k=ask.top_k,
        chunk_top_k=ask.chunk_top_k,
        keywords=ask.keywords,
        history=ask.history,
        budgets={
            "entities": ask.budgets["entity"],
            "relations": ask.budgets["relation"],
            "total": ask.budgets["total"],
        },
        usage=usage,
    )


def _answer(ask: QueryRequest, result: RetrievalResult, usage: Usage) -> AsyncIterator[str]:
    return astream_answer(
        question=ask.question, result=result, history=ask.history, response_type=ask.response_type, usage=usage
    )


def _line(event: dict) -> bytes:
    return (json.dumps(event, ensure_ascii=False) + "\n").encode()


async def _events(ask: QueryRequest, result: RetrievalResult, payload: dict, usage: Usage) -> AsyncIterator[bytes]:
    yield _line({"type": "retrieval", **payload})
    parts = []
    if not ask.context_only:
        try:
            async for piece in _answer(ask, result, usage):
                parts.append(piece)
                yield _line({"type": "token", "text": piece})
        except LLMError as exc:
            yield _line({"type": "error", "message": str(exc)})
            return
    answer = None if ask.context_only else "".join(parts)
    yield _line({"type": "done", "answer": answer, "usage": asdict(usage)})


@csrf_exempt
@require_POST
async def query(request, slug: str):
    user, denied = await _authenticate(request)
    if denied is not None:
        return denied
    try:
        workspace = await sync_to_async(workspace_for_user)(user, slug)
    except Http404:
        return _error(404, "No such workspace, or you are not a member of it.")
    try:
        ask = parse_query_request(request.body)
    except ValueError as exc:
        return _error(400, str(exc))
    usage = Usage()
    try:
        result = await sync_to_async(_retrieve)(workspace, ask, usage)
    except ValueError as exc:
        return _error(400, str(exc))
    except LLMError as exc:
        return _error(502, str(exc))
    payload = result.to_json(include_context=ask.context_only)
    payload["answer_engine"] = "extractive" if answer_is_extractive() else "llm"
    if ask.stream:
        response = StreamingHttpResponse(_events(ask, result, payload, usage), content_type="application/x-ndjson")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    if ask.context_only:
        return JsonResponse({"answer": None, **payload, "usage": asdict(usage)})
    try:
        answer = "".join([piece async for piece in _answer(ask, result, usage)])
    except LLMError as exc:
        return _error(502, str(exc))
    return JsonResponse({"answer": answer, **payload, "usage": asdict(usage)})
