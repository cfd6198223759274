import threading

import numpy as np
import pytest
from django.db import connection

from knowledge.models import (
    AuditEvent,
    Entity,
    EntityAlias,
    EntitySource,
    MergeLog,
    Relation,
    RelationSource,
    Workspace,
)
from knowledge.rag import prompts
from knowledge.rag.retrieval.searches import entity_degrees
from knowledge.services import ingestion
from knowledge.services.curation import (
    CurationError,
    entity_merge,
    entity_merge_undo,
    entity_update,
    possible_duplicates,
)
from tests.factories import make_entity, make_workspace, random_vector

FACTS = {
    "IBM builds mainframes in Armonk.": [
        "entity<|>IBM<|>organization<|>IBM builds mainframes.",
        "entity<|>Armonk<|>location<|>Armonk is a town in New York.",
        "relation<|>IBM<|>Armonk<|>headquarters<|>IBM is based in Armonk.<|>5",
    ],
    "I.B.M. opened a lab in Armonk.": [
        "entity<|>I.B.M.<|>organization<|>I.B.M. runs research labs.",
        "entity<|>Armonk<|>location<|>Armonk hosts a lab.",
        "relation<|>I.B.M.<|>Armonk<|>research<|>I.B.M. has a lab in Armonk.<|>3",
        "relation<|>I.B.M.<|>IBM<|>same company<|>I.B.M. is how IBM was once written.<|>1",
    ],
    "International Business Machines created Watson.": [
        "entity<|>International Business Machines<|>organization<|>International Business Machines is a company.",
        "entity<|>Watson<|>product<|>Watson is a question-answering system.",
        "relation<|>International Business Machines<|>Watson<|>creation<|>It created Watson.<|>4",
        "relation<|>International Business Machines<|>I.B.M.<|>name<|>The long name of I.B.M.<|>2",
    ],
    "IBM sells Watson.": [
        "entity<|>IBM<|>organization<|>IBM sells software.",
        "entity<|>Watson<|>product<|>Watson is sold by IBM.",
        "relation<|>IBM<|>Watson<|>sales<|>IBM sells Watson.<|>2",
    ],
    "I.B.M. hired Ada in Armonk.": [
        "entity<|>I.B.M.<|>organization<|>I.B.M. hires engineers.",
        "entity<|>Ada<|>person<|>Ada is an engineer.",
        "relation<|>I.B.M.<|>Ada<|>employment<|>I.B.M. hired Ada.<|>2",
    ],
}


def _answer(body: dict) -> str:
    system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
    if system.startswith("You merge descriptions"):
        return "Summary of " + str(user.count("\n- ") + 1) + " fragments."
    if len(body["messages"]) > 2:  # gleaning: nothing was missed
        return prompts.DONE_MARKER
    lines = [line for sentence, found in FACTS.items() if sentence in user for line in found]
    return "\n".join([*lines, prompts.DONE_MARKER])


@pytest.fixture
def scripted(openai_double):
    openai_double.reply(_answer)
    return openai_double


def _ingest(workspace, name: str, text: str):
    document = ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
    return ingestion.document_ingest(document_id=document.pk)


@pytest.fixture
def ibm(scripted, workspace):
    _ingest(workspace, "one.txt", "IBM builds mainframes in Armonk.\n\nI.B.M. opened a lab in Armonk.")
    _ingest(workspace, "two.txt", "International Business Machines created Watson.")
    _ingest(workspace, "three.txt", "IBM sells Watson.")
    return {entity.key: entity for entity in Entity.objects.filter(workspace=workspace)}


def _rows(model, **where) -> list[dict]:
    rows = []
    for row in model.objects.filter(**where).order_by("pk").values():
        if row.get("embedding") is not None:
            row["embedding"] = np.asarray(row["embedding"]).tolist()
        rows.append(row)
    return rows


def full_dump(workspace) -> dict:
    """Every row of the graph with every column, ids, vectors and timestamps included."""
    return {
        "entities": _rows(Entity, workspace=workspace),
        "relations": _rows(Relation, workspace=workspace),
        "entity_sources": _rows(EntitySource, entity__workspace=workspace),
        "relation_sources": _rows(RelationSource, relation__workspace=workspace),
        "aliases": _rows(EntityAlias, workspace=workspace),
        "counts": Workspace.objects.filter(pk=workspace.pk).values("entity_count", "relation_count").get(),
    }


