"""Vector writes: many rows in one statement, binary vectors, and re-embedding after a model change."""

import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import numpy as np
import psycopg
from django.db import connection, transaction
from django.db.models import Index, Q
from pgvector.psycopg.vector import register_vector_info
from psycopg.types import TypeInfo
from psycopg.types.json import Jsonb

from knowledge.models import Chunk, Document, Entity, EntityVector, Relation, RelationVector, vector_type
from knowledge.rag import llm
from knowledge.rag.chunking import embedding_text
from knowledge.rag.graph.embedding import entity_vectors, relation_vectors

_COLUMN_TYPES = {
    "name": "text",
    "type": "text",
    "description": "text",
    "keywords": "text",
    "weight": "float8",
    "summary": "text",
    "summary_through": "int8",
    "summary_sources": "int4",
    "folded": "jsonb",
}


def _param(column: str, value):
    return Jsonb(value) if _COLUMN_TYPES[column] == "jsonb" and value is not None else value


# The `vector` type's description per open connection: asking the server for it cost one query
# per vector write, eight a document (benchmarks/results/2026-11-30-per-document-overhead.md).
_vector_types: weakref.WeakKeyDictionary[psycopg.Connection, TypeInfo] = weakref.WeakKeyDictionary()


def _vector_cursor() -> psycopg.Cursor:
    """A cursor on Django's connection (same transaction) that binds on the server and sends vectors in binary.

    Django's cursor interpolates parameters into the SQL text: thousands of vectors become
    megabytes of SQL to quote and parse, twenty times slower than pgvector's binary format.
    The adapters are the cursor's own: Django's cursors keep reading vectors as text.
    """
    connection.ensure_connection()
    raw = connection.connection
    info = _vector_types.get(raw)
    if info is None:
        info = TypeInfo.fetch(raw, "vector")
        if info is not None:  # None before the extension exists: asked again next time
            _vector_types[raw] = info
    cursor = psycopg.Cursor(raw)
    register_vector_info(cursor, info)
    return cursor


def update_rows(model, updates: dict[int, dict]) -> None:
    """Set different values on many rows in one statement per 1000 rows (UPDATE ... FROM unnest).

    Django's bulk_update writes a CASE per column, which Postgres evaluates row by row: with
    vectors in it, thousands of rows take seconds. Rows without an "embedding" keep theirs.
    """
    if not updates:
        return
    columns = sorted({name for values in updates.values() for name in values} - {"embedding"})
    with_vectors = any("embedding" in values for values in updates.values())
    names = [*columns, "embedding"] if with_vectors else columns
    assignments = [f"{column} = v.{column}" for column in columns]
    arrays = ["%s::bigint[]", *(f"%s::{_COLUMN_TYPES[column]}[]" for column in columns)]
    if with_vectors:
        assignments.append("embedding = COALESCE(v.embedding, t.embedding)")
        arrays.append("%b::vector[]")
    if any(field.name == "updated_at" for field in model._meta.concrete_fields):
        assignments.append("updated_at = now()")
    sql = (
        f"UPDATE {model._meta.db_table} AS t SET {', '.join(assignments)} "  # noqa: S608 - our own names
        f"FROM unnest({', '.join(arrays)}) AS v(id, {', '.join(names)}) WHERE t.id = v.id"
    )
    items = sorted(updates.items())
    # NO KEY UPDATE: what the UPDATE itself takes, so inserts that only reference these rows (the
    # key-share locks of provenance and synonym links) never wait on it, nor it on them.
    lock = f"SELECT id FROM {model._meta.db_table} WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE"  # noqa: S608
    with _vector_cursor() as cursor:
        for start in range(0, len(items), 1000):
            page = items[start : start + 1000]
            # In id order, as publishing locks them: concurrent writers of the same rows wait
            # for each other instead of deadlocking.
            cursor.execute(lock, [[pk for pk, _ in page]])
            params = [[pk for pk, _ in page]]
            params += [[_param(column, values.get(column)) for _, values in page] for column in columns]
            if with_vectors:
                params.append([_as_vector(values.get("embedding")) for _, values in page])
            cursor.execute(sql, params)


