"""Sources: documents that live in a folder, on a site or in a git repository, kept in sync.

A sync lists what the source holds (fetchers.py), adds new files as documents tagged with the
source's tags, makes a new version of each changed one (knowledge.services.ingestion.versions),
and removes documents whose file is gone once the source's grace period has passed. A source
that cannot be read keeps every document and says why on its page.

Schedule: the beat's `sync_due_sources` (every SOURCES_CHECK_SECONDS) claims the due sources
with a conditional UPDATE and queues one sync each; a claim lasts SOURCES_SYNC_LEASE_SECONDS,
so a worker that dies mid-sync delays the next one, never stops it
(docs/decisions/0131-sources-on-the-existing-beat.md).
"""

import hashlib
import logging
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from knowledge.models import Document, Source, Workspace
from knowledge.services import ingestion
from knowledge.services.ingestion import versions
from knowledge.services.sources.fetchers import SourceError, allowed_path, listing
from knowledge.services.workspaces import audit_record

logger = logging.getLogger(__name__)

SYNC_TASK = "knowledge.tasks.sync_source"
COUNTS = ("added", "updated", "unchanged", "waiting", "missing", "removed", "failed")

__all__ = [
    "SourceError",
    "source_create",
    "source_delete",
    "source_sync",
    "source_sync_request",
    "sources_claim_due",
]


def _check_location(kind: str, location: str) -> None:
    """SourceError for a location the server may not read; nothing is fetched here."""
    if kind == Source.Kind.FOLDER or (kind == Source.Kind.GIT and not location.startswith("https://")):
        allowed_path(location)
    elif kind == Source.Kind.WEB:
        for line in location.splitlines():
            if line.strip() and not line.strip().startswith(("http://", "https://")):
                raise SourceError(f"{line.strip()} is not an http or https URL.")


def source_create(
    *,
    workspace: Workspace,
    actor,
    name: str,
    kind: str,
    location: str,
    branch: str = "",
    tags: list[str] | None = None,
    interval_minutes: int = 60,
    grace_hours: int = 24,
) -> Source:
    """Add a source; its first sync is due at once. SourceError for a location it may not read."""
    location = location.strip()
    _check_location(kind, location)
    with transaction.atomic():
        source = Source.objects.create(
            workspace=workspace,
            name=name,
            kind=kind,
            location=location,
            branch=branch,
            tags=tags or [],
            interval_minutes=interval_minutes,
            grace_hours=grace_hours,
            created_by=actor if actor is not None and actor.is_authenticated else None,
        )
        audit_record(
            workspace=workspace,
            actor=actor,
            action="source.create",
            summary=f"Added the source “{name}”",
            detail={"source_id": source.pk, "kind": kind},
        )
    return source


def source_delete(*, source: Source, actor) -> None:
    """Stop syncing: the source goes, the documents it brought stay (as uploaded ones)."""
    with transaction.atomic():
        audit_record(
            workspace=source.workspace,
            actor=actor,
            action="source.delete",
            summary=f"Removed the source “{source.name}”; its documents stay",
            detail={"source_id": source.pk},
        )
        source.delete()


def _claimable(now) -> Q:
    return Q(enabled=True) & (Q(sync_until__isnull=True) | Q(sync_until__lt=now))


def _claim(queryset) -> list[int]:
    """Hold these sources for one sync each; the ids held (others are syncing already)."""
    now = timezone.now()
    with transaction.atomic():
        ids = list(queryset.filter(_claimable(now)).select_for_update(skip_locked=True).values_list("pk", flat=True))
        Source.objects.filter(pk__in=ids).update(
            sync_until=now + timedelta(seconds=settings.SOURCES_SYNC_LEASE_SECONDS)
        )
    return ids


def _queue(ids: list[int]) -> None:
    for pk in ids:
        current_app.send_task(SYNC_TASK, args=[pk])


