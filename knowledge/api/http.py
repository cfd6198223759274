"""The HTTP API, adapters over the ask and ingestion services:

- POST /api/workspaces/<slug>/query asks (scope "ask"); .../answers/<id>/feedback rates an answer.
- GET /api/workspaces/<slug>/documents lists the documents (scope "read"); POST uploads files or
  text and DELETE .../documents/<id> deletes one (scope "write", and the editor role), as the
  upload page and the document list do: the same services, upload limit, rate limit and audit.

Authenticated by the session (with its CSRF check) or by `Authorization: Bearer <token>` (a live
token whose scope allows what the endpoint does); the caller must be a member of the workspace
with the role the browser asks for. Requests are rate limited per token, or per user for a
session (RATE_LIMIT_API). Errors are JSON: {"error": "..."}.
"""

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import asdict

from asgiref.sync import sync_to_async
from django.http import Http404, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from knowledge.api.auth import Bearer, abearer_user
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
from knowledge.models import Answer, Document, Role
from knowledge.selectors import answer_for_user, documents_browse, workspace_for_user
from knowledge.services import ingestion
from knowledge.services.answers import FeedbackInvalid
from knowledge.services.api_tokens import SCOPE_ASK, SCOPE_READ, SCOPE_WRITE
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


async def _authenticate(request, scope: str):
    """(user, None) or (None, an error response). A token needs no CSRF token and a scope that
    allows `scope`; a session needs the CSRF token (its user's role decides, as in the browser).
    Either way the request counts against the caller's API rate limit."""
    header = request.headers.get("Authorization", "")
    if header:
        bearer = await abearer_user(header, scope=scope, ip=request.META.get("REMOTE_ADDR"))
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
    user, denied = await _authenticate(request, SCOPE_ASK)
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
        return DOOR.ask_refused(refusal)
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
    user, denied = await _authenticate(request, SCOPE_ASK)
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


# --- Documents -------------------------------------------------------------------------------

NOT_A_MEMBER = "No such workspace, or you are not a member of it."
UPLOAD_HELP = (
    'Send files as multipart/form-data in the field \'file\' (one or more), or JSON {"text": "...", "title": "..."}.'
)


def document_json(document: Document) -> dict:
    return {
        "id": document.pk,
        "title": document.title,
        "filename": document.original_filename,
        "status": document.status,
        "stage": document.stage,
        "error": document.error,
        "chunks": document.chunk_count,
        "entities": document.entity_count,
        "relations": document.relation_count,
        "created_at": document.created_at.isoformat(),
        "processed_at": document.processed_at.isoformat() if document.processed_at else None,
    }


def _workspace(user, slug: str, role: str):
    try:
        return workspace_for_user(user, slug, role)
    except Http404:
        return None


def _created(name: str, create) -> dict:
    try:
        document = create()
    except ingestion.DocumentRejected as err:
        return {"name": name, "error": str(err)}
    return {"name": name, "document": document_json(document)}


def _upload(request, workspace, user) -> JsonResponse:
    """What the upload page does for each file and for pasted text, refusals per file."""
    files = request.FILES.getlist("file")
    body = None if files else json_body(request)
    text = body.get("text") if body is not None else None
    if not files and not (isinstance(text, str) and text.strip()):
        return DOOR.error(400, UPLOAD_HELP)
    try:
        rate_limit_check(limit="RATE_LIMIT_UPLOAD", user=user, count=len(files) or 1)
    except RateLimited as limited:
        return DOOR.refused(Bearer(error=str(limited), status=429, retry_after=limited.retry_after))
    results = []
    for uploaded in files:
        try:
            # Checked before reading, so an oversized file is never read, parsed or stored.
            ingestion.check_upload_size(uploaded.name, uploaded.size)
        except ingestion.DocumentRejected as err:
            results.append({"name": uploaded.name, "error": str(err)})
            continue
        results.append(
            _created(
                uploaded.name,
                lambda uploaded=uploaded: ingestion.document_create(
                    workspace=workspace, user=user, filename=uploaded.name, data=uploaded.read()
                ),
            )
        )
    if not files:
        title = body.get("title") if isinstance(body.get("title"), str) and body["title"].strip() else None
        results.append(
            _created(
                title or "Pasted text",
                lambda: ingestion.document_create(
                    workspace=workspace, user=user, filename=title or "Pasted text", text=text, title=title
                ),
            )
        )
    created = any("document" in result for result in results)
    return JsonResponse({"results": results}, status=201 if created else 400)


@csrf_exempt
@require_http_methods(["GET", "POST"])
async def documents(request, slug: str):
    """GET: the workspace's documents, newest first (?status= to filter). POST: upload."""
    writing = request.method == "POST"
    user, denied = await _authenticate(request, SCOPE_WRITE if writing else SCOPE_READ)
    if denied is not None:
        return denied
    workspace = await sync_to_async(_workspace)(user, slug, Role.EDITOR if writing else Role.VIEWER)
    if workspace is None:
        return DOOR.error(404, NOT_A_MEMBER if not writing else f"{NOT_A_MEMBER} Uploading needs the editor role.")
    if writing:
        return await sync_to_async(_upload)(request, workspace, user)

    def read():
        rows = documents_browse(workspace=workspace, status=request.GET.get("status", ""))
        return [document_json(document) for document in rows.order_by("-created_at", "-pk")]

    return JsonResponse({"documents": await sync_to_async(read)()})


@csrf_exempt
@require_http_methods(["DELETE"])
async def document(request, slug: str, pk: int):
    """Delete a document and what the graph learned only from it, as the document list does."""
    user, denied = await _authenticate(request, SCOPE_WRITE)
    if denied is not None:
        return denied

    def delete():
        workspace = _workspace(user, slug, Role.EDITOR)
        if workspace is None:
            return DOOR.error(404, f"{NOT_A_MEMBER} Deleting needs the editor role.")
        found = workspace.documents.defer("text").filter(pk=pk).first()
        if found is None:
            return DOOR.error(404, "No such document in this workspace.")
        ingestion.document_delete(document=found, actor=user, rebuild_now=False)
        return JsonResponse({"deleted": document_json(found)})

    return await sync_to_async(delete)()
