"""The steps of a run, each one transaction that also checks the run still holds its lease.

Parse (file to text, then chunks) -> embed the chunks -> extract and merge, a batch at a time ->
build: describe the graph rows the document touched and embed the new ones -> publish.
Vectors wait in PendingVector until the publishing transaction moves them onto their rows.
"""

import contextlib
import enum
import hashlib
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import DatabaseError, Error, IntegrityError, OperationalError, connection, transaction
from django.db.models import F, Q
from django.db.models.sql import UpdateQuery
from django.utils import timezone
from psycopg.errors import DeadlockDetected

from knowledge import metrics
from knowledge.models import Chunk, Document, Entity, EntitySource, PendingVector, Relation, RelationSource, Workspace
from knowledge.rag import chunking, extraction, graph, language, llm, parsing
from knowledge.rag.graph.provenance import document_known
from knowledge.rag.graph.staging import apply_staged, lock_staged, unstaged
from knowledge.rag.graph.vectors import (
    copy_staged_vectors,
    publish_vectors,
    stage_vectors,
    stage_vectors_of_others,
)
from knowledge.rag.tokens import count_tokens
from knowledge.services import events
from knowledge.services.ingestion import versions

# Chunks embedded per step: about a minute of the embedded model on a busy machine, so a turn
# ends soon after its slice and a stopping worker is not kept waiting.
EMBED_STEP_TOKENS = 4_000
# Graph rows described and embedded per step.
BUILD_STEP_ROWS = 400
PUBLISH_ATTEMPTS = 3
Stage = Document.Stage
logger = logging.getLogger(__name__)


class Step(enum.Enum):
    PARSE = "parse"
    EMBED = "embed"
    EXTRACT = "extract"
    BUILD = "build"
    PUBLISH = "publish"
    DONE = "done"


_STEP_OF_STAGE = {
    Stage.QUEUED: Step.PARSE,
    Stage.PARSING: Step.PARSE,
    Stage.EMBEDDING: Step.EMBED,
    Stage.EXTRACTING: Step.EXTRACT,
    Stage.BUILDING: Step.BUILD,
    Stage.PUBLISHING: Step.PUBLISH,
    Stage.DONE: Step.DONE,
}


class DocumentGone(Exception):
    """The document was deleted while a run worked on it."""


class LeaseLost(Exception):
    """Another run took the document over (this one stalled past its lease)."""


class _Restage(Exception):
    """Provenance of rows the document shares changed after its build: build them again."""

    def __init__(self, entity_ids: list[int], relation_ids: list[int]):
        super().__init__()
        self.entity_ids, self.relation_ids = entity_ids, relation_ids


class DocumentRefused(Exception):
    """The document cannot be ingested (no text, a duplicate); `str(err)` says why, for the user."""


def lease_expiry():
    return timezone.now() + timedelta(seconds=settings.INGEST_LEASE_SECONDS)


def current(document_id: int) -> Document | None:
    """The document as steps read it; its text stays in the database until the parse needs it."""
    return Document.objects.select_related("workspace").defer("text").filter(pk=document_id).first()


@contextlib.contextmanager
def unflushed_commits():
    """The run's steps commit without waiting for their WAL to reach the disk (decision 0173):
    a Postgres crash can lose the last of them, and the document then resumes from an earlier
    step, which a run redoes as if it had been interrupted. Commits stay atomic and visible at
    once; only the publishing transaction, the one members see, waits for the disk, and with it
    every commit before it. Outside the run the connection commits as it did."""
    with connection.cursor() as cursor:
        cursor.execute("SET synchronous_commit TO off")
    try:
        yield
    finally:
        try:
            with connection.cursor() as cursor:
                cursor.execute("RESET synchronous_commit")
        except Error:
            pass  # the connection broke (the run says how); the next one starts with the server's setting


def next_step(document: Document | None, owner: str) -> Step:
    if document is None:
        raise DocumentGone
    if document.lease_owner != owner and document.stage != Stage.DONE:
        raise LeaseLost
    return _STEP_OF_STAGE[document.stage]


def run_step(step: Step, document: Document, owner: str, progress: Callable[[Document], None]) -> Document:
    """Run one step; the document as its last write left it, which the next step starts from.
    The step's model calls use the models in use when it began, and its builds what the document
    said when it began. The workspace is the one the run read when it started."""
    with llm.models_pinned(), document_known(document.pk, document.workspace_id, document.replaces_id):
        {
            Step.PARSE: _parse,
            Step.EMBED: _embed,
            Step.EXTRACT: _extract,
            Step.BUILD: _build,
            Step.PUBLISH: _publish,
        }[step](document, owner)
    events.publish_document_progress(document)
    progress(document)
    return document


