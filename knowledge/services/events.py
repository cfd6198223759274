"""Channel-layer events: ingestion progress for everyone watching a workspace."""

import logging
import time

from channels.layers import get_channel_layer
from django.conf import settings
from django.db import transaction

from knowledge.rag.llm.background import background

logger = logging.getLogger(__name__)

# The seconds a stage has taken are kept under these names in Document.timings.
STAGE_TIMINGS = {
    "parsing": ("parse", "chunk"),
    "embedding": ("embed_chunks",),
    "extracting": ("extract", "merge"),
    "building": ("describe", "embed_graph"),
    "publishing": ("publish",),
}
STAGE_ORDER = ["queued", *STAGE_TIMINGS, "done"]
_REFERENCE_SECONDS = 60
_references: dict[int, tuple[float, dict | None]] = {}


def workspace_group(workspace_id: int) -> str:
    return f"workspace-{workspace_id}"


def workspace_pace(workspace_id: int) -> dict | None:
    """Seconds per token of each stage in the workspace's last processed document (cached a minute)."""
    cached = _references.get(workspace_id)
    if cached is not None and time.monotonic() - cached[0] < _REFERENCE_SECONDS:
        return cached[1]
    from knowledge.models import Document

    last = (
        Document.objects.filter(workspace_id=workspace_id, status=Document.Status.PROCESSED, token_count__gt=0)
        .exclude(timings={})
        .order_by("-processed_at")
        .values("timings", "token_count")
        .first()
    )
    rates = None
    if last is not None:
        rates = {
            stage: sum(last["timings"].get(name, 0.0) for name in names) / last["token_count"]
            for stage, names in STAGE_TIMINGS.items()
        }
    _references[workspace_id] = (time.monotonic(), rates)
    return rates


def seconds_left(document, reference: dict | None) -> int | None:
    """An estimate of the seconds the document still needs once its turn comes: each stage's
    remaining share of the document's tokens at that stage's pace so far in this document, or at
    the pace of the workspace's last processed document for stages not begun."""
    if document.status not in ("pending", "processing") or document.stage not in STAGE_ORDER:
        return None
    tokens = document.token_count
    if not tokens:
        return None
    current = STAGE_ORDER.index(document.stage)
    total = 0.0
    for index, (stage, names) in enumerate(STAGE_TIMINGS.items(), start=1):
        if index < current:
            continue
        spent = sum((document.timings or {}).get(name, 0.0) for name in names)
        share_done = document.stage_done / document.stage_total if index == current and document.stage_total else 0.0
        if share_done > 0:
            total += spent / share_done * (1 - share_done)
        elif reference is not None:
            total += reference[stage] * tokens
        else:
            return None
    return round(total)


# The documents whose remaining work is read to share the workers out; past this, the oldest are left out.
ACTIVE_MAX = 500


# Every step of every document announces its progress with a time left that counts the whole
# queue: read afresh each time, the queue cost a worker 12% of its CPU during a long ingestion
# (benchmarks/results/2026-11-28-scale-10m.md). A time left a few seconds old is as good: read
# every 2 s, the queue of HotpotQA's 994 short passages was still 1.8% of a worker's samples.
WAITING_TTL = 5.0
_waiting: tuple[float, dict[int, int]] = (float("-inf"), {})


def work_waiting() -> dict[int, int]:
    """Installation-wide (the workers are shared by every workspace): each document still to be
    processed, with the seconds of work it needs (seconds_left); those without an estimate are left
    out. Read at most every WAITING_TTL seconds per process."""
    global _waiting
    read_at, waiting = _waiting
    if time.monotonic() - read_at < WAITING_TTL:
        return waiting
    waiting = _work_waiting()
    _waiting = (time.monotonic(), waiting)
    return waiting


def _work_waiting() -> dict[int, int]:
    from knowledge.models import Document

    active = (
        Document.objects.filter(status__in=("pending", "processing"))
        .exclude(stage="done")
        .only("workspace_id", "status", "stage", "stage_done", "stage_total", "token_count", "timings")
        .order_by("next_attempt_at", "id")[:ACTIVE_MAX]
    )
    waiting = {}
    for document in active:
        seconds = seconds_left(document, workspace_pace(document.workspace_id))
        if seconds is not None:
            waiting[document.pk] = seconds
    return waiting


