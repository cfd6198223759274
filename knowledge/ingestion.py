"""Documents and their ingestion: create, ingest (parse, chunk, embed, extract, merge, rebuild),
retry, fail and delete. Views, the Celery task and the `ingest` command call these services.

The Celery task that runs `document_ingest` is named here rather than imported, so this module
and knowledge.tasks (which imports it) do not import each other.
"""

import hashlib
import logging
import os
from collections.abc import Callable
from datetime import timedelta

from celery import current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import default_storage
from django.db import DatabaseError, IntegrityError, InterfaceError, OperationalError, transaction
from django.db.models import F, Q
from django.utils import timezone

from knowledge import chunking, events, extraction, graph, llm, parsing
from knowledge.models import Chunk, Document, Entity, EntitySource, Relation, RelationSource, Workspace
from knowledge.services import audit_record, workspace_refresh_counts
from knowledge.tokens import count_tokens

logger = logging.getLogger(__name__)

INGEST_TASK = "knowledge.tasks.ingest_document"


def enqueue_ingestion(document_id: int) -> None:
    """Queue the ingestion task once the current transaction commits."""
    transaction.on_commit(lambda: current_app.send_task(INGEST_TASK, args=[document_id]))


class DocumentRejected(Exception):
    """An upload refused before anything was stored; `str(err)` is shown to the user as is."""


class IngestInterrupted(Exception):
    """Ingestion stopped on a transient error; the document is pending again and may be retried."""


def _title_for(filename: str, text: str, title: str | None, pasted: bool) -> str:
    if title and title.strip():
        return title.strip()[:300]
    if pasted:
        first_line = next((line.strip() for line in text.splitlines() if line.strip()), "Pasted text")
        return first_line[:80]
    return (os.path.splitext(os.path.basename(filename))[0] or filename)[:300]


def document_create(
    *,
    workspace: Workspace,
    user=None,
    filename: str,
    data: bytes | None = None,
    text: str | None = None,
    title: str | None = None,
    enqueue: bool = True,
) -> Document:
    """Parse an upload (or pasted `text`), refuse what cannot be ingested, store it pending and queue it.

    Refusals raise DocumentRejected and store nothing. `enqueue=False` is for callers that
    run `document_ingest` themselves (the `ingest` command).
    """
    pasted = text is not None
    try:
        if pasted:
            content = parsing.clean_text(text)
        else:
            if data is not None and len(data) > settings.UPLOAD_MAX_MB * 2**20:
                raise parsing.ParseError(f"{filename} is larger than the {settings.UPLOAD_MAX_MB} MB upload limit.")
            content = parsing.parse_file(filename, data or b"")
    except parsing.ParseError as err:
        raise DocumentRejected(str(err)) from err
    if not content:
        raise DocumentRejected(
            f"No text found in {filename}. A scanned PDF needs text recognition (OCR) before it can be uploaded."
            if filename.lower().endswith(".pdf")
            else f"No text found in {filename}."
        )
    content_hash = hashlib.sha256(content.encode()).hexdigest()
    duplicate = Document.objects.filter(workspace=workspace, content_hash=content_hash).only("title").first()
    if duplicate is not None:
        raise DocumentRejected(f"{filename} has the same text as “{duplicate.title}”, already in this workspace.")
    document = Document(
        workspace=workspace,
        title=_title_for(filename, content, title, pasted),
        original_filename="" if pasted else os.path.basename(filename)[:300],
        text=content,
        content_hash=content_hash,
        created_by=user if user is not None and user.is_authenticated else None,
    )
    try:
        with transaction.atomic():
            if not pasted:
                document.source_file.save(os.path.basename(filename), ContentFile(data), save=False)
            document.save()
            if enqueue:
                enqueue_ingestion(document.pk)
    except IntegrityError as err:
        # The same text arrived twice at once: the unique constraint decides, the loser's file goes.
        if document.source_file:
            document.source_file.delete(save=False)
        raise DocumentRejected(f"{filename} has the same text as a document just added to this workspace.") from err
    events.publish_document_progress(document)
    return document


def document_retry(*, document: Document) -> bool:
    """Queue a failed document again (also one stuck in processing past the stale window)."""
    stuck = Q(status=Document.Status.PROCESSING, updated_at__lt=timezone.now() - ingest_stale_after())
    with transaction.atomic():
        requeued = (
            Document.objects.filter(pk=document.pk)
            .filter(Q(status=Document.Status.FAILED) | stuck)
            .update(status=Document.Status.PENDING, error="", updated_at=timezone.now())
        )
        if requeued:
            enqueue_ingestion(document.pk)
            events.publish_document_progress(Document.objects.get(pk=document.pk))
    return bool(requeued)


