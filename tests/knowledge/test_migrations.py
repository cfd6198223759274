"""Migrations that move data, run on data."""

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