def _pairs(workspace) -> dict[tuple[str, str], float]:
    return {
        tuple(sorted((relation.source.key, relation.target.key))): relation.weight
        for relation in Relation.objects.filter(workspace=workspace).select_related("source", "target")
    }


def test_the_fixture_graph_has_the_duplicates_to_merge(ibm, workspace):
    assert set(ibm) == {"ibm", "i.b.m.", "international business machines", "armonk", "watson"}
    assert _pairs(workspace)[("i.b.m.", "ibm")] == 1.0


def test_it_merges_relations_provenance_and_names_into_the_survivor(ibm, workspace, owner):
    survivor = ibm["ibm"]
    old_vector = np.asarray(survivor.embedding).tolist()

    log = entity_merge(survivor=survivor, others=[ibm["i.b.m."], ibm["international business machines"]], actor=owner)

    assert set(Entity.objects.filter(workspace=workspace).values_list("key", flat=True)) == {"ibm", "armonk", "watson"}
    # Duplicate pairs combined (weights summed), self-loops (IBM - I.B.M., I.B.M. - IBM long name) dropped.
    assert _pairs(workspace) == {("armonk", "ibm"): 8.0, ("ibm", "watson"): 6.0}
    survivor.refresh_from_db()
    sources = sorted(survivor.sources.values_list("chunk__document__title", "name"))
    assert sources == [("one.txt", "IBM"), ("three.txt", "IBM"), ("two.txt", "International Business Machines")]
    one = survivor.sources.get(chunk__document__title="one.txt")
    assert one.description == "IBM builds mainframes.\nI.B.M. runs research labs."
    assert "I.B.M. runs research labs." in survivor.description
    # Its name and its description's first line are what it was embedded from, and they stay.
    assert np.asarray(survivor.embedding).tolist() == old_vector
    aliases = dict(EntityAlias.objects.filter(workspace=workspace).values_list("key", "entity_id"))
    assert aliases == {"i.b.m.": survivor.pk, "international business machines": survivor.pk}
    workspace.refresh_from_db()
    assert (workspace.entity_count, workspace.relation_count) == (3, 2)
    assert (log.survivor_name, log.merged_names) == ("IBM", ["I.B.M.", "International Business Machines"])
    event = AuditEvent.objects.get(workspace=workspace, action="entity.merge")
    assert (event.actor, event.summary) == (owner, "Merged I.B.M., International Business Machines into IBM")


def test_undo_gives_back_exactly_the_graph_before(ibm, workspace, owner):
    before = full_dump(workspace)

    log = entity_merge(survivor=ibm["ibm"], others=[ibm["i.b.m."], ibm["international business machines"]], actor=owner)
    assert full_dump(workspace) != before
    entity_merge_undo(merge_log=log, actor=owner)

    assert full_dump(workspace) == before
    log.refresh_from_db()
    assert log.undone_at is not None
    assert AuditEvent.objects.filter(workspace=workspace, action="entity.unmerge").count() == 1


def test_it_keeps_existing_aliases_through_merge_and_undo(ibm, workspace, owner):
    EntityAlias.objects.create(workspace=workspace, key="big blue", name="Big Blue", entity=ibm["i.b.m."])
    before = full_dump(workspace)

    log = entity_merge(survivor=ibm["ibm"], others=[ibm["i.b.m."]], actor=owner)
    assert EntityAlias.objects.get(key="big blue").entity_id == ibm["ibm"].pk
    entity_merge_undo(merge_log=log, actor=owner)

    assert full_dump(workspace) == before


def test_an_alias_catches_a_later_documents_mention(ibm, workspace, owner):
    entity_merge(survivor=ibm["ibm"], others=[ibm["i.b.m."]], actor=owner)

    _ingest(workspace, "four.txt", "I.B.M. hired Ada in Armonk.")

    assert not Entity.objects.filter(workspace=workspace, key="i.b.m.").exists()
    survivor = Entity.objects.get(pk=ibm["ibm"].pk)
    assert survivor.sources.filter(chunk__document__title="four.txt", name="I.B.M.").exists()
    assert ("ada", "ibm") in _pairs(workspace)