def sources_claim_due() -> list[int]:
    """The beat's turn: claim every due source and queue its sync; the ids queued."""
    ids = _claim(Source.objects.filter(next_sync_at__lte=timezone.now()))
    _queue(ids)
    return ids


def source_sync_request(*, source: Source) -> bool:
    """ "Sync now": False when a sync of it is already running."""
    ids = _claim(Source.objects.filter(pk=source.pk))
    _queue(ids)
    return bool(ids)


def source_sync(*, source_id: int) -> Source | None:
    """Sync a claimed source (the task's work; tests call it directly)."""
    source = Source.objects.select_related("workspace").filter(pk=source_id).first()
    if source is None:
        return None
    now = timezone.now()
    counts = dict.fromkeys(COUNTS, 0)
    # Each file's newest version: a new one is current beside the old until it is published.
    current = Document.objects.current().filter(source=source).order_by("version").defer("text", "structure")
    documents = {document.source_key: document for document in current}
    try:
        found = listing(source, {key: document.source_fingerprint for key, document in documents.items()})
    except SourceError as err:
        logger.warning("source %s (%s) failed: %s", source.pk, source.name, err)
        _finish(source, now, error=str(err), counts=source.counts, state=source.state, success=False)
        return source
    problems = list(found.problems)
    seen = set(found.kept)
    for item in found.items:
        seen.add(item.key)
        outcome = _sync_item(source, item, documents.get(item.key), problems)
        counts[outcome] += 1
    for key, document in documents.items():
        if key not in seen:
            counts[_gone(source, document, now)] += 1
    _finish(source, now, error="\n".join(problems[:50]), counts=counts, state=found.state, success=True)
    return source


def _sync_item(source: Source, item, document: Document | None, problems: list[str]) -> str:
    if document is not None and document.source_missing_since is not None:
        Document.objects.filter(pk=document.pk).update(source_missing_since=None)
    if document is not None and (item.unchanged or item.fingerprint == document.source_fingerprint):
        return "unchanged"
    try:
        data = item.data if item.data is not None else item.read()
    except OSError as err:
        problems.append(f"{item.key}: {err.strerror or err.__class__.__name__}.")
        return "failed"
    if document is not None and hashlib.sha256(data).hexdigest() == document.file_hash:
        Document.objects.filter(pk=document.pk).update(source_fingerprint=item.fingerprint)
        return "unchanged"
    if document is not None and versions.replace_problem(document=document):
        # Still being read (or a version failed): the next sync tries again.
        return "waiting"
    try:
        created = ingestion.document_create(
            workspace=source.workspace,
            filename=item.filename,
            data=data,
            title=f"{source.name}: {item.key}"[:300],
            replace=document,
            match_title=False,
            tags=list(source.tags),
        )
    except ingestion.DocumentRejected as err:
        problems.append(f"{item.key}: {err}")
        return "failed"
    Document.objects.filter(pk=created.pk).update(
        source=source, source_key=item.key, source_fingerprint=item.fingerprint
    )
    return "added" if document is None else "updated"


def _gone(source: Source, document: Document, now) -> str:
    """A document whose file the source no longer has: marked, and removed after the grace period."""
    if document.source_missing_since is None:
        Document.objects.filter(pk=document.pk).update(source_missing_since=now)
        return "missing"
    if document.source_missing_since + timedelta(hours=source.grace_hours) > now:
        return "missing"
    ingestion.document_delete(document=document, rebuild_now=False)
    return "removed"


def _finish(source: Source, now, *, error: str, counts: dict, state: dict, success: bool) -> None:
    changes = {
        "last_sync_at": now,
        "last_error": error,
        "counts": counts,
        "state": state or source.state,
        "sync_until": None,
        "next_sync_at": now + timedelta(minutes=source.interval_minutes),
    }
    if success:
        changes["last_success_at"] = now
    Source.objects.filter(pk=source.pk).update(**changes)
    for name, value in changes.items():
        setattr(source, name, value)
