import pytest
from django.db import IntegrityError, transaction

from knowledge.models import Relation
from tests.factories import make_entity, make_relation, make_workspace


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