def document_delete(*, document: Document, actor=None) -> None:
    """Delete a document and exactly what it contributed; rebuild what other documents still support.

    Entities and relations left without provenance go in the same transaction as the
    document; the survivors' descriptions, types, weights and vectors are then rebuilt from
    their remaining provenance (no extraction calls; a summary falls back to fragments if
    the model is down).
    """
    workspace_id = document.workspace_id
    entity_ids = set(
        EntitySource.objects.filter(chunk__document=document).values_list("entity_id", flat=True).distinct()
    )
    relation_ids = set(
        RelationSource.objects.filter(chunk__document=document).values_list("relation_id", flat=True).distinct()
    )
    files = [document.source_file.name] if document.source_file else []
    with transaction.atomic():
        keys = Entity.objects.filter(pk__in=entity_ids).values_list("key", flat=True)
        graph.lock_entity_keys(workspace_id=workspace_id, keys=keys)
        graph.lock_relations(relation_ids=relation_ids)
        Document.objects.filter(pk=document.pk).delete()
        Relation.objects.filter(pk__in=relation_ids, sources__isnull=True).delete()
        Entity.objects.filter(pk__in=entity_ids, sources__isnull=True).delete()
        audit_record(
            workspace=document.workspace,
            actor=actor,
            action="document.delete",
            summary=f"Deleted document “{document.title}”",
            detail={"document_id": document.pk, "title": document.title, "chunks": document.chunk_count},
        )
        transaction.on_commit(lambda: [default_storage.delete(name) for name in files])
    graph.rebuild_entities(entity_ids=entity_ids, fallback=True)
    graph.rebuild_relations(relation_ids=relation_ids, fallback=True)
    workspace_refresh_counts(workspace_id=workspace_id)


def ingest_stale_after() -> timedelta:
    """How long a processing document may go without a heartbeat before another run may take it over.

    Every batch of chunks updates `updated_at`; a batch waits at most for its model calls
    with all their retries, so twice that (at least 15 minutes) means the worker is gone.
    """
    per_call = settings.LLM_TIMEOUT * (settings.LLM_MAX_RETRIES + 1) + 60 * settings.LLM_MAX_RETRIES
    return timedelta(seconds=max(900, 2 * 2 * per_call))


def _claim(document_id: int) -> bool:
    """pending -> processing in one conditional UPDATE; a stale processing document is taken over."""
    now = timezone.now()
    claimable = Q(status=Document.Status.PENDING) | Q(
        status=Document.Status.PROCESSING, updated_at__lt=now - ingest_stale_after()
    )
    return bool(
        Document.objects.filter(claimable, pk=document_id).update(
            status=Document.Status.PROCESSING, error="", updated_at=now
        )
    )


def _set_status(document_id: int, status: str, error: str) -> Document | None:
    fields = {"status": status, "error": error[:2000], "updated_at": timezone.now()}
    if status == Document.Status.PROCESSED:
        fields["processed_at"] = fields["updated_at"]
    Document.objects.filter(pk=document_id).update(**fields)
    document = Document.objects.filter(pk=document_id).first()
    if document is not None:
        events.publish_document_progress(document)
    return document


def document_fail(*, document_id: int, error: str) -> Document | None:
    """Give up on a document: failed, with a message a person can act on."""
    return _set_status(document_id, Document.Status.FAILED, error)


class _DocumentGone(Exception):
    pass


def document_ingest(*, document_id: int, progress: Callable[[Document], None] | None = None) -> Document | None:
    """Run the whole pipeline in this process: chunk, embed, extract, merge, rebuild.

    Claims the document first; returns None when there is nothing to claim (another worker
    has it, it is done, or it was deleted). Resumable: stored chunks, extractions and merged
    batches are kept, so a second run continues where the first stopped. A transient failure
    (model rate limit or outage, database connection) puts the document back to pending and
    raises IngestInterrupted; any other failure leaves it failed with the reason.
    """
    if not _claim(document_id):
        return None
    try:
        _ingest(document_id, progress or (lambda document: None))
    except _DocumentGone:
        return None
    except (llm.LLMError, OperationalError, InterfaceError) as err:
        if isinstance(err, llm.LLMError) and not err.transient:
            return document_fail(document_id=document_id, error=str(err))
        message = str(err) if isinstance(err, llm.LLMError) else f"The database connection failed: {err}"
        try:
            _set_status(document_id, Document.Status.PENDING, f"Interrupted, will retry: {message}")
        except DatabaseError:
            logger.warning("could not mark document %s pending again", document_id, exc_info=True)
        raise IngestInterrupted(message) from err
    except SoftTimeLimitExceeded:
        return document_fail(
            document_id=document_id,
            error="Ingestion took longer than CELERY_TASK_TIME_LIMIT allows. Retry it: it continues where it "
            "stopped; raise the limit for very large documents.",
        )
    except Exception as err:
        if not Document.objects.filter(pk=document_id).exists():
            return None
        logger.exception("ingestion of document %s failed", document_id)
        return document_fail(
            document_id=document_id,
            error=f"Ingestion failed unexpectedly ({err.__class__.__name__}: {err}). Retry it; "
            "if it fails again, report this message.",
        )
    return Document.objects.filter(pk=document_id).first()