def stage_vectors(*, document_id: int, kind: str, rows: list[tuple[int, str, list[float]]]) -> None:
    """Keep vectors for the document's publication: (row id, text hash, vector) per row."""
    if not rows:
        return
    sql = (
        "INSERT INTO knowledge_pendingvector (document_id, kind, row_id, text_hash, embedding) "
        "SELECT %s, %s, r, h, v FROM unnest(%s::bigint[], %s::text[], %b::vector[]) AS u(r, h, v) "
        "ON CONFLICT (document_id, kind, row_id) DO UPDATE SET text_hash = EXCLUDED.text_hash, "
        "embedding = EXCLUDED.embedding"
    )
    with _vector_cursor() as cursor:
        for start in range(0, len(rows), 1000):
            page = rows[start : start + 1000]
            cursor.execute(
                sql,
                [
                    document_id,
                    kind,
                    [row_id for row_id, _, _ in page],
                    [text_hash for _, text_hash, _ in page],
                    [_as_vector(vector) for _, _, vector in page],
                ],
            )


def stage_vectors_of_others(*, document_id: int, kind: str, wanted: dict[int, str]) -> set[int]:
    """Copy vectors another document already staged for the same rows and texts; the rows copied.

    Two documents in flight often create the same entity; the second need not embed it again.
    """
    if not wanted:
        return set()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO knowledge_pendingvector (document_id, kind, row_id, text_hash, embedding) "
            "SELECT DISTINCT ON (p.row_id) %s, p.kind, p.row_id, p.text_hash, p.embedding "
            "FROM knowledge_pendingvector p JOIN unnest(%s::bigint[], %s::text[]) AS w(r, h) "
            "ON p.row_id = w.r AND p.text_hash = w.h WHERE p.kind = %s AND p.document_id <> %s "
            "ON CONFLICT (document_id, kind, row_id) DO NOTHING RETURNING row_id",
            [document_id, list(wanted), list(wanted.values()), kind, document_id],
        )
        return {row[0] for row in cursor.fetchall()}


# The copy of a new row's staged vector, written outside the publishing transaction: inserting it
# is an HNSW insert, the costliest write of a publication, and that transaction holds the locks
# of every hub entity it touched (knowledge.models.GraphVector). In id order, as rows are locked.
_COPY_STAGED_SQL = """
INSERT INTO knowledge_{kind}vector AS c (id, workspace_id, embedding)
SELECT t.id, t.workspace_id, p.embedding
FROM knowledge_pendingvector p JOIN knowledge_{kind} t ON t.id = p.row_id
WHERE p.document_id = %s AND p.kind = %s AND p.row_id = ANY(%s) AND NOT t.published
ORDER BY t.id
ON CONFLICT (id) DO UPDATE SET embedding = EXCLUDED.embedding
WHERE c.embedding IS DISTINCT FROM EXCLUDED.embedding
"""


def copy_staged_vectors(*, document_id: int, entity_ids: list[int], relation_ids: list[int]) -> None:
    """Write the vector copies of these rows that are unpublished and have a vector staged by the
    document; searches skip them until the rows are published, which then finds them in place."""
    with connection.cursor() as cursor:
        for kind, ids in (("entity", entity_ids), ("relation", relation_ids)):
            if ids:
                cursor.execute(_COPY_STAGED_SQL.format(kind=kind), [document_id, kind, list(ids)])


_PUBLISH_SQL = """
UPDATE knowledge_{table} t SET embedding = p.embedding{extra}
FROM knowledge_pendingvector p
WHERE p.document_id = %s AND p.kind = %s AND t.id = p.row_id AND {condition}
RETURNING t.id
"""


@dataclass
class Published:
    """What publish_vectors published: rows newly served per kind, and the entities whose name
    vector is new to searches (new rows, and served rows whose vector changed)."""

    counts: dict[str, int] = field(default_factory=dict)
    entity_ids: list[int] = field(default_factory=list)

    def add(self, other: "Published") -> None:
        for kind, count in other.counts.items():
            self.counts[kind] = self.counts.get(kind, 0) + count
        self.entity_ids += other.entity_ids


