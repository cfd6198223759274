"""Migrations that move data, run on data."""

import json

import numpy as np
import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from tests.factories import random_vector

BEFORE = [("knowledge", "0015_versions_scopes_sources")]
AFTER = [("knowledge", "0016_graph_vector_tables")]


def _migrate(target):
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(target)
    return executor.loader.project_state(target).apps


@pytest.mark.django_db(transaction=True)
def test_the_vector_copies_and_synonym_links_are_made_for_an_existing_graph():
    apps = _migrate(BEFORE)
    try:
        Workspace, Entity = apps.get_model("knowledge", "Workspace"), apps.get_model("knowledge", "Entity")
        Relation = apps.get_model("knowledge", "Relation")
        workspace = Workspace.objects.create(name="Old", slug="old")
        rng = np.random.default_rng(3)
        enum = random_vector(rng)

        def entity(name, embedding, published=True):
            return Entity.objects.create(
                workspace=workspace,
                name=name,
                key=name.casefold(),
                form=name.casefold().rstrip("s"),
                embedding=embedding,
                published=published,
            )

        one, many = entity("Enum", enum), entity("Enums", enum)
        pending = entity("Draft", random_vector(rng), published=False)
        relation = Relation.objects.create(
            workspace=workspace, source=one, target=many, embedding=random_vector(rng), published=True
        )

        apps = _migrate(AFTER)
        with connection.cursor() as cursor:
            cursor.execute("SELECT id FROM knowledge_entityvector ORDER BY id")
            assert [pk for (pk,) in cursor.fetchall()] == [one.pk, many.pk]
            cursor.execute("SELECT id FROM knowledge_relationvector")
            assert cursor.fetchall() == [(relation.pk,)]
            cursor.execute("SELECT source_id, target_id FROM knowledge_entitylink")
            assert cursor.fetchall() == [(one.pk, many.pk)]
        assert not apps.get_model("knowledge", "EntityVector").objects.filter(pk=pending.pk).exists()
    finally:
        executor = MigrationExecutor(connection)
        _migrate(executor.loader.graph.leaf_nodes())


def _copy_columns() -> dict[str, tuple[str, str]]:
    """Per copy table: its column's type and its HNSW index's definition."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT c.table_name, format_type(a.atttypid, a.atttypmod), i.indexdef "
            "FROM (VALUES ('knowledge_entityvector'), ('knowledge_relationvector')) c (table_name) "
            "JOIN pg_attribute a ON a.attrelid = c.table_name::regclass AND a.attname = 'embedding' "
            "JOIN pg_indexes i ON i.tablename = c.table_name AND i.indexname LIKE '%%_embedding_hnsw'"
        )
        return {table: (column_type, index) for table, column_type, index in cursor.fetchall()}


@pytest.mark.django_db(transaction=True)
def test_the_vector_copies_turn_to_half_precision_with_their_rows_and_back():
    apps = _migrate([("knowledge", "0020_unpublished_documents")])
    try:
        Workspace, Entity = apps.get_model("knowledge", "Workspace"), apps.get_model("knowledge", "Entity")
        Relation = apps.get_model("knowledge", "Relation")
        workspace = Workspace.objects.create(name="Old", slug="old")
        rng = np.random.default_rng(4)
        one, two = (
            Entity.objects.create(
                workspace=workspace, name=name, key=name, embedding=random_vector(rng), published=True
            )
            for name in ("one", "two")
        )
        relation = Relation.objects.create(
            workspace=workspace, source=one, target=two, embedding=random_vector(rng), published=True
        )
        assert {column for column, _ in _copy_columns().values()} == {"vector(384)"}

        _migrate([("knowledge", "0021_graph_vector_copies_in_half_precision")])
        columns = _copy_columns()
        assert {column for column, _ in columns.values()} == {"halfvec(384)"}
        assert all("halfvec_cosine_ops" in index and "ef_construction='64'" in index for _, index in columns.values())
        with connection.cursor() as cursor:
            cursor.execute("SELECT id, embedding::text FROM knowledge_entityvector ORDER BY id")
            copies = {pk: json.loads(vector) for pk, vector in cursor.fetchall()}
            # The index serves a search in the new type.
            cursor.execute(
                "SELECT id FROM knowledge_relationvector ORDER BY embedding <=> %s::halfvec LIMIT 1",
                [str(list(relation.embedding))],
            )
            assert cursor.fetchall() == [(relation.pk,)]
        assert copies == {
            one.pk: pytest.approx(list(one.embedding), abs=1e-3),
            two.pk: pytest.approx(list(two.embedding), abs=1e-3),
        }

        _migrate([("knowledge", "0020_unpublished_documents")])
        columns = _copy_columns()
        assert {column for column, _ in columns.values()} == {"vector(384)"}
        assert all("vector_cosine_ops" in index and "halfvec" not in index for _, index in columns.values())
    finally:
        executor = MigrationExecutor(connection)
        _migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db
def test_the_vector_copies_are_vacuumed_for_dead_rows_not_for_inserts():
    # An HNSW vacuum walks the whole graph; inserts alone must not start one (decision 0170).
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT relname, reloptions FROM pg_class WHERE relname IN "
            "('knowledge_entityvector', 'knowledge_relationvector', 'knowledge_chunk') ORDER BY relname"
        )
        options = dict(cursor.fetchall())
    assert options == {
        "knowledge_chunk": None,
        "knowledge_entityvector": ["autovacuum_vacuum_insert_threshold=-1"],
        "knowledge_relationvector": ["autovacuum_vacuum_insert_threshold=-1"],
    }