def _step_done(document_id: int, progress, **increments) -> Document:
    """Add to the document's counters (and heartbeat); publish and report where it stands."""
    changes = {field: F(field) + value for field, value in increments.items()}
    if not Document.objects.filter(pk=document_id).update(updated_at=timezone.now(), **changes):
        raise _DocumentGone
    document = Document.objects.get(pk=document_id)
    events.publish_document_progress(document)
    progress(document)
    return document


def _chunks_of(document: Document) -> list[Chunk]:
    chunks = list(Chunk.objects.filter(document=document).only("pk", "order", "text").order_by("order"))
    if chunks:
        return chunks
    workspace = document.workspace
    spans = chunking.chunk_text(document.text, size=workspace.chunk_token_size, overlap=workspace.chunk_overlap_tokens)
    with transaction.atomic():
        chunks = Chunk.objects.bulk_create(
            [
                Chunk(
                    workspace=workspace,
                    document=document,
                    order=span.order,
                    text=span.text,
                    token_count=span.token_count,
                    char_start=span.char_start,
                    char_end=span.char_end,
                )
                for span in spans
            ],
            batch_size=500,
        )
        Document.objects.filter(pk=document.pk).update(
            chunk_count=len(chunks), token_count=count_tokens(document.text), updated_at=timezone.now()
        )
    return chunks


def _embed_chunks(document: Document) -> None:
    missing = list(
        Chunk.objects.filter(document=document, embedding__isnull=True).order_by("order").values_list("pk", "text")
    )
    for start in range(0, len(missing), CHUNK_EMBED_GROUP):
        group = missing[start : start + CHUNK_EMBED_GROUP]
        vectors = llm.embed([text for _, text in group], purpose="passage")
        graph.update_rows(Chunk, {pk: {"embedding": vector} for (pk, _), vector in zip(group, vectors, strict=True)})


CHUNK_EMBED_GROUP = 256


def _batch_size() -> int:
    # Enough chunks to keep every model slot busy; progress is published after each batch.
    return max(8, 2 * settings.LLM_MAX_CONCURRENCY) if llm.chat_model_configured() else 16


def _ingest(document_id: int, progress) -> None:
    document = Document.objects.select_related("workspace").get(pk=document_id)
    chunks = _chunks_of(document)
    _embed_chunks(document)
    document = _step_done(document_id, progress)
    size = _batch_size()
    todo = [chunk for chunk in chunks if chunk.order >= document.chunks_done]
    for start in range(0, len(todo), size):
        batch = todo[start : start + size]
        outcome = extraction.extract_chunks(chunks=batch, workspace=document.workspace)
        extracted = {chunk.pk: outcome.records[chunk.pk] for chunk in batch if chunk.pk in outcome.records}
        # chunks_done only moves past an unbroken run of merged chunks: a resume starts at the first gap.
        done = next((index for index, chunk in enumerate(batch) if chunk.pk not in extracted), len(batch))
        with transaction.atomic():
            graph.merge_chunks(workspace_id=document.workspace_id, records_by_chunk=extracted)
            document = _step_done(
                document_id,
                progress,
                chunks_done=done,
                prompt_tokens=outcome.usage.prompt_tokens,
                completion_tokens=outcome.usage.completion_tokens,
                llm_calls=outcome.usage.calls,
            )
        if outcome.errors:
            failed = len(batch) - len(extracted)
            error = outcome.errors[0]
            raise llm.LLMError(f"{failed} chunk(s) could not be extracted: {error}", transient=error.transient)
        if outcome.skipped_lines:
            logger.info("document %s: skipped %d malformed extraction lines", document_id, outcome.skipped_lines)
    _rebuild_document_graph(document, progress)


def _rebuild_document_graph(document: Document, progress) -> None:
    entity_ids = set(
        EntitySource.objects.filter(chunk__document=document).values_list("entity_id", flat=True).distinct()
    )
    relation_ids = set(
        RelationSource.objects.filter(chunk__document=document).values_list("relation_id", flat=True).distinct()
    )
    usage = llm.Usage()
    graph.rebuild_entities(entity_ids=entity_ids, usage=usage)
    graph.rebuild_relations(relation_ids=relation_ids, usage=usage)
    Document.objects.filter(pk=document.pk).update(entity_count=len(entity_ids), relation_count=len(relation_ids))
    _step_done(
        document.pk,
        progress,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        llm_calls=usage.calls,
    )
    workspace_refresh_counts(workspace_id=document.workspace_id)
    progress(_set_status(document.pk, Document.Status.PROCESSED, ""))
