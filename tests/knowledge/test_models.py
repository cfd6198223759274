import json

import numpy as np
import pytest
from django.db import IntegrityError, connection, transaction

from knowledge.models import Entity, PendingVector, Relation
from knowledge.rag.graph.vectors import copy_staged_vectors, publish_vectors, stage_vectors, update_rows
from knowledge.rag.retrieval.searches import entities_nearest, relations_nearest
from tests.factories import make_document, make_entity, make_relation, make_workspace, random_vector


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
    # In half precision (decision 0166).
    assert _copies("relation") == {known.pk: pytest.approx(known.embedding, abs=1e-3)}

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
    assert copies[known.pk] == pytest.approx(moved, abs=1e-3)
    assert copies[pending.pk] == pytest.approx(pending.embedding, abs=1e-3)

    known.delete()
    alice.delete()
    assert set(_copies("relation")) == {pending.pk}
    assert set(_copies("entity")) == {bob.pk}


@pytest.mark.parametrize("exact_scan_max", [20_000, -1], ids=["exact scan", "index"])
def test_a_new_rows_copy_is_written_when_staged_served_once_published(workspace, settings, exact_scan_max):
    settings.VECTOR_EXACT_SCAN_MAX = exact_scan_max
    rng = np.random.default_rng(6)
    alice = make_entity(workspace, "Alice", embedding=random_vector(rng))
    bob = make_entity(workspace, "Bob", published=False)
    relation = make_relation(alice, bob, published=False)
    document = make_document(workspace)
    bob_vector, relation_vector = random_vector(rng), random_vector(rng)
    stage_vectors(document_id=document.pk, kind=PendingVector.Kind.ENTITY, rows=[(bob.pk, "h", bob_vector)])
    stage_vectors(document_id=document.pk, kind=PendingVector.Kind.RELATION, rows=[(relation.pk, "h", relation_vector)])

    # Outside the publishing transaction: the HNSW inserts, which no search serves yet.
    copy_staged_vectors(document_id=document.pk, entity_ids=[bob.pk], relation_ids=[relation.pk])
    assert set(_copies("entity")) == {alice.pk, bob.pk}
    assert set(_copies("relation")) == {relation.pk}
    assert [e.pk for e in entities_nearest(workspace=workspace, vector=bob_vector, k=5)] == [alice.pk]
    assert relations_nearest(workspace=workspace, vector=relation_vector, k=5) == []

    written = _copy_writes()
    publish_vectors(document_id=document.pk, entity_ids=[bob.pk], relation_ids=[relation.pk])
    assert _copy_writes() == written  # the copies were in place
    assert bob.pk in [e.pk for e in entities_nearest(workspace=workspace, vector=bob_vector, k=5)]
    assert [r.pk for r in relations_nearest(workspace=workspace, vector=relation_vector, k=5)] == [relation.pk]


def test_a_row_published_with_another_vector_than_its_staged_copy_gets_that_vector(workspace):
    rng = np.random.default_rng(7)
    bob = make_entity(workspace, "Bob", published=False)
    first, second = make_document(workspace), make_document(workspace)
    staged, published = random_vector(rng), random_vector(rng)
    stage_vectors(document_id=first.pk, kind=PendingVector.Kind.ENTITY, rows=[(bob.pk, "h", staged)])
    copy_staged_vectors(document_id=first.pk, entity_ids=[bob.pk], relation_ids=[])
    # Another document in flight, which read the name differently, publishes first.
    stage_vectors(document_id=second.pk, kind=PendingVector.Kind.ENTITY, rows=[(bob.pk, "h2", published)])
    publish_vectors(document_id=second.pk, entity_ids=[bob.pk], relation_ids=[])

    assert _copies("entity")[bob.pk] == pytest.approx(published, abs=1e-3)
