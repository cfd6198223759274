import json

import numpy as np
import pytest
from django.db import IntegrityError, connection, transaction

from knowledge.models import Entity, Relation
from knowledge.rag.graph.vectors import update_rows
from tests.factories import make_entity, make_relation, make_workspace, random_vector


def test_it_stores_one_relation_per_unordered_pair(workspace):
    alice, bob = make_entity(workspace, "Alice"), make_entity(workspace, "Bob")
    make_relation(alice, bob)

    with pytest.raises(IntegrityError), transaction.atomic():
        make_relation(bob, alice)

    assert Relation.objects.count() == 1


def test_it_refuses_a_relation_stored_in_descending_order(workspace):
    alice, bob = make_entity(workspace, "Alice"), make_entity(workspace, "Bob")

    with pytest.raises(IntegrityError, match="relation_pair_ordered"), transaction.atomic():
        Relation.objects.create(workspace=workspace, source=bob, target=alice)


def test_it_keeps_entity_keys_unique_per_workspace_only(workspace):
    other = make_workspace()
    make_entity(workspace, "Alice")
    make_entity(other, "Alice")

    with pytest.raises(IntegrityError), transaction.atomic():
        make_entity(workspace, "ALICE")


def _copies(kind: str) -> dict[int, list[float]]:
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT id, embedding::text FROM knowledge_{kind}vector")  # noqa: S608 - fixed names
        return {pk: json.loads(vector) for pk, vector in cursor.fetchall()}


def _copy_writes() -> int:
    """Rows this transaction has written to the vector copies (and so to their HNSW indexes)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT coalesce(sum(n_tup_ins + n_tup_upd), 0) FROM pg_stat_xact_user_tables "
            "WHERE relname IN ('knowledge_entityvector', 'knowledge_relationvector')"
        )
        return cursor.fetchone()[0]


def test_the_indexed_copy_of_a_graph_vector_is_written_only_when_the_vector_changes(workspace):
    rng = np.random.default_rng(5)
    alice = make_entity(workspace, "Alice", embedding=random_vector(rng))
    bob = make_entity(workspace, "Bob", embedding=random_vector(rng))
    carol = make_entity(workspace, "Carol", embedding=random_vector(rng), published=False)
    known = make_relation(alice, bob, embedding=random_vector(rng))
    pending = make_relation(bob, carol, embedding=random_vector(rng), published=False)
    assert set(_copies("entity")) == {alice.pk, bob.pk}
    assert _copies("relation") == {known.pk: pytest.approx(known.embedding, abs=1e-6)}

    # What most writes to a relation are: a new weight, a longer description.
    written = _copy_writes()
    update_rows(
        Relation,
        {known.pk: {"weight": 3.0, "description": "longer"}, pending.pk: {"weight": 2.0, "description": "kept"}},
    )
    Entity.objects.filter(pk=alice.pk).update(description="an engineer")
    assert _copy_writes() == written

    moved = random_vector(rng)
    update_rows(Relation, {known.pk: {"embedding": moved}})
    Relation.objects.filter(pk=pending.pk).update(published=True)
    copies = _copies("relation")
    assert copies[known.pk] == pytest.approx(moved, abs=1e-6)
    assert copies[pending.pk] == pytest.approx(pending.embedding, abs=1e-6)

    known.delete()
    alice.delete()
    assert set(_copies("relation")) == {pending.pk}
    assert set(_copies("entity")) == {bob.pk}