def publish_vectors(*, document_id: int, entity_ids: list[int], relation_ids: list[int]) -> Published:
    """Move the document's staged vectors onto its chunks and these rows, publishing entities and
    relations that were not yet; vectors it staged for other rows are dropped (a group run that
    died may have left some for rows only another of its documents touched). Call it inside the
    publishing transaction."""
    published = Published()
    rows = {"entity": sorted(entity_ids), "relation": sorted(relation_ids)}
    with connection.cursor() as cursor:
        # Rows are locked in id order, as the rebuild's writes lock them, so publishers and
        # rebuilds of overlapping rows wait for each other instead of deadlocking.
        for table, ids in rows.items():
            cursor.execute(
                f"SELECT t.id FROM knowledge_{table} t JOIN knowledge_pendingvector p "  # noqa: S608 - fixed names
                "ON p.row_id = t.id AND p.kind = %s AND p.document_id = %s WHERE t.id = ANY(%s) "
                "ORDER BY t.id FOR NO KEY UPDATE OF t",
                [table, document_id, ids],
            )
        cursor.execute(
            _PUBLISH_SQL.format(table="chunk", extra="", condition="t.embedding IS NULL"), [document_id, "chunk"]
        )
        published.counts["chunk"] = cursor.rowcount
        for table, ids in rows.items():
            # Served rows whose vector the document changed (knowledge.rag.graph.staging), then its new rows.
            cursor.execute(
                _PUBLISH_SQL.format(table=table, extra="", condition="t.published AND t.id = ANY(%s)"),
                [document_id, table, ids],
            )
            changed = [row[0] for row in cursor.fetchall()]
            cursor.execute(
                _PUBLISH_SQL.format(
                    table=table, extra=", published = true", condition="NOT t.published AND t.id = ANY(%s)"
                ),
                [document_id, table, ids],
            )
            new = [row[0] for row in cursor.fetchall()]
            published.counts[table] = len(new)
            if table == "entity":
                published.entity_ids = changed + new
        cursor.execute("DELETE FROM knowledge_pendingvector WHERE document_id = %s", [document_id])
    return published


def _as_vector(vector):
    return None if vector is None else np.asarray(vector, dtype=np.float32)


def embed_published(*, entity_ids: Iterable[int] = (), relation_ids: Iterable[int] = ()) -> None:
    """Embed published entities and relations again from their current names (after a rename or
    a merge changed them); unpublished rows get theirs when their document is published."""
    entities = list(Entity.objects.published().filter(pk__in=list(entity_ids)).values_list("pk", "name"))
    relations = list(
        Relation.objects.published()
        .filter(pk__in=list(relation_ids))
        .values_list("pk", "source__name", "target__name", "keywords")
    )
    vectors = entity_vectors([name for _, name in entities])
    update_rows(Entity, {pk: {"embedding": vector} for (pk, _), vector in zip(entities, vectors, strict=True)})
    vectors = relation_vectors([row[1:] for row in relations])
    update_rows(Relation, {row[0]: {"embedding": vector} for row, vector in zip(relations, vectors, strict=True)})


# ---------------------------------------------------------------------------------------
# Re-embedding (after changing the embedding model)

REEMBED_PAGE = 256
VECTOR_TABLES = ("knowledge_chunk", "knowledge_entity", "knowledge_relation")
# The tables searched by vector, with their HNSW indexes: the graph's vectors are searched in their
# copies (knowledge.models.GraphVector), which triggers fill again as rows are re-embedded.
INDEXED_VECTOR_MODELS = (Chunk, EntityVector, RelationVector)


