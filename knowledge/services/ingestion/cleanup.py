"""When a document goes: a failed one's contributions are taken back, a deleted one goes with them.

Both remove provenance and the rows nothing else supports in one transaction, and record what
remains to rebuild as a GraphRebuild in the same transaction. The rebuild (descriptions from the
remaining provenance, summaries when a model is configured) runs afterwards and is retried by the
sweeper until it succeeds, so the graph converges even when the model was down at the time.
"""

import logging
from collections.abc import Iterable, Sequence
from datetime import timedelta

from celery import current_app
from django.conf import settings
from django.core.files.storage import default_storage
from django.db import transaction
from django.utils import timezone

from knowledge.models import (
    Document,
    Entity,
    EntitySource,
    GraphRebuild,
    PendingRow,
    PendingVector,
    Relation,
    RelationSource,
)
from knowledge.rag import graph, llm
from knowledge.services import events
from knowledge.services.workspaces import audit_record, workspace_refresh_counts

logger = logging.getLogger(__name__)

REBUILD_TASK = "knowledge.tasks.rebuild_graph"
Stage = Document.Stage


def _contributions(document_ids: Sequence[int]) -> tuple[set[int], set[int]]:
    entity_ids = EntitySource.objects.filter(chunk__document_id__in=document_ids).values_list("entity_id", flat=True)
    relation_ids = RelationSource.objects.filter(chunk__document_id__in=document_ids).values_list(
        "relation_id", flat=True
    )
    return set(entity_ids.distinct()), set(relation_ids.distinct())


def _lock(workspace_id: int, entity_ids: set[int], relation_ids: set[int]) -> None:
    keys = Entity.objects.filter(pk__in=entity_ids).values_list("key", flat=True)
    graph.lock_entity_keys(workspace_id=workspace_id, keys=keys)
    graph.lock_relations(relation_ids=relation_ids)


def _remove_orphans(entity_ids: set[int], relation_ids: set[int]) -> tuple[set[int], set[int]]:
    """Delete the rows left without provenance; the ids that remain."""
    gone_relations = set(
        Relation.objects.filter(pk__in=relation_ids, sources__isnull=True).values_list("pk", flat=True)
    )
    Relation.objects.filter(pk__in=gone_relations).delete()
    gone_entities = set(Entity.objects.filter(pk__in=entity_ids, sources__isnull=True).values_list("pk", flat=True))
    Entity.objects.filter(pk__in=gone_entities).delete()
    return entity_ids - gone_entities, relation_ids - gone_relations


def _record_rebuild(workspace_id: int, entity_ids: Iterable[int], relation_ids: Iterable[int], reason: str):
    entity_ids, relation_ids = sorted(entity_ids), sorted(relation_ids)
    if not entity_ids and not relation_ids:
        return None
    return GraphRebuild.objects.create(
        workspace_id=workspace_id, entity_ids=entity_ids, relation_ids=relation_ids, reason=reason[:300]
    )


def document_fail(*, document_id: int, error: str, detail: str = "") -> Document | None:
    """Give up on a document: failed, with a message a person can act on, and nothing of it in the graph.

    `error` is what every member reads; `detail` (endpoints, the provider's words) only owners.

    Its chunks, their vectors and its extraction records stay (unpublished), so a retry costs
    neither embeddings nor model calls for what was already done.
    """
    document = Document.objects.filter(pk=document_id).only("workspace_id", "stage", "title").first()
    if document is None:
        return None
    entity_ids, relation_ids = _contributions([document_id])
    with transaction.atomic():
        _lock(document.workspace_id, entity_ids, relation_ids)
        EntitySource.objects.filter(chunk__document_id=document_id).delete()
        RelationSource.objects.filter(chunk__document_id=document_id).delete()
        entity_ids, relation_ids = _remove_orphans(entity_ids, relation_ids)
        PendingVector.objects.filter(document_id=document_id).exclude(kind=PendingVector.Kind.CHUNK).delete()
        PendingRow.objects.filter(document_id=document_id).delete()
        merged_stage = document.stage in (Stage.EXTRACTING, Stage.BUILDING, Stage.PUBLISHING)
        Document.objects.filter(pk=document_id).update(
            status=Document.Status.FAILED,
            error=error[:2000],
            error_detail=detail[:2000],
            lease_owner="",
            lease_expires_at=None,
            attempts=0,
            updated_at=timezone.now(),
            **({"stage": Stage.EXTRACTING, "chunks_done": 0, "stage_done": 0} if merged_stage else {}),
        )
        rebuild = _record_rebuild(
            document.workspace_id, entity_ids, relation_ids, f"“{document.title}” failed, its contributions removed"
        )
    if rebuild is not None:
        graph_rebuild_run(rebuild_id=rebuild.pk)
    workspace_refresh_counts(workspace_id=document.workspace_id)
    failed = Document.objects.filter(pk=document_id).first()
    if failed is not None:
        events.publish_document_progress(failed)
    return failed


