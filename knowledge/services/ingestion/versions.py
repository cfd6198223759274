"""Versions of a document: a changed file becomes the next version of the document it replaces.

The new version is a document of its own, ingested by the usual run, with three differences
(docs/ingestion.md, "Versions"):

- parse: its chunks whose section and text are unchanged take the old chunks' extraction
  records and vectors (`reuse_unchanged`), so only changed and new chunks cost model calls and
  embeddings;
- build: the rows of both versions are described from the new version's provenance and every
  other document's, never the old version's, so the graph is rebuilt once for the whole change;
- publish: in the same transaction that publishes it, the old version is retired (`retire`):
  its provenance goes, rows only it supported go, its chunks lose their vectors, and it becomes
  history. Until then the old version is served and nothing of the new one is.
"""

from django.core.files.storage import default_storage
from django.db import connection, transaction
from django.utils import timezone

from knowledge.models import Chunk, Document, EntitySource, RelationSource, Workspace
from knowledge.services import events
from knowledge.services.ingestion.cleanup import _contributions, _lock, _remove_orphans
from knowledge.services.workspaces import audit_record, workspace_refresh_counts


def replaced_by_upload(*, workspace: Workspace, title: str) -> Document | None:
    """The current document an upload titled `title` is a new version of, if any."""
    return Document.objects.current().filter(workspace=workspace, title=title[:300]).order_by("version", "pk").first()


class VersionRefused(Exception):
    """A version change that cannot happen now; `str(err)` is shown as is."""


def replace_problem(*, document: Document) -> str:
    """Why `document` may not get a new version now ("" when it may): it must be the published
    current version with no other version in flight (or failed: retry or delete that one first)."""
    if document.superseded_by_id is not None:
        return f"“{document.title}” version {document.version} is not the current version."
    if document.status != Document.Status.PROCESSED:
        return f"“{document.title}” is still being read; upload the new version once it is done."
    pending = Document.objects.current().filter(replaces=document).only("version", "status").first()
    if pending is None:
        return ""
    state = "failed: retry or delete it first" if pending.status == Document.Status.FAILED else "being read"
    return f"version {pending.version} of “{document.title}” is {state}."


def next_version_fields(document: Document) -> dict:
    """What a new version of `document` inherits."""
    return {
        "replaces": document,
        "version": document.version + 1,
        "tags": list(document.tags),
        "enabled": document.enabled,
    }


_REUSE_SQL = """
WITH pairs AS (
    SELECT DISTINCT ON (n.id) n.id AS new_id, o.id AS old_id
    FROM knowledge_chunk n
    JOIN knowledge_chunk o ON o.document_id = %(old)s AND o.section = n.section AND o.text = n.text
    WHERE n.document_id = %(new)s
    ORDER BY n.id, o.id
), extractions AS (
    INSERT INTO knowledge_chunkextraction
        (chunk_id, engine, records, skipped_lines, prompt_tokens, completion_tokens, llm_calls, created_at)
    SELECT p.new_id, e.engine, e.records, e.skipped_lines, 0, 0, 0, now()
    FROM pairs p JOIN knowledge_chunkextraction e ON e.chunk_id = p.old_id AND e.engine = %(engine)s
    ON CONFLICT (chunk_id) DO NOTHING
)
SELECT p.new_id, p.old_id FROM pairs p JOIN knowledge_chunk o ON o.id = p.old_id WHERE o.embedding IS NOT NULL
"""

_STAGE_REUSED_SQL = """
INSERT INTO knowledge_pendingvector (document_id, kind, row_id, text_hash, embedding)
SELECT %s, 'chunk', u.new_id, u.hash, o.embedding
FROM unnest(%s::bigint[], %s::bigint[], %s::text[]) AS u(new_id, old_id, hash)
JOIN knowledge_chunk o ON o.id = u.old_id
ON CONFLICT (document_id, kind, row_id) DO NOTHING
"""


def reuse_unchanged(*, document: Document, engine: str, text_hash) -> int:
    """Inside the parse step's transaction: give the new version's unchanged chunks (same section
    and text) the old chunks' extraction records (made by `engine`) and vectors; how many chunks
    were reused. `text_hash(chunk)` is the hash the embed step stages vectors under."""
    with connection.cursor() as cursor:
        cursor.execute(_REUSE_SQL, {"old": document.replaces_id, "new": document.pk, "engine": engine})
        pairs = dict(cursor.fetchall())
        if not pairs:
            return 0
        chunks = Chunk.objects.filter(pk__in=list(pairs)).only("pk", "section", "text")
        hashes = {chunk.pk: text_hash(chunk) for chunk in chunks}
        new_ids = list(pairs)
        cursor.execute(
            _STAGE_REUSED_SQL,
            [document.pk, new_ids, [pairs[pk] for pk in new_ids], [hashes[pk] for pk in new_ids]],
        )
    return len(pairs)


def retire(*, document: Document) -> None:
    """Inside the publishing transaction of `document`: the version it replaces becomes history.

    Its provenance and the rows only it supported go (the build described every other row
    without it already), its chunks lose their vectors so nothing serves them, and it and the
    versions before it point at `document`. Its text and chunks stay for the history and for the
    citations that point at them.
    """
    old_id = document.replaces_id
    if old_id is None:
        return
    old = Document.objects.select_for_update().filter(pk=old_id, superseded_by__isnull=True).first()
    if old is None:
        return
    entity_ids, relation_ids = _contributions([old_id])
    _lock(document.workspace_id, entity_ids, relation_ids)
    EntitySource.objects.filter(chunk__document_id=old_id).delete()
    RelationSource.objects.filter(chunk__document_id=old_id).delete()
    _remove_orphans(entity_ids, relation_ids)
    Chunk.objects.filter(document_id=old_id).update(embedding=None)
    now = timezone.now()
    Document.objects.filter(superseded_by_id=old_id).update(superseded_by=document)
    Document.objects.filter(pk=old_id).update(superseded_by=document, superseded_at=now, updated_at=now)
    workspace_refresh_counts(workspace_id=document.workspace_id)
    # Open document lists show the current version only: the old one's row goes.
    events.publish_document_deleted(old)


def versions_of(*, document: Document) -> list[Document]:
    """Every version of the document `document` is or was, newest first (for its history)."""
    current = document.superseded_by or document
    older = Document.objects.filter(superseded_by=current).defer("text", "structure")
    return [current, *older.order_by("-version")]


def version_prune(*, document: Document, actor=None) -> None:
    """Delete an older version: it serves nothing, so nothing in the graph changes. Citations that
    pointed at it say their document was removed, as for any deleted document."""
    if document.superseded_by_id is None:
        raise VersionRefused(f"“{document.title}” version {document.version} is the current version.")
    name = document.source_file.name if document.source_file else ""
    with transaction.atomic():
        Document.objects.filter(pk=document.pk).delete()
        audit_record(
            workspace=document.workspace,
            actor=actor,
            action="document.version_prune",
            summary=f"Deleted version {document.version} of “{document.title}”",
            detail={"document_id": document.pk, "version": document.version},
        )
        if name:
            transaction.on_commit(lambda: default_storage.delete(name))
