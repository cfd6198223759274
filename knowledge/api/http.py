"""The HTTP API: POST /api/workspaces/<slug>/query, an adapter over the ask service.

Authenticated by the session (with its CSRF check) or by `Authorization: Bearer <token>` (a live
token whose scope allows asking); the caller must be a member of the workspace. Requests are
rate limited per token, or per user for a session (RATE_LIMIT_API). Errors are JSON: {"error": "..."}.
"""

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict

from asgiref.sync import sync_to_async
from django.http import JsonResponse, StreamingHttpResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from knowledge.api.auth import CHALLENGE, Bearer, abearer_user
from knowledge.services.asking import (
    AskDenied,
    AskEvent,
    AskInvalid,
    AskRefused,
    DoneEvent,
    ErrorEvent,
    TokenEvent,
    ask_request_from_json,
    ask_stream,
    check_flag,
    workspace_for_asking,
)
from knowledge.services.ratelimits import RateLimited, rate_limit_check

_ERROR_STATUS = {"model": 502, "internal": 500}


def _error(status: int, message: str) -> JsonResponse:
    response = JsonResponse({"error": message}, status=status)
    if status == 401:
        response["WWW-Authenticate"] = CHALLENGE
    return response


def _refused(bearer: Bearer) -> JsonResponse:
    response = _error(bearer.status, bearer.error)
    if bearer.retry_after is not None:
        response["Retry-After"] = str(bearer.retry_after)
    return response


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
        return (bearer.user, None) if bearer.user is not None else (None, _refused(bearer))
    user = await request.auser()
    if not user.is_authenticated:
        return None, _error(401, "Log in, or send an API token as 'Authorization: Bearer <token>'.")
    reason = _csrf_failure(request)
    if reason:
        return None, _error(403, f"CSRF check failed ({reason}). Send the X-CSRFToken header, or use an API token.")
    try:
        await sync_to_async(rate_limit_check)(limit="RATE_LIMIT_API", user=user)
    except RateLimited as limited:
        return None, _refused(Bearer(error=str(limited), status=429, retry_after=limited.retry_after))
    return user, None


def _line(event: dict) -> bytes:
    return (json.dumps(event, ensure_ascii=False) + "\n").encode()


async def _ndjson(first: dict, events: AsyncIterator[AskEvent]) -> AsyncIterator[bytes]:
    yield _line({"type": "retrieval", **first})
    async with aclosing(events):
        async for event in events:
            if isinstance(event, TokenEvent):
                yield _line({"type": "token", "text": event.text})
            elif isinstance(event, ErrorEvent):
                yield _line({"type": "error", "message": event.message})
            elif isinstance(event, DoneEvent):
                done = {"type": "done", "answer": event.answer, "citations": event.citations}
                yield _line({**done, "usage": asdict(event.usage)})


@csrf_exempt
@require_POST
async def query(request, slug: str):
    user, denied = await _authenticate(request)
    if denied is not None:
        return denied
    try:
        body = json.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError):
        body = None
    if not isinstance(body, dict):
        return _error(400, 'The body must be a JSON object, e.g. {"question": "...", "mode": "mix"}.')
    try:
        ask = ask_request_from_json(body, also=("stream",))
        stream = check_flag("stream", body.get("stream"))
        workspace = await sync_to_async(workspace_for_asking)(user=user, slug=slug, mode=ask.mode)
    except AskInvalid as invalid:
        return _error(400, str(invalid))
    except AskDenied as not_member:
        return _error(404, str(not_member))
    except AskRefused as refusal:
        return _error(409, str(refusal))
    events = ask_stream(workspace=workspace, request=ask)
    # The retrieval, or why there is none: a failure before any answer is a plain error response.
    retrieval = await anext(events)
    if isinstance(retrieval, ErrorEvent):
        await events.aclose()
        return _error(_ERROR_STATUS[retrieval.reason], retrieval.message)
    first = {**retrieval.result.to_json(include_context=ask.context_only), "answer_engine": retrieval.engine}
    if stream:
        response = StreamingHttpResponse(_ndjson(first, events), content_type="application/x-ndjson")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"
        return response
    async with aclosing(events):
        async for last in events:
            if isinstance(last, ErrorEvent):
                return _error(_ERROR_STATUS[last.reason], last.message)
    # Short of an error, a stream ends with its DoneEvent.
    return JsonResponse({"answer": last.answer, **first, "citations": last.citations, "usage": asdict(last.usage)})
