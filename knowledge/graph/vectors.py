"""Vector writes: many rows in one statement, binary vectors, and re-embedding after a model change."""

import numpy as np
import psycopg
from django.db import connection, transaction
from pgvector.psycopg.vector import register_vector_info
from psycopg.types import TypeInfo

from knowledge import llm
from knowledge.graph.describe import entity_embedding_text, relation_embedding_text
from knowledge.models import Chunk, Entity, Relation

_COLUMN_TYPES = {"name": "text", "type": "text", "description": "text", "keywords": "text", "weight": "float8"}


def _vector_cursor() -> psycopg.Cursor:
    """A cursor on Django's connection (same transaction) that binds on the server and sends vectors in binary.

    Django's cursor interpolates parameters into the SQL text: thousands of vectors become
    megabytes of SQL to quote and parse, twenty times slower than pgvector's binary format.
    """
    connection.ensure_connection()
    cursor = psycopg.Cursor(connection.connection)
    register_vector_info(cursor, TypeInfo.fetch(connection.connection, "vector"))
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
    items = list(updates.items())
    with _vector_cursor() as cursor:
        for start in range(0, len(items), 1000):
            page = items[start : start + 1000]
            params = [[pk for pk, _ in page]]
            params += [[values.get(column) for _, values in page] for column in columns]
            if with_vectors:
                params.append([_as_vector(values.get("embedding")) for _, values in page])
            cursor.execute(sql, params)


def _as_vector(vector):
    return None if vector is None else np.asarray(vector, dtype=np.float32)


# ---------------------------------------------------------------------------------------
# Re-embedding (after changing the embedding model)

REEMBED_PAGE = 256
VECTOR_TABLES = {"knowledge_chunk": "chunk", "knowledge_entity": "entity", "knowledge_relation": "relation"}


def vector_dimensions() -> int:
    """The dimension the vector columns hold now (pgvector keeps it as the column's type modifier)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'knowledge_chunk'::regclass AND attname = 'embedding'"
        )
        return cursor.fetchone()[0]


def resize_vector_columns(dimensions: int) -> None:
    """Change every vector column to `dimensions`, dropping the old vectors and rebuilding the HNSW indexes."""
    with transaction.atomic(), connection.cursor() as cursor:
        for table, prefix in VECTOR_TABLES.items():
            index = f"{prefix}_embedding_hnsw"
            cursor.execute(f"DROP INDEX IF EXISTS {index}")  # noqa: S608 - fixed names, no user input
            cursor.execute(
                f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector({int(dimensions)}) USING NULL"  # noqa: S608
            )
            cursor.execute(
                f"CREATE INDEX {index} ON {table} USING hnsw (embedding vector_cosine_ops) "  # noqa: S608
                "WITH (m = 16, ef_construction = 64)"
            )


def _reembed(model, queryset, text_of) -> int:
    done, last = 0, 0
    while True:
        page = list(queryset.filter(pk__gt=last).order_by("pk")[:REEMBED_PAGE])
        if not page:
            return done
        vectors = llm.embed([text_of(row) for row in page], purpose="passage")
        update_rows(model, {row["pk"]: {"embedding": vector} for row, vector in zip(page, vectors, strict=True)})
        done += len(page)
        last = page[-1]["pk"]


def reembed_workspace(*, workspace_id: int) -> dict[str, int]:
    """Embed every chunk, entity and relation of the workspace again with the current embedding model."""
    return {
        "chunks": _reembed(
            Chunk, Chunk.objects.filter(workspace_id=workspace_id).values("pk", "text"), lambda row: row["text"]
        ),
        "entities": _reembed(
            Entity,
            Entity.objects.filter(workspace_id=workspace_id).values("pk", "name", "description"),
            lambda row: entity_embedding_text(row["name"], row["description"]),
        ),
        "relations": _reembed(
            Relation,
            Relation.objects.filter(workspace_id=workspace_id).values(
                "pk", "keywords", "description", "source__name", "target__name"
            ),
            lambda row: relation_embedding_text(
                row["keywords"], row["source__name"], row["target__name"], row["description"]
            ),
        ),
    }