def shared_seconds_left(document_id: int, own: int, waiting: dict[int, int], workers: int) -> int:
    """When a document needing `own` seconds of work is done while the others share the workers.
    Runs take turns (a turn, then the back of the line), so the workers are shared out evenly: until
    this document is done, each other one gets as much work as this one, or its own if it needs less.
    Those seconds of everyone's are done `workers` at a time; one document never runs on two."""
    shared = own + sum(min(seconds, own) for other, seconds in waiting.items() if other != document_id)
    return max(own, round(shared / workers))


def _duration(seconds: int | None) -> str:
    if seconds is None:
        return ""
    if seconds < 90:
        return "about a minute left" if seconds > 30 else "less than a minute left"
    if seconds < 90 * 60:
        return f"about {round(seconds / 60)} min left"
    return f"about {seconds / 3600:.1f} h left"


def document_payload(document, *, reference: dict | None = None, waiting: dict[int, int] | None = None) -> dict:
    """The document's row as the list shows it. With `waiting` (work_waiting), its time left
    counts the work of the documents it shares the workers with."""
    eta = seconds_left(document, reference)
    if eta is not None and waiting:
        eta = shared_seconds_left(document.pk, eta, waiting, settings.INGEST_WORKERS)
    return {
        "id": document.pk,
        "title": document.title,
        "status": document.status,
        "stage": document.stage,
        "stage_label": _stage_label(document),
        "stage_done": document.stage_done,
        "stage_total": document.stage_total,
        "eta_seconds": eta,
        "eta_label": _duration(eta),
        "chunks_done": document.chunks_done,
        "chunk_count": document.chunk_count,
        "entity_count": document.entity_count,
        "relation_count": document.relation_count,
        "prompt_tokens": document.prompt_tokens,
        "completion_tokens": document.completion_tokens,
        "error": document.error,
        # Sent to every open list of the workspace; only an owner's socket renders it.
        "error_detail": document.error_detail,
        "retryable": document.retryable,
        "version": document.version,
        "tags": list(document.tags),
        "enabled": document.enabled,
    }


def _stage_label(document) -> str:
    # A claimed document is "processing" before its first step records one: it is being read.
    if document.status == "processing" and document.stage == "queued":
        return document.Stage.PARSING.label
    return document.get_stage_display()


def publish_document_progress(document) -> None:
    """Tell the workspace's group where this document stands, once the change is committed."""
    group = workspace_group(document.workspace_id)
    active = document.status in ("pending", "processing")
    reference = workspace_pace(document.workspace_id) if active else None
    waiting = work_waiting() if active else None
    event = {"type": "document.progress", "document": document_payload(document, reference=reference, waiting=waiting)}
    transaction.on_commit(lambda: _send(group, event))


def publish_document_deleted(document) -> None:
    """Drop the document's row from open document lists, once the deletion is committed."""
    group = workspace_group(document.workspace_id)
    event = {"type": "document.deleted", "document": {"id": document.pk}}
    transaction.on_commit(lambda: _send(group, event))


def publish_membership_changed(*, workspace_id: int, user_id: int | None = None) -> None:
    """Make the user's open workspace sockets (everyone's, for None) check their membership
    again, once the change is committed: a removed member's socket closes, a demoted one stops
    showing write actions."""
    event = {"type": "membership.changed", "user": user_id}
    group = workspace_group(workspace_id)
    transaction.on_commit(lambda: _send(group, event))


def _send(group: str, event: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        # Waited for, so one process's events reach the group in the order they were sent.
        background.run(layer.group_send(group, event), timeout=settings.CHANNEL_LAYER_SOCKET_TIMEOUT)
    except Exception:
        # Progress is a courtesy to whoever is watching; a Redis hiccup must not fail an ingestion.
        logger.warning("could not publish progress to %s", group, exc_info=True)