def documents_delete(*, documents: Sequence[Document], actor=None, rebuild_now: bool = True) -> int:
    """Delete documents of one workspace and exactly what they contributed, then rebuild the rest once.

    The rebuild runs in this process when `rebuild_now` (commands, tests), else in a worker; if
    the model or the embeddings are down it is retried until done. Returns how many were deleted.
    """
    documents = list(documents)
    if not documents:
        return 0
    workspaces = {document.workspace_id for document in documents}
    if len(workspaces) != 1:
        raise ValueError("documents_delete() takes documents of one workspace")
    workspace_id = workspaces.pop()
    ids = [document.pk for document in documents]
    entity_ids, relation_ids = _contributions(ids)
    # Older versions go with their current one (they cascade) and hold no provenance; their
    # stored files go too.
    files = [document.source_file.name for document in documents if document.source_file]
    files += (
        Document.objects.filter(superseded_by__in=ids).exclude(source_file="").values_list("source_file", flat=True)
    )
    with transaction.atomic():
        _lock(workspace_id, entity_ids, relation_ids)
        deleted = Document.objects.filter(pk__in=ids).delete()[1].get("knowledge.Document", 0)
        entity_ids, relation_ids = _remove_orphans(entity_ids, relation_ids)
        for document in documents:
            audit_record(
                workspace=document.workspace,
                actor=actor,
                action="document.delete",
                summary=f"Deleted document “{document.title}”",
                detail={"document_id": document.pk, "title": document.title, "chunks": document.chunk_count},
            )
        titles = ", ".join(f"“{document.title}”" for document in documents[:3])
        more = f" and {len(documents) - 3} more" if len(documents) > 3 else ""
        rebuild = _record_rebuild(workspace_id, entity_ids, relation_ids, f"deleting {titles}{more}")
        transaction.on_commit(lambda: [default_storage.delete(name) for name in files])
        for document in documents:
            events.publish_document_deleted(document)
        if rebuild is not None and not rebuild_now:
            transaction.on_commit(lambda: current_app.send_task(REBUILD_TASK, args=[rebuild.pk]))
    workspace_refresh_counts(workspace_id=workspace_id)
    if rebuild is not None and rebuild_now:
        graph_rebuild_run(rebuild_id=rebuild.pk)
    return deleted


def document_delete(*, document: Document, actor=None, rebuild_now: bool = True) -> None:
    documents_delete(documents=[document], actor=actor, rebuild_now=rebuild_now)


def graph_rebuild_run(*, rebuild_id: int) -> bool:
    """Rebuild the rows a GraphRebuild names from their provenance; True when done.

    On a model failure the rebuild stays recorded with the error and a backoff, and the sweeper
    queues it again (it never falls back to cruder descriptions: the graph must end up as if
    the document had never been there).
    """
    rebuild = GraphRebuild.objects.filter(pk=rebuild_id).first()
    if rebuild is None:
        return True
    try:
        graph.rebuild_entities(entity_ids=rebuild.entity_ids)
        graph.rebuild_relations(relation_ids=rebuild.relation_ids)
    except llm.LLMError as err:
        attempts = rebuild.attempts + 1
        delay = min(settings.INGEST_RETRY_BACKOFF * 2 ** (attempts - 1), 3600)
        GraphRebuild.objects.filter(pk=rebuild_id).update(
            attempts=attempts, error=str(err)[:2000], next_attempt_at=timezone.now() + timedelta(seconds=delay)
        )
        logger.warning("graph rebuild %s (%s) failed, retrying in %.0f s: %s", rebuild_id, rebuild.reason, delay, err)
        return False
    GraphRebuild.objects.filter(pk=rebuild_id).delete()
    workspace_refresh_counts(workspace_id=rebuild.workspace_id)
    return True