def test_undo_after_a_later_document_restores_the_old_rows_and_keeps_the_new_mention(ibm, workspace, owner):
    merged_away = ibm["i.b.m."]
    before = full_dump(workspace)
    log = entity_merge(survivor=ibm["ibm"], others=[merged_away], actor=owner)
    _ingest(workspace, "four.txt", "I.B.M. hired Ada in Armonk.")

    entity_merge_undo(merge_log=log, actor=owner)

    restored = Entity.objects.get(pk=merged_away.pk)
    assert (restored.key, restored.description) == ("i.b.m.", merged_away.description)
    after = full_dump(workspace)
    assert [row for row in after["entity_sources"] if row["entity_id"] == merged_away.pk] == [
        row for row in before["entity_sources"] if row["entity_id"] == merged_away.pk
    ]
    assert Entity.objects.get(pk=ibm["ibm"].pk).sources.filter(chunk__document__title="four.txt").exists()
    assert not EntityAlias.objects.filter(workspace=workspace).exists()


def test_it_undoes_merges_newest_first_and_only_once(ibm, workspace, owner):
    first = entity_merge(survivor=ibm["ibm"], others=[ibm["i.b.m."]], actor=owner)
    second = entity_merge(survivor=ibm["ibm"], others=[ibm["international business machines"]], actor=owner)

    with pytest.raises(CurationError, match="Undo the later merge into IBM first"):
        entity_merge_undo(merge_log=first, actor=owner)
    entity_merge_undo(merge_log=second, actor=owner)
    entity_merge_undo(merge_log=first, actor=owner)
    with pytest.raises(CurationError, match="already been undone"):
        entity_merge_undo(merge_log=first, actor=owner)
    assert MergeLog.objects.filter(undone_at=None).count() == 0


def _counted_degrees(workspace) -> dict[str, int]:
    degrees = dict.fromkeys(Entity.objects.filter(workspace=workspace).values_list("key", flat=True), 0)
    for relation in Relation.objects.filter(workspace=workspace).select_related("source", "target"):
        degrees[relation.source.key] += 1
        degrees[relation.target.key] += 1
    return degrees


def _stored_degrees(workspace) -> dict[str, int]:
    entities = dict(Entity.objects.filter(workspace=workspace).values_list("pk", "key"))
    return {entities[pk]: degree for pk, degree in entity_degrees(entity_ids=entities).items()}


def test_stored_degrees_follow_ingestion_merge_undo_and_deletion(ibm, workspace, owner):
    assert (
        _stored_degrees(workspace)
        == _counted_degrees(workspace)
        == {
            "ibm": 3,
            "i.b.m.": 3,
            "international business machines": 2,
            "armonk": 2,
            "watson": 2,
        }
    )

    log = entity_merge(survivor=ibm["ibm"], others=[ibm["i.b.m."], ibm["international business machines"]], actor=owner)
    assert _stored_degrees(workspace) == _counted_degrees(workspace) == {"ibm": 2, "armonk": 1, "watson": 1}

    _ingest(workspace, "four.txt", "I.B.M. hired Ada in Armonk.")
    assert _stored_degrees(workspace) == _counted_degrees(workspace) == {"ibm": 3, "armonk": 1, "watson": 1, "ada": 1}

    entity_merge_undo(merge_log=log, actor=owner)
    assert _stored_degrees(workspace) == _counted_degrees(workspace)
    assert _stored_degrees(workspace)["i.b.m."] == 3

    ingestion.document_delete(document=workspace.documents.get(title="one.txt"))
    assert _stored_degrees(workspace) == _counted_degrees(workspace)
    assert "armonk" not in _stored_degrees(workspace)


def test_it_refuses_to_merge_across_workspaces_or_with_nothing(ibm, workspace, owner):
    elsewhere = make_entity(make_workspace(slug="elsewhere"), "IBM")

    with pytest.raises(CurationError, match="another workspace"):
        entity_merge(survivor=ibm["ibm"], others=[elsewhere], actor=owner)
    with pytest.raises(CurationError, match="at least one other"):
        entity_merge(survivor=ibm["ibm"], others=[ibm["ibm"]], actor=owner)
    assert Entity.objects.filter(pk=elsewhere.pk).exists()


def test_editing_an_entity_re_embeds_it_and_keeps_the_old_name_as_alias(ibm, workspace, owner, scripted):
    watson = ibm["watson"]
    old_vector = np.asarray(watson.embedding).tolist()
    embeddings_before = len(scripted.embedding_requests())

    entity_update(entity=watson, actor=owner, name="IBM Watson", type="product", description="A question answerer.")

    watson.refresh_from_db()
    assert (watson.name, watson.key, watson.description) == ("IBM Watson", "ibm watson", "A question answerer.")
    assert len(scripted.embedding_requests()) == embeddings_before + 1
    assert np.asarray(watson.embedding).tolist() != old_vector
    assert EntityAlias.objects.get(workspace=workspace, key="watson").entity_id == watson.pk
    assert AuditEvent.objects.get(workspace=workspace, action="entity.update").detail["name"]["from"] == "Watson"


