"""What every HTTP door of the API shares, written once: the JSON body, a refusal in the door's
own error shape (with WWW-Authenticate and Retry-After where they belong), the token check, and
the start of an answer, sent whole or streamed.

A door (the HTTP API, the OpenAI- and Ollama-compatible APIs) is a `Door`: the shape of its
error bodies. Everything else about asking is the ask service's (knowledge/services/asking.py).
"""

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

from asgiref.sync import sync_to_async
from django.http import JsonResponse, StreamingHttpResponse

from knowledge.api.auth import CHALLENGE, Bearer, abearer_user
from knowledge.models import Answer, Feedback, Workspace
from knowledge.services.answers import FeedbackInvalid, feedback_give
from knowledge.services.asking import (
    AskDenied,
    Asker,
    AskError,
    AskEvent,
    AskInvalid,
    AskLimited,
    AskRefused,
    AskRequest,
    DoneEvent,
    ErrorEvent,
    RetrievalEvent,
    ask_stream,
    workspace_for_asking,
)

# An ask that cannot start, by kind, and an answer that failed, by ErrorEvent.reason.
ASK_ERROR_STATUS = {AskInvalid: 400, AskDenied: 404, AskRefused: 409, AskLimited: 429}
ANSWER_ERROR_STATUS = {"model": 502, "internal": 500}


@dataclass(frozen=True)
class Door:
    """One protocol's error body: `body(status, message, code)`; `code` is a machine-readable
    reason where the protocol has one (OpenAI's `code`), else ignored."""

    body: Callable[[int, str, str | None], dict]

    def error(self, status: int, message: str, *, code: str | None = None, retry_after: int | None = None):
        response = JsonResponse(self.body(status, message, code), status=status)
        if status == 401:
            response["WWW-Authenticate"] = CHALLENGE
        if retry_after is not None:
            response["Retry-After"] = str(retry_after)
        return response

    def refused(self, bearer: Bearer, *, codes: dict[int, str] | None = None) -> JsonResponse:
        return self.error(
            bearer.status, bearer.error, code=(codes or {}).get(bearer.status), retry_after=bearer.retry_after
        )

    async def token_user(self, request, *, scope: str, codes: dict[int, str] | None = None):
        """(user, None) for a live token whose scope allows `scope`, within its limits, or (None,
        the refusal to send)."""
        bearer = await abearer_user(
            request.headers.get("Authorization", ""), scope=scope, ip=request.META.get("REMOTE_ADDR")
        )
        return (bearer.user, None) if bearer.user is not None else (None, self.refused(bearer, codes=codes))

    def ask_refused(self, refusal: AskError, *, code: str | None = None) -> JsonResponse:
        """A question the gate refused, with Retry-After when the asker's question limit is spent."""
        return self.error(
            ask_error_status(refusal), str(refusal), code=code, retry_after=getattr(refusal, "retry_after", None)
        )


def json_body(request) -> dict | None:
    """The request's JSON object, or None when the body is not one."""
    try:
        body = json.loads(request.body or b"")
    except (ValueError, UnicodeDecodeError):
        return None
    return body if isinstance(body, dict) else None


def ask_error_status(error: AskError) -> int:
    return next(status for kind, status in ASK_ERROR_STATUS.items() if isinstance(error, kind))


async def gate(*, user, slug: str, request: AskRequest) -> Workspace:
    """workspace_for_asking from an async door; raises AskDenied, AskRefused or AskLimited."""
    return await sync_to_async(workspace_for_asking)(user=user, slug=slug, mode=request.mode)


@dataclass
class Started:
    """An answer under way: what was retrieved, and the rest of the stream."""

    workspace: Workspace
    retrieval: RetrievalEvent
    events: AsyncIterator[AskEvent]


async def start_answer(*, workspace: Workspace, request: AskRequest, asker: Asker) -> Started | ErrorEvent:
    """Retrieve: the answer under way, or why it failed before anything was answered (a door
    then sends a plain error response, never a stream that fails at once). The question is
    recorded for `asker`, and the RetrievalEvent carries the answer's id for the client."""
    events = ask_stream(workspace=workspace, request=request, asker=asker)
    first = await anext(events)
    if isinstance(first, ErrorEvent):
        await events.aclose()
        return first
    return Started(workspace=workspace, retrieval=first, events=events)


async def last_event(events: AsyncIterator[AskEvent]) -> DoneEvent | ErrorEvent:
    """The rest of a stream drained: its DoneEvent, or the ErrorEvent that ended it."""
    async with aclosing(events):
        async for last in events:
            if isinstance(last, ErrorEvent):
                return last
    # Short of an error, a stream ends with its DoneEvent.
    return last


def streaming(chunks: AsyncIterator[bytes], *, content_type: str) -> StreamingHttpResponse:
    """A stream that proxies pass through as it is written (no buffering, no caching)."""
    response = StreamingHttpResponse(chunks, content_type=content_type)
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"
    return response


def ndjson_line(data: dict) -> bytes:
    return (json.dumps(data, ensure_ascii=False) + "\n").encode()


FEEDBACK_FIELDS = ("rating", "comment")


def feedback_from_json(*, answer: Answer, user, body: dict) -> Feedback:
    """Feedback as the APIs take it ({"rating", "comment"}); anything else is refused by name."""
    unknown = sorted(set(body) - set(FEEDBACK_FIELDS))
    if unknown:
        raise FeedbackInvalid(f"Unknown field '{unknown[0]}'. Accepted fields: {', '.join(FEEDBACK_FIELDS)}.")
    return feedback_give(answer=answer, user=user, rating=body.get("rating"), comment=body.get("comment"))


def feedback_json(feedback: Feedback) -> dict:
    return {
        "answer_id": str(feedback.answer.uuid),
        "rating": "up" if feedback.rating == Feedback.Rating.UP else "down",
        "comment": feedback.comment,
    }
