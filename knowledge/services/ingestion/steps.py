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
from collections import Counter
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
from knowledge.rag.graph.provenance import built_together, document_known
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
            Step.EMBED: lambda document, owner: _embed([document], owner),
            Step.EXTRACT: lambda document, owner: _extract([document], owner),
            Step.BUILD: _build,
            Step.PUBLISH: lambda document, owner: _publish([document], owner),
        }[step](document, owner)
    events.publish_document_progress(document)
    progress(document)
    return document


def run_together(step: Step, documents: list[Document], owner: str, *, group: list[int]) -> None:
    """Run one step for several new documents of one workspace (a group run, decision 0176):
    their chunks embedded in one call and extracted in one batch, their rows built once for all
    of them and published in one transaction. `group` is every document of the run: each build
    sees the sources of all of them, as their one publication will. Not the parse: a file's
    failure is its own."""
    leader = documents[0]
    with (
        llm.models_pinned(),
        built_together(group),
        document_known(leader.pk, leader.workspace_id, leader.replaces_id),
    ):
        {Step.EMBED: _embed, Step.EXTRACT: _extract, Step.BUILD: _build_together, Step.PUBLISH: _publish}[step](
            documents, owner
        )
    for document in documents:
        events.publish_document_progress(document)


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


def _share(seconds: float, counts: dict[int, int], document: Document) -> float:
    """A document's part of a step several documents ran together, by how much of it was theirs."""
    return seconds * counts.get(document.pk, 0) / max(1, sum(counts.values()))


def _embed(documents: list[Document], owner: str) -> None:
    """Embed the next chunks of these documents, up to EMBED_STEP_TOKENS, in one call. A document
    whose last chunks are among them moves on to extraction in the same transaction (one step
    less per document); one after the chunks that did not fit waits for the next step."""
    began = time.perf_counter()
    ids = [document.pk for document in documents]
    staged = PendingVector.objects.filter(document__in=ids, kind=PendingVector.Kind.CHUNK).values("row_id")
    missing = (
        Chunk.objects.filter(document__in=ids, embedding__isnull=True)
        .exclude(pk__in=staged)
        .order_by("document_id", "order")
        .only("pk", "document_id", "section", "text", "token_count")
    )
    batch, size, cut = [], 0, None
    for chunk in missing.iterator(chunk_size=64):
        if batch and size + chunk.token_count > EMBED_STEP_TOKENS:
            cut = chunk.document_id  # this document has chunks left, and those after it were not reached
            break
        batch.append(chunk)
        size += chunk.token_count
    texts = [chunk_embedding_text(chunk) for chunk in batch]
    vectors = llm.embed(texts, purpose="passage") if batch else []
    seconds = time.perf_counter() - began
    counts = Counter(chunk.document_id for chunk in batch)
    with transaction.atomic():
        for document in sorted(documents, key=lambda document: document.pk):
            if cut is not None and document.pk > cut:
                break
            timing = {"embed_chunks": _share(seconds, counts, document)} if counts[document.pk] else None
            if document.pk == cut:
                _checked(document, owner, timing, stage_done=F("stage_done") + counts[document.pk])
            else:
                _checked(
                    document,
                    owner,
                    timing,
                    stage=Stage.EXTRACTING,
                    stage_done=document.chunks_done,
                    stage_total=document.chunk_count,
                )
        for document_id in counts:
            stage_vectors(
                document_id=document_id,
                kind=PendingVector.Kind.CHUNK,
                rows=[
                    (chunk.pk, _text_hash(text), vector)
                    for chunk, text, vector in zip(batch, texts, vectors, strict=True)
                    if chunk.document_id == document_id
                ],
            )


# ---------------------------------------------------------------------------------------
# Extract and merge


# The fewest chunks an extraction step takes, whatever the engine.
EXTRACT_STEP_CHUNKS = 8


def _batch_size() -> int:
    # Enough chunks to keep every model slot busy; progress is published after each batch.
    return max(EXTRACT_STEP_CHUNKS, 2 * settings.LLM_MAX_CONCURRENCY) if llm.chat_model_configured() else 16