def announce(document_id: int) -> Document | None:
    """Tell whoever watches the workspace where the document stands (after commit)."""
    document = current(document_id)
    if document is not None:
        events.publish_document_progress(document)
    return document


# What a step's last write returns of the document: what `current` reads.
_RETURNED = [field for field in Document._meta.concrete_fields if field.name != "text"]


def _checked(document: Document, owner: str, seconds: dict[str, float] | None = None, **changes) -> None:
    """Inside the step's transaction: write `changes` (and the step's time) if the lease is still
    ours, and take the row as it now stands onto `document`. Every step ends with this write, so
    the document is not read again after it (a read per step was 6% of a worker's time,
    benchmarks/results/2026-11-30-per-document-overhead.md)."""
    if seconds:
        timings = dict(document.timings or {})
        for name, value in seconds.items():
            timings[name] = round(timings.get(name, 0.0) + value, 3)
        changes["timings"] = timings
    changes.setdefault("lease_expires_at", lease_expiry())
    update = UpdateQuery(Document)
    update.add_update_values({"updated_at": timezone.now(), **changes})
    update.add_q(Q(pk=document.pk, lease_owner=owner))
    sql, params = update.get_compiler(Document.objects.db).as_sql()
    returning = ", ".join(connection.ops.quote_name(field.column) for field in _RETURNED)
    # A raw query set converts the returned columns as a query set would (JSON, dates).
    written = next(iter(Document.objects.raw(f"{sql} RETURNING {returning}", params)), None)
    if written is None:
        raise LeaseLost if Document.objects.filter(pk=document.pk).exists() else DocumentGone
    for field in _RETURNED:
        setattr(document, field.attname, getattr(written, field.attname))


def _count_usage(document: Document, usage: llm.Usage) -> None:
    """Counted as soon as the calls return, in a transaction of its own: a run that dies before
    its step commits still shows what the model calls cost."""
    if usage.calls:
        Document.objects.filter(pk=document.pk).update(
            prompt_tokens=F("prompt_tokens") + usage.prompt_tokens,
            completion_tokens=F("completion_tokens") + usage.completion_tokens,
            llm_calls=F("llm_calls") + usage.calls,
        )


# ---------------------------------------------------------------------------------------
# Parse: the file's text, then its chunks


def _read_source(document: Document) -> bytes:
    with document.source_file.open("rb") as handle:
        return handle.read()


def read_file(name: str, data: bytes) -> parsing.ParsedDocument:
    """The text of an uploaded file and its structure, as a run reads it; DocumentRefused when
    there is no text."""
    parsed = parsing.parse_file(name, data)
    if not parsed.text:
        raise DocumentRefused(
            f"No text found in {name}. A scanned PDF needs text recognition (OCR) before it can be uploaded."
            if name.lower().endswith(".pdf")
            else f"No text found in {name}."
        )
    return parsed


def chunk_spans(parsed: parsing.ParsedDocument, workspace: Workspace) -> list[chunking.ChunkSpan]:
    return chunking.chunk_text(
        parsed.text,
        size=workspace.chunk_token_size,
        overlap=workspace.chunk_overlap_tokens,
        sections=parsed.sections,
        regions=parsed.regions,
    )


