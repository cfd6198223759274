import pytest
from django.conf import settings

from knowledge.models import Entity, EntityAlias, EntitySource, Relation, RelationSource
from knowledge.rag import graph
from tests.factories import make_chunk, make_document, make_entity

pytestmark = pytest.mark.django_db


def _records(*entities, relations=()):
    return {
        "entities": [{"name": name, "type": kind, "description": description} for name, kind, description in entities],
        "relations": [
            {"source": a, "target": b, "keywords": keywords, "description": description, "strength": strength}
            for a, b, keywords, description, strength in relations
        ],
    }


@pytest.fixture
def chunks(workspace):
    document = make_document(workspace)
    return [make_chunk(document, order=order, text=f"chunk {order}") for order in range(4)]


def test_merging_the_same_chunk_twice_adds_nothing(workspace, chunks):
    records = {chunks[0].pk: _records(("Ada", "person", "A mathematician."), ("Babbage", "person", "An inventor."))}
    records[chunks[0].pk]["relations"] = [
        {"source": "Ada", "target": "Babbage", "keywords": "work", "description": "They worked.", "strength": 4}
    ]

    first = graph.merge_chunks(workspace_id=workspace.pk, records_by_chunk=records)
    second = graph.merge_chunks(workspace_id=workspace.pk, records_by_chunk=records)

    assert first == second
    assert EntitySource.objects.count() == 2
    assert RelationSource.objects.count() == 1
    relation = Relation.objects.get()
    assert relation.source_id < relation.target_id


def test_the_type_is_the_majority_over_provenance(workspace, chunks):
    kinds = ["organization", "location", "organization", "product"]
    graph.merge_chunks(
        workspace_id=workspace.pk,
        records_by_chunk={
            chunk.pk: _records(("Acme", kind, f"Mention {i}."))
            for i, (chunk, kind) in enumerate(zip(chunks, kinds, strict=True))
        },
    )
    entity = Entity.objects.get()

    graph.rebuild_entities(entity_ids=[entity.pk])

    entity.refresh_from_db()
    assert entity.type == "organization"
    assert entity.description == "Mention 0.\nMention 1.\nMention 2.\nMention 3."


def test_a_merged_away_name_lands_on_the_surviving_entity(workspace, chunks):
    survivor = make_entity(workspace, "International Business Machines")
    EntityAlias.objects.create(workspace=workspace, key="ibm", name="IBM", entity=survivor)

    result = graph.merge_chunks(
        workspace_id=workspace.pk, records_by_chunk={chunks[0].pk: _records(("IBM", "organization", "A company."))}
    )

    assert result.entity_ids == {survivor.pk}
    assert not Entity.objects.filter(key="ibm").exists()
    assert survivor.sources.get().name == "IBM"


def test_rebuilding_after_provenance_is_gone_deletes_or_recomputes(workspace, chunks):
    graph.merge_chunks(
        workspace_id=workspace.pk,
        records_by_chunk={
            chunks[0].pk: _records(
                ("Ada", "person", "First."),
                ("Babbage", "person", "Inventor."),
                relations=[("Ada", "Babbage", "work", "Worked.", 4)],
            ),
            chunks[1].pk: _records(
                ("Ada", "person", "Second."),
                ("Babbage", "person", "Again."),
                relations=[("Ada", "Babbage", "letters", "Wrote.", 2)],
            ),
            chunks[2].pk: _records(("Lonely", "concept", "Only here.")),
        },
    )
    relation = Relation.objects.get()
    graph.rebuild_entities(entity_ids=Entity.objects.values_list("pk", flat=True))
    graph.rebuild_relations(relation_ids=[relation.pk])
    relation.refresh_from_db()
    assert (relation.weight, relation.keywords) == (6.0, "work, letters")

    chunks[0].delete()
    chunks[2].delete()
    graph.rebuild_entities(entity_ids=Entity.objects.values_list("pk", flat=True))
    graph.rebuild_relations(relation_ids=[relation.pk])

    relation.refresh_from_db()
    assert (relation.weight, relation.keywords, relation.description) == (2.0, "letters", "Wrote.")
    assert set(Entity.objects.values_list("name", "description")) == {("Ada", "Second."), ("Babbage", "Again.")}


def test_long_descriptions_are_summarized_and_map_reduced_past_the_context(workspace, chunks, openai_double, settings):
    settings.SUMMARY_TRIGGER = 2
    settings.LLM_CONTEXT_TOKENS = 700  # leaves room for ~500 tokens of fragments per call
    long = " ".join(["detail"] * 200)
    graph.merge_chunks(
        workspace_id=workspace.pk,
        records_by_chunk={
            chunk.pk: _records(("Ada", "person", f"Fact {i}: {long}.")) for i, chunk in enumerate(chunks)
        },
    )
    openai_double.reply(lambda body: f"summary of {body['messages'][1]['content'].count('- ')} fragments")

    graph.rebuild_entities(entity_ids=Entity.objects.values_list("pk", flat=True))

    calls = [request.messages[1]["content"].count("- ") for request in openai_double.chat_requests()]
    assert calls == [2, 2, 2]  # two map calls over two fragments each, then one reduce over their summaries
    assert Entity.objects.get().description == "summary of 2 fragments"


def test_without_a_chat_model_descriptions_are_fragments_within_the_token_budget(workspace, chunks, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    settings.SUMMARY_TRIGGER = 2
    settings.SUMMARY_MAX_TOKENS = 30  # two of the four ~12-token fragments
    graph.merge_chunks(
        workspace_id=workspace.pk,
        records_by_chunk={
            chunk.pk: _records(("Ada", "person", f"Fact number {i} about Ada is stated in this sentence here."))
            for i, chunk in enumerate(chunks)
        },
    )

    graph.rebuild_entities(entity_ids=Entity.objects.values_list("pk", flat=True))

    description = Entity.objects.get().description
    assert description.splitlines() == [
        "Fact number 0 about Ada is stated in this sentence here.",
        "Fact number 1 about Ada is stated in this sentence here.",
    ]


def test_a_published_entity_is_embedded_again_only_when_its_name_changes(workspace, chunks, openai_double):
    graph.merge_chunks(
        workspace_id=workspace.pk,
        records_by_chunk={chunks[0].pk: _records(("Ada", "person", "First."), ("Babbage", "person", "Inventor."))},
    )
    graph.rebuild_entities(entity_ids=Entity.objects.values_list("pk", flat=True))
    assert openai_double.embedding_requests() == []  # unpublished rows get vectors when their document is published
    Entity.objects.update(published=True, embedding=[1.0] + [0.0] * (settings.EMBEDDING_DIM - 1))
    graph.merge_chunks(
        workspace_id=workspace.pk, records_by_chunk={chunks[1].pk: _records(("ADA", "person", "Second."))}
    )

    graph.rebuild_entities(entity_ids=Entity.objects.values_list("pk", flat=True))

    ada = Entity.objects.get(key="ada")
    assert ada.description == "First.\nSecond."
    assert openai_double.embedding_requests() == []  # a vector is the name, not the description
    EntitySource.objects.filter(entity=ada, chunk=chunks[0]).delete()

    graph.rebuild_entities(entity_ids=[ada.pk])

    (request,) = openai_double.embedding_requests()
    assert request.body["input"] == ["ADA"]  # the spelling of the sources that remain


@pytest.mark.django_db(transaction=True)
def test_key_locks_need_a_transaction(workspace):
    with pytest.raises(RuntimeError, match="atomic"):
        graph.lock_entity_keys(workspace_id=workspace.pk, keys=["ada"])