def _extract(documents: list[Document], owner: str) -> None:
    """Extract the next batch of chunks, from the first of these documents that has some left and
    on into the next ones while the batch has room, and merge them in one transaction. A document
    whose last chunks are merged moves on to building in it."""
    began = time.perf_counter()
    reached, batch, size = [], [], _batch_size()
    for document in documents:
        room = size - len(batch)
        if room <= 0:
            break
        reached.append(document)
        batch += (
            Chunk.objects.filter(document=document, order__gte=document.chunks_done)
            .order_by("order")
            .only("pk", "document_id", "order", "text")[:room]
        )
    outcome = extraction.extract_chunks(chunks=batch, workspace=documents[0].workspace)
    extracted = {chunk.pk: outcome.records[chunk.pk] for chunk in batch if chunk.pk in outcome.records}
    for document in reached:
        usage = llm.Usage()
        for chunk in batch:
            if chunk.document_id == document.pk and chunk.pk in outcome.usage_by_chunk:
                usage.add(outcome.usage_by_chunk[chunk.pk])
        _count_usage(document, usage)
    merging = time.perf_counter()
    counts = Counter(chunk.document_id for chunk in batch)
    with transaction.atomic():
        graph.merge_chunks(workspace_id=documents[0].workspace_id, records_by_chunk=extracted)
        merged = time.perf_counter()
        for document in reached:
            mine = [chunk for chunk in batch if chunk.document_id == document.pk]
            # chunks_done only moves past an unbroken run of merged chunks: the next turn starts at the first gap.
            done = next((index for index, chunk in enumerate(mine) if chunk.pk not in extracted), len(mine))
            last = done == len(mine) and document.chunks_done + done >= document.chunk_count
            _checked(
                document,
                owner,
                {
                    "extract": _share(merging - began, counts, document),
                    "merge": _share(merged - merging, counts, document),
                }
                if mine
                else None,
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


def _build_together(documents: list[Document], owner: str) -> None:
    """One build of every row these documents touched, staged under the first of them, which
    their one publication applies. In one step: a group holds only small documents."""
    began = time.perf_counter()
    leader = documents[0]
    entity_ids, relation_ids = _union(touched_rows(document) for document in documents)
    _build_rows(leader, entity_ids, relation_ids)
    described = time.perf_counter()
    _stage_row_vectors(leader, entity_ids, relation_ids)
    built = time.perf_counter()
    share = 1 / len(documents)
    with transaction.atomic():
        for document in documents:
            _checked(
                document,
                owner,
                {"describe": (described - began) * share, "embed_graph": (built - described) * share},
                stage=Stage.PUBLISHING,
                stage_done=0,
                stage_total=1,
            )


def _union(rows) -> tuple[list[int], list[int]]:
    entities, relations = set(), set()
    for entity_ids, relation_ids in rows:
        entities.update(entity_ids)
        relations.update(relation_ids)
    return sorted(entities), sorted(relations)


# ---------------------------------------------------------------------------------------
# Publish


def _search_synonyms(entity_ids: list[int]) -> None:
    """The document is published whatever happens here: a failed search stays queued for the
    sweeper (graph.synonyms)."""
    try:
        graph.run_synonym_searches(entity_ids=entity_ids)
    except DatabaseError:
        logger.warning("synonym search failed; the sweeper will retry it", exc_info=True)


def _publish(documents: list[Document], owner: str) -> None:
    """One transaction makes the documents visible: the values their build staged for shared
    rows, the vectors of their chunks and rows, their new rows and their status, all at once.
    What was staged is the first document's: for one document, the rows it touched and, for a new
    version, those the version it retires touched; for a group, every row its documents touched."""
    began = time.perf_counter()
    leader = documents[0]
    touched = {document.pk: touched_rows(document) for document in documents}
    if len(documents) == 1:
        staged_entities, staged_relations = rows_to_build(leader, touched[leader.pk])
    else:
        staged_entities, staged_relations = _union(touched.values())
    # Rows whose provenance changed after the build (another document published, a deletion, a
    # curation merge that renumbered rows) are built again before the transaction, which then
    # only checks, under the locks every writer of provenance takes, that nothing moved since.
    _restage(leader, *unstaged(document_id=leader.pk, entity_ids=staged_entities, relation_ids=staged_relations))
    for attempt in range(PUBLISH_ATTEMPTS):
        last = attempt + 1 == PUBLISH_ATTEMPTS
        try:
            with transaction.atomic():
                # What members see commits as the server says (on: it waits for the disk, and with
                # it every step before; an operator's remote_apply stays remote_apply).
                with connection.cursor() as cursor:
                    cursor.execute("SET LOCAL synchronous_commit TO DEFAULT")
                for document in documents:
                    _checked(document, owner)
                lock_staged(workspace_id=leader.workspace_id, entity_ids=staged_entities, relation_ids=staged_relations)
                stale = unstaged(document_id=leader.pk, entity_ids=staged_entities, relation_ids=staged_relations)
                if any(stale):
                    if not last:
                        raise _Restage(*stale)
                    # Still racing after several tries: build them while holding the locks.
                    _restage(leader, *stale)
                apply_staged(document_id=leader.pk, entity_ids=staged_entities, relation_ids=staged_relations)
                published = publish_vectors(
                    document_id=leader.pk, entity_ids=staged_entities, relation_ids=staged_relations
                )
                for document in documents[1:]:
                    published.add(publish_vectors(document_id=document.pk, entity_ids=[], relation_ids=[]))
                graph.queue_synonym_search(
                    published.entity_ids, takeover_after=timedelta(seconds=settings.INGEST_LEASE_SECONDS)
                )
                now, seconds = timezone.now(), (time.perf_counter() - began) / len(documents)
                for document in documents:
                    entity_ids, relation_ids = touched[document.pk]
                    _checked(
                        document,
                        owner,
                        {"publish": seconds},
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
                Workspace.objects.filter(pk=leader.workspace_id).update(
                    chunk_count=F("chunk_count") + published.counts["chunk"],
                    entity_count=F("entity_count") + published.counts["entity"],
                    relation_count=F("relation_count") + published.counts["relation"],
                )
                for document in documents:
                    versions.retire(document=document)
            with metrics.one_write():
                for document in documents:
                    metrics.count(metrics.INGEST_TOKENS, document.token_count)
            # Committed: the new entities look for their synonyms among everything published.
            _search_synonyms(published.entity_ids)
            return
        except _Restage as restage:
            _restage(leader, restage.entity_ids, restage.relation_ids)
        except OperationalError as err:
            if last or not isinstance(err.__cause__, DeadlockDetected):
                raise