def _parse(document: Document, owner: str) -> None:
    began = time.perf_counter()
    text, structure = Document.objects.filter(pk=document.pk).values_list("text", "structure").get()
    if not text:
        shape = read_file(document.original_filename or document.source_file.name, _read_source(document))
        text, structure = shape.text, shape.to_json()
    content_hash = hashlib.sha256(text.encode()).hexdigest()
    duplicate = (
        Document.objects.current()
        .filter(workspace_id=document.workspace_id, content_hash=content_hash)
        .exclude(pk=document.pk)
        .values_list("pk", "title")
        .first()
    )
    if duplicate is not None and duplicate[0] == document.replaces_id:
        raise DocumentRefused(f"{document.title} version {document.version} has the same text as the current version.")
    if duplicate is not None:
        duplicate = duplicate[1]
        raise DocumentRefused(f"{document.title} has the same text as “{duplicate}”, already in this workspace.")
    parsed = time.perf_counter()
    workspace = document.workspace
    spans = chunk_spans(parsing.ParsedDocument.from_json(text, structure), workspace)
    chunked = time.perf_counter()
    try:
        with transaction.atomic():
            _checked(
                document,
                owner,
                {"parse": parsed - began, "chunk": chunked - parsed},
                text=text,
                structure=structure,
                content_hash=content_hash,
                language=language.detect(text),
                token_count=count_tokens(text),
                chunk_count=len(spans),
                chunks_done=0,
                stage=Stage.EMBEDDING,
                stage_done=0,
                stage_total=len(spans),
            )
            Chunk.objects.filter(document=document).delete()
            Chunk.objects.bulk_create(
                [
                    Chunk(
                        workspace=workspace,
                        document=document,
                        order=span.order,
                        text=span.text,
                        token_count=span.token_count,
                        char_start=span.char_start,
                        char_end=span.char_end,
                        section=span.section,
                        page_start=span.page_start,
                        page_end=span.page_end,
                        location=span.location,
                        anchor=span.anchor,
                    )
                    for span in spans
                ],
                batch_size=500,
            )
            if document.replaces_id is not None:
                versions.reuse_unchanged(document=document, engine=extraction.engine_name(), text_hash=_chunk_hash)
    except IntegrityError as err:
        # The same text arrived twice at once: the unique constraint decides.
        raise DocumentRefused(
            f"{document.title} has the same text as a document just added to this workspace."
        ) from err


# ---------------------------------------------------------------------------------------
# Embed the chunks


def chunk_embedding_text(chunk: Chunk) -> str:
    """What a chunk's vector is made of: its section path, then its text."""
    return chunking.embedding_text(chunk.section, chunk.text)