def vector_dimensions() -> int:
    """The dimension the vector columns hold now (pgvector keeps it as the column's type modifier)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'knowledge_chunk'::regclass AND attname = 'embedding'"
        )
        return cursor.fetchone()[0]


def hnsw_index(model) -> Index:
    return next(index for index in model._meta.indexes if index.name.endswith("_embedding_hnsw"))


def resize_vector_columns(dimensions: int) -> None:
    """Change every vector column to `dimensions`, dropping the old vectors and rebuilding the HNSW indexes."""
    with transaction.atomic(), connection.cursor() as cursor:
        # Staged vectors are the old model's too, and their column is NOT NULL: they go, and the
        # documents they were staged for embed again when they run.
        cursor.execute("DELETE FROM knowledge_pendingvector")
        cursor.execute(f"ALTER TABLE knowledge_pendingvector ALTER COLUMN embedding TYPE vector({int(dimensions)})")
        # Postgres will not change the type of a column a trigger names (the copies' triggers,
        # migration 0016): they are set aside as they are defined and put back after.
        cursor.execute(
            "SELECT tgname, tgrelid::regclass::text, pg_get_triggerdef(oid) FROM pg_trigger "
            "WHERE tgrelid = ANY(%s::regclass[]) AND NOT tgisinternal AND pg_get_triggerdef(oid) LIKE '%%embedding%%'",
            [list(VECTOR_TABLES)],
        )
        triggers = cursor.fetchall()
        for name, table, _ in triggers:
            cursor.execute(f"DROP TRIGGER {name} ON {table}")  # noqa: S608 - names from the catalog
        for model in INDEXED_VECTOR_MODELS:
            cursor.execute(f"DROP INDEX IF EXISTS {hnsw_index(model).name}")  # noqa: S608 - our own names
            table = model._meta.db_table
            if table not in VECTOR_TABLES:  # a copy: its column is NOT NULL, and ALTER TABLE fires no trigger
                cursor.execute(f"DELETE FROM {table}")  # noqa: S608
                cursor.execute(
                    f"ALTER TABLE {table} ALTER COLUMN embedding TYPE {vector_type(model)}({int(dimensions)})"  # noqa: S608
                )
        for table in VECTOR_TABLES:
            cursor.execute(
                f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector({int(dimensions)}) USING NULL"  # noqa: S608
            )
        for _, _, definition in triggers:
            cursor.execute(definition)
        with connection.schema_editor() as editor:
            for model in INDEXED_VECTOR_MODELS:
                editor.add_index(model, hnsw_index(model))


def _reembed(model, queryset, embed, on_page) -> int:
    done, last = 0, 0
    while True:
        page = list(queryset.filter(pk__gt=last).order_by("pk")[:REEMBED_PAGE])
        if not page:
            return done
        vectors = embed(page)
        update_rows(model, {row["pk"]: {"embedding": vector} for row, vector in zip(page, vectors, strict=True)})
        done += len(page)
        last = page[-1]["pk"]
        if on_page is not None:
            on_page(len(page))


def reembed_workspace(*, workspace_id: int, on_page: Callable[[int], None] | None = None) -> dict[str, int]:
    """Embed every published chunk, entity and relation of the workspace again with the current
    embedding model (unpublished ones get theirs when their document is published). `on_page`
    hears how many rows each page re-embedded.

    Chunks are those with a vector or of a processed document: resizing the columns empties
    every vector first."""
    from knowledge.rag.graph.embedding import clear_cache

    clear_cache()
    return {
        "chunks": _reembed(
            Chunk,
            Chunk.objects.filter(workspace_id=workspace_id)
            .filter(Q(document__status=Document.Status.PROCESSED) | Q(embedding__isnull=False))
            .values("pk", "section", "text"),
            lambda page: llm.embed([embedding_text(row["section"], row["text"]) for row in page], purpose="passage"),
            on_page,
        ),
        "entities": _reembed(
            Entity,
            Entity.objects.published().filter(workspace_id=workspace_id).values("pk", "name"),
            lambda page: entity_vectors([row["name"] for row in page]),
            on_page,
        ),
        "relations": _reembed(
            Relation,
            Relation.objects.published()
            .filter(workspace_id=workspace_id)
            .values("pk", "source__name", "target__name", "keywords"),
            lambda page: relation_vectors(
                [(row["source__name"], row["target__name"], row["keywords"]) for row in page]
            ),
            on_page,
        ),
    }