def test_editing_refuses_a_name_another_entity_has(ibm, owner):
    with pytest.raises(CurationError, match="merge the two instead"):
        entity_update(entity=ibm["watson"], actor=owner, name="ibm", type="product", description="")


def test_it_lists_possible_duplicates_by_name_and_by_vector(workspace):
    rng = np.random.default_rng(7)
    shared = random_vector(rng)
    near = (np.asarray(shared) + 0.05 * np.asarray(random_vector(rng))).tolist()
    a = make_entity(workspace, "Acme Corporation", embedding=random_vector(rng))
    b = make_entity(workspace, "Acme Corporatoin", embedding=random_vector(rng))
    c = make_entity(workspace, "Big Blue", embedding=shared)
    d = make_entity(workspace, "IBM", embedding=near)
    make_entity(workspace, "Unrelated Thing", embedding=random_vector(rng))

    pairs = possible_duplicates(workspace=workspace, name_threshold=0.85, cosine_threshold=0.95)

    found = {frozenset((pair.first.pk, pair.second.pk)): pair for pair in pairs}
    assert set(found) == {frozenset((a.pk, b.pk)), frozenset((c.pk, d.pk))}
    assert found[frozenset((a.pk, b.pk))].name_similarity > 0.9
    assert found[frozenset((c.pk, d.pk))].cosine > 0.95
    assert possible_duplicates(workspace=workspace, name_threshold=0.99, cosine_threshold=0.999) == []


@pytest.mark.django_db(transaction=True)
def test_a_merge_while_a_document_is_ingested_leaves_a_consistent_graph(scripted, owner):
    workspace = make_workspace(slug="race", members={owner: "owner"})
    _ingest(workspace, "one.txt", "IBM builds mainframes in Armonk.\n\nI.B.M. opened a lab in Armonk.")
    _ingest(workspace, "two.txt", "International Business Machines created Watson.")
    survivor = Entity.objects.get(workspace=workspace, key="ibm")
    others = list(Entity.objects.filter(workspace=workspace, key__in=["i.b.m.", "international business machines"]))
    later = ingestion.document_create(
        workspace=workspace, filename="four.txt", data=b"I.B.M. hired Ada in Armonk.", enqueue=False
    )
    # The document's extraction is held until the merge is done, so the merge provably lands
    # between the document reading "I.B.M." and merging it into the graph.
    extracting, merged, happened, errors = threading.Event(), threading.Event(), [], []

    def held(body):
        if len(body["messages"]) == 2 and "I.B.M. hired Ada" in body["messages"][1]["content"]:
            happened.append("extraction asked")
            extracting.set()
            merged.wait(timeout=60)
            happened.append("extraction answered")
        return _answer(body)

    scripted.reply(held)

    def ingest():
        ingestion.document_ingest(document_id=later.pk)
        happened.append("document ingested")

    def merge():
        assert extracting.wait(timeout=60), "the document never asked for its extraction"
        entity_merge(survivor=survivor, others=others, actor=owner)
        happened.append("merge done")
        merged.set()

    def run(work):
        try:
            work()
        except Exception as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            merged.set()
            connection.close()

    threads = [threading.Thread(target=run, args=(work,)) for work in (ingest, merge)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert happened == ["extraction asked", "merge done", "extraction answered", "document ingested"]
    keys = set(Entity.objects.filter(workspace=workspace).values_list("key", flat=True))
    assert keys == {"ibm", "armonk", "watson", "ada"}
    assert Entity.objects.get(key="ibm").sources.filter(chunk__document=later).exists()
    for relation in Relation.objects.filter(workspace=workspace):
        assert relation.source_id < relation.target_id
        strengths = list(relation.sources.values_list("strength", flat=True))
        assert strengths, f"relation {relation.pk} has no provenance"
        assert relation.weight == sum(strengths)
    assert not Entity.objects.filter(workspace=workspace, sources__isnull=True).exists()
    assert _pairs(workspace) == {("armonk", "ibm"): 8.0, ("ibm", "watson"): 4.0, ("ada", "ibm"): 2.0}
    workspace.refresh_from_db()
    assert (workspace.entity_count, workspace.relation_count) == (4, 3)
