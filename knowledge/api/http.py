"""The HTTP API: POST /api/workspaces/<slug>/query, an adapter over the ask service.

Authenticated by the session (with its CSRF check) or by `Authorization: Bearer <token>` (a live
token whose scope allows asking); the caller must be a member of the workspace. Requests are
rate limited per token, or per user for a session (RATE_LIMIT_API). Errors are JSON: {"error": "..."}.
"""

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict

from asgiref.sync import sync_to_async
from django.http import JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from knowledge.api.auth import Bearer, abearer_user
from knowledge.api.responses import (
    ANSWER_ERROR_STATUS,
    Door,
    ask_error_status,
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
from knowledge.selectors import answer_for_user
from knowledge.services.answers import FeedbackInvalid
from knowledge.services.asking import (
    Asker,
    AskError,
    AskEvent,
    DoneEvent,
    ErrorEvent,
    TokenEvent,
    ask_request_from_json,
    check_flag,
)
from knowledge.services.ratelimits import RateLimited, rate_limit_check

DOOR = Door(body=lambda status, message, code: {"error": message})


class _CsrfCheck(CsrfViewMiddleware):
    def _reject(self, request, reason):
        return reason


def _csrf_failure(request) -> str | None:
    check = _CsrfCheck(lambda request: None)
    check.process_request(request)
    return check.process_view(request, None, (), {})


async def _authenticate(request):
    """(user, None) or (None, an error response). A token needs no CSRF token; a session does.
    Either way the request counts against the caller's API rate limit."""
    header = request.headers.get("Authorization", "")
    if header:
        bearer = await abearer_user(header, ip=request.META.get("REMOTE_ADDR"))
        return (bearer.user, None) if bearer.user is not None else (None, DOOR.refused(bearer))
    user = await request.auser()
    if not user.is_authenticated:
        return None, DOOR.error(401, "Log in, or send an API token as 'Authorization: Bearer <token>'.")
    reason = _csrf_failure(request)
    if reason:
        return None, DOOR.error(403, f"CSRF check failed ({reason}). Send the X-CSRFToken header, or use an API token.")
    try:
        await sync_to_async(rate_limit_check)(limit="RATE_LIMIT_API", user=user)
    except RateLimited as limited:
        return None, DOOR.refused(Bearer(error=str(limited), status=429, retry_after=limited.retry_after))
    return user, None


async def _ndjson(first: dict, events: AsyncIterator[AskEvent]) -> AsyncIterator[bytes]:
    yield ndjson_line({"type": "retrieval", **first})
    async with aclosing(events):
        async for event in events:
            if isinstance(event, TokenEvent):
                yield ndjson_line({"type": "token", "text": event.text})
            elif isinstance(event, ErrorEvent):
                yield ndjson_line({"type": "error", "message": event.message})
            elif isinstance(event, DoneEvent):
                done = {
                    "type": "done",
                    "answer_id": str(event.answer_id),
                    "answer": event.answer,
                    "citations": event.citations,
                }
                yield ndjson_line({**done, "usage": asdict(event.usage)})


@csrf_exempt
@require_POST
async def query(request, slug: str):
    user, denied = await _authenticate(request)
    if denied is not None:
        return denied
    body = json_body(request)
    if body is None:
        return DOOR.error(400, 'The body must be a JSON object, e.g. {"question": "...", "mode": "mix"}.')
    try:
        ask = ask_request_from_json(body, also=("stream",))
        stream = check_flag("stream", body.get("stream"))
        workspace = await gate(user=user, slug=slug, request=ask)
    except AskError as refusal:
        return DOOR.error(ask_error_status(refusal), str(refusal))
    started = await start_answer(workspace=workspace, request=ask, asker=Asker(user=user, door=Answer.Door.API))
    if isinstance(started, ErrorEvent):
        return DOOR.error(ANSWER_ERROR_STATUS[started.reason], started.message)
    retrieval = started.retrieval
    first = {
        "answer_id": str(retrieval.answer_id),
        **retrieval.result.to_json(include_context=ask.context_only),
        "answer_engine": retrieval.engine,
    }
    if stream:
        return streaming(_ndjson(first, started.events), content_type="application/x-ndjson")
    last = await last_event(started.events)
    if isinstance(last, ErrorEvent):
        return DOOR.error(ANSWER_ERROR_STATUS[last.reason], last.message)
    return JsonResponse({"answer": last.answer, **first, "citations": last.citations, "usage": asdict(last.usage)})


@csrf_exempt
@require_POST
async def answer_feedback(request, slug: str, answer_id: str):
    """Feedback on an answer this API gave: {"rating": "up" | "down", "comment": "..."}."""
    user, denied = await _authenticate(request)
    if denied is not None:
        return denied
    body = json_body(request)
    if body is None:
        return DOOR.error(400, 'The body must be a JSON object, e.g. {"rating": "down", "comment": "..."}.')
    answer = await sync_to_async(answer_for_user)(user, answer_id, slug=slug)
    if answer is None:
        return DOOR.error(404, "No such answer of yours in this workspace.")
    try:
        feedback = await sync_to_async(feedback_from_json)(answer=answer, user=user, body=body)
    except FeedbackInvalid as invalid:
        return DOOR.error(400, str(invalid))
    return JsonResponse(feedback_json(feedback))