def _text_hash(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def _chunk_hash(chunk: Chunk) -> str:
    return _text_hash(chunk_embedding_text(chunk))


def _embed(document: Document, owner: str) -> None:
    began = time.perf_counter()
    staged = PendingVector.objects.filter(document=document, kind=PendingVector.Kind.CHUNK).values("row_id")
    missing = (
        Chunk.objects.filter(document=document, embedding__isnull=True)
        .exclude(pk__in=staged)
        .order_by("order")
        .only("pk", "section", "text", "token_count")
    )
    group, size, rest = [], 0, False
    for chunk in missing.iterator(chunk_size=64):
        if group and size + chunk.token_count > EMBED_STEP_TOKENS:
            rest = True
            break
        group.append(chunk)
        size += chunk.token_count
    # The step that embeds the last chunks also moves the document on: one step less per document.
    extracting = {
        "stage": Stage.EXTRACTING,
        "stage_done": document.chunks_done,
        "stage_total": document.chunk_count,
    }
    if not group:
        with transaction.atomic():
            _checked(document, owner, **extracting)
        return
    texts = [chunk_embedding_text(chunk) for chunk in group]
    vectors = llm.embed(texts, purpose="passage")
    with transaction.atomic():
        _checked(
            document,
            owner,
            {"embed_chunks": time.perf_counter() - began},
            **({"stage_done": F("stage_done") + len(group)} if rest else extracting),
        )
        stage_vectors(
            document_id=document.pk,
            kind=PendingVector.Kind.CHUNK,
            rows=[
                (chunk.pk, _text_hash(text), vector) for chunk, text, vector in zip(group, texts, vectors, strict=True)
            ],
        )


# ---------------------------------------------------------------------------------------
# Extract and merge


def _batch_size() -> int:
    # Enough chunks to keep every model slot busy; progress is published after each batch.
    return max(8, 2 * settings.LLM_MAX_CONCURRENCY) if llm.chat_model_configured() else 16


def _extract(document: Document, owner: str) -> None:
    began = time.perf_counter()
    batch = list(
        Chunk.objects.filter(document=document, order__gte=document.chunks_done)
        .order_by("order")
        .only("pk", "order", "text")[: _batch_size()]
    )
    if not batch:
        with transaction.atomic():
            _checked(document, owner, **_building(document))
        return
    outcome = extraction.extract_chunks(chunks=batch, workspace=document.workspace)
    _count_usage(document, outcome.usage)
    extracted = {chunk.pk: outcome.records[chunk.pk] for chunk in batch if chunk.pk in outcome.records}
    # chunks_done only moves past an unbroken run of merged chunks: the next turn starts at the first gap.
    done = next((index for index, chunk in enumerate(batch) if chunk.pk not in extracted), len(batch))
    merging = time.perf_counter()
    last = done == len(batch) and document.chunks_done + done >= document.chunk_count
    with transaction.atomic():
        graph.merge_chunks(workspace_id=document.workspace_id, records_by_chunk=extracted)
        _checked(
            document,
            owner,
            {"extract": merging - began, "merge": time.perf_counter() - merging},
            chunks_done=F("chunks_done") + done,
            # The batch that merges the last chunks also moves the document on to building.
            **(_building(document) if last else {"stage_done": F("chunks_done") + done}),
        )
    if outcome.errors:
        error = outcome.errors[0]
        raise llm.LLMError(
            f"{len(batch) - len(extracted)} chunk(s) could not be extracted: {error}",
            transient=error.transient,
            public=error.public,
        )


def _building(document: Document) -> dict:
    """The changes that start the build (inside the transaction that merged the last chunks)."""
    entity_ids, relation_ids = rows_to_build(document)
    return {"stage": Stage.BUILDING, "stage_done": 0, "stage_total": len(entity_ids) + len(relation_ids)}


# ---------------------------------------------------------------------------------------
# Build: describe what the document touched, embed what is new


def touched_rows(document: Document) -> tuple[list[int], list[int]]:
    """The entities and relations the document's chunks support, each in id order."""
    entity_ids = EntitySource.objects.filter(chunk__document=document).values_list("entity_id", flat=True).distinct()
    relation_ids = (
        RelationSource.objects.filter(chunk__document=document).values_list("relation_id", flat=True).distinct()
    )
    return sorted(entity_ids), sorted(relation_ids)


def rows_to_build(
    document: Document, touched: tuple[list[int], list[int]] | None = None
) -> tuple[list[int], list[int]]:
    """What the build describes: the rows the document touched (`touched`, when the caller has
    read them) and, for a new version, the rows the version it replaces touched, so one build
    covers the whole change."""
    entity_ids, relation_ids = touched or touched_rows(document)
    if document.replaces_id is None:
        return entity_ids, relation_ids
    old_entities, old_relations = touched_rows(Document(pk=document.replaces_id))
    return sorted({*entity_ids, *old_entities}), sorted({*relation_ids, *old_relations})


def _stage_row_vectors(document: Document, entity_ids: list[int], relation_ids: list[int]) -> None:
    """Vectors for the unpublished rows among these that the document has none for yet."""
    entities = dict(Entity.objects.filter(pk__in=entity_ids, published=False).values_list("pk", "name"))
    relations = {
        pk: (source, target, keywords)
        for pk, source, target, keywords in Relation.objects.filter(pk__in=relation_ids, published=False).values_list(
            "pk", "source__name", "target__name", "keywords"
        )
    }
    wanted = {
        PendingVector.Kind.ENTITY: (
            {pk: graph.entity_text(name) for pk, name in entities.items()},
            lambda pks: graph.entity_vectors([entities[pk] for pk in pks]),
        ),
        PendingVector.Kind.RELATION: (
            {pk: graph.relation_text(*row) for pk, row in relations.items()},
            lambda pks: graph.relation_vectors([relations[pk] for pk in pks]),
        ),
    }
    have = set(
        PendingVector.objects.filter(document=document, kind__in=list(wanted)).values_list(
            "kind", "row_id", "text_hash"
        )
    )
    for kind, (texts, embed) in wanted.items():
        needed = {pk: _text_hash(text) for pk, text in texts.items() if (kind, pk, _text_hash(text)) not in have}
        copied = stage_vectors_of_others(document_id=document.pk, kind=kind, wanted=needed)
        todo = [pk for pk in needed if pk not in copied]
        stage_vectors(
            document_id=document.pk,
            kind=kind,
            rows=[(pk, needed[pk], vector) for pk, vector in zip(todo, embed(todo), strict=True)],
        )
    copy_staged_vectors(document_id=document.pk, entity_ids=entity_ids, relation_ids=relation_ids)


def _build_rows(document: Document, entity_ids: list[int], relation_ids: list[int]) -> None:
    """Describe the rows as they will be once the document is published: rows nobody is served yet
    are written, the values of served ones wait for the publishing transaction (graph.staging).
    A new version's rows are described without the version it replaces (graph.provenance)."""
    usage = llm.Usage()
    try:
        graph.rebuild_entities(entity_ids=entity_ids, usage=usage, document_id=document.pk)
        graph.rebuild_relations(relation_ids=relation_ids, usage=usage, document_id=document.pk)
    finally:
        _count_usage(document, usage)


def _restage(document: Document, entity_ids: list[int], relation_ids: list[int]) -> None:
    if not entity_ids and not relation_ids:  # the usual case at publish: nothing moved since the build
        return
    _build_rows(document, entity_ids, relation_ids)
    _stage_row_vectors(document, entity_ids, relation_ids)


def _build(document: Document, owner: str) -> None:
    began = time.perf_counter()
    entity_ids, relation_ids = rows_to_build(document)
    rows = [("entity", pk) for pk in entity_ids] + [("relation", pk) for pk in relation_ids]
    batch = rows[document.stage_done : document.stage_done + BUILD_STEP_ROWS]
    if not batch:
        with transaction.atomic():
            _checked(document, owner, stage=Stage.PUBLISHING, stage_done=0, stage_total=1)
        return
    entities = [pk for kind, pk in batch if kind == "entity"]
    relations = [pk for kind, pk in batch if kind == "relation"]
    _build_rows(document, entities, relations)
    described = time.perf_counter()
    _stage_row_vectors(document, entities, relations)
    built = document.stage_done + len(batch)
    with transaction.atomic():
        _checked(
            document,
            owner,
            {"describe": described - began, "embed_graph": time.perf_counter() - described},
            # The batch that builds the last rows also moves the document on to publishing.
            **(
                {"stage": Stage.PUBLISHING, "stage_done": 0, "stage_total": 1}
                if built >= len(rows)
                else {"stage_done": built, "stage_total": len(rows)}
            ),
        )


# ---------------------------------------------------------------------------------------
# Publish


def _search_synonyms(entity_ids: list[int]) -> None:
    """The document is published whatever happens here: a failed search stays queued for the
    sweeper (graph.synonyms)."""
    try:
        graph.run_synonym_searches(entity_ids=entity_ids)
    except DatabaseError:
        logger.warning("synonym search failed; the sweeper will retry it", exc_info=True)


def _publish(document: Document, owner: str) -> None:
    """One transaction makes the document visible: the values it staged for shared rows, the
    vectors of its chunks and rows, its new rows and its status, all at once."""
    began = time.perf_counter()
    entity_ids, relation_ids = touched_rows(document)
    # A new version also staged the values of rows only the version it retires touched.
    staged_entities, staged_relations = rows_to_build(document, (entity_ids, relation_ids))
    # Rows whose provenance changed after the build (another document published, a deletion, a
    # curation merge that renumbered rows) are built again before the transaction, which then
    # only checks, under the locks every writer of provenance takes, that nothing moved since.
    _restage(document, *unstaged(document_id=document.pk, entity_ids=staged_entities, relation_ids=staged_relations))
    for attempt in range(PUBLISH_ATTEMPTS):
        last = attempt + 1 == PUBLISH_ATTEMPTS
        try:
            with transaction.atomic():
                # What members see commits as the server says (on: it waits for the disk, and with
                # it every step before; an operator's remote_apply stays remote_apply).
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit TO DEFAULT")
                _checked(document, owner)
                lock_staged(
                    workspace_id=document.workspace_id, entity_ids=staged_entities, relation_ids=staged_relations
                )
                stale = unstaged(document_id=document.pk, entity_ids=staged_entities, relation_ids=staged_relations)
                if any(stale):
                    if not last:
                        raise _Restage(*stale)
                    # Still racing after several tries: build them while holding the locks.
                    _restage(document, *stale)
                apply_staged(document_id=document.pk)
                published = publish_vectors(document_id=document.pk)
                graph.queue_synonym_search(
                    published.entity_ids, takeover_after=timedelta(seconds=settings.INGEST_LEASE_SECONDS)
                )
                now = timezone.now()
                _checked(
                    document,
                    owner,
                    {"publish": time.perf_counter() - began},
                    status=Document.Status.PROCESSED,
                    stage=Stage.DONE,
                    stage_done=1,
                    stage_total=1,
                    processed_at=now,
                    error="",
                    error_detail="",
                    attempts=0,
                    entity_count=len(entity_ids),
                    relation_count=len(relation_ids),
                    lease_owner="",
                    lease_expires_at=None,
                )
                Workspace.objects.filter(pk=document.workspace_id).update(
                    chunk_count=F("chunk_count") + published.counts["chunk"],
                    entity_count=F("entity_count") + published.counts["entity"],
                    relation_count=F("relation_count") + published.counts["relation"],
                )
                versions.retire(document=document)
            metrics.count(metrics.INGEST_TOKENS, document.token_count)
            # Committed: the new entities look for their synonyms among everything published.
            _search_synonyms(published.entity_ids)
            return
        except _Restage as restage:
            _restage(document, restage.entity_ids, restage.relation_ids)
        except OperationalError as err:
            if last or not isinstance(err.__cause__, DeadlockDetected):
                raise
