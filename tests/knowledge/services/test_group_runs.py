"""Group runs (decision 0176): new small documents of one workspace taken through a turn together.

A group only saves work: the graph is the one the documents give alone, a failure stays the
document's own, and a member published alone after its group died serves none of the others.
"""

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from knowledge.models import Document, Entity, PendingRow, Relation
from knowledge.services import ingestion
from knowledge.services.ingestion import runs, steps
from tests.factories import make_workspace
from tests.knowledge.ingest_helpers import DOC_A, DOC_B, answer, graph_dump
from tests.processes import wait_for

pytestmark = pytest.mark.django_db

# Sentences the scripted model knows (FACTS in tests/knowledge/ingest_helpers.py), all about Acme Corp.
FOUNDING = "Alice Smith founded Acme Corp."
BERLIN = "Acme Corp is based in Berlin."


def _create(workspace, name: str, text: str) -> Document:
    return ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)


def _alone(texts: dict[str, str]) -> dict:
    """The graph these documents give ingested one at a time, in order."""
    workspace = make_workspace(slug="one-at-a-time")
    for name, text in texts.items():
        assert ingestion.document_ingest(document_id=_create(workspace, name, text).pk).status == "processed"
    return graph_dump(workspace)


def _passage_requests(double) -> list[list[str]]:
    """The embedding requests that carried chunks (not entity or relation names)."""
    return [
        request.body["input"]
        for request in double.embedding_requests()
        if any("." in text for text in request.body["input"])
    ]


@pytest.fixture
def scripted(openai_double):
    openai_double.reply(answer)
    return openai_double


def test_new_small_documents_run_together_and_give_the_graph_they_give_alone(scripted, workspace):
    texts = {"a.txt": DOC_A, "b.txt": DOC_B}
    documents = [_create(workspace, name, text) for name, text in texts.items()]

    done = ingestion.documents_ingest(document_ids=[document.pk for document in documents])

    assert [document.status for document in done] == ["processed", "processed"]
    # Together: the chunks of both in one embedding request, not one per document.
    assert len(_passage_requests(scripted)) == 1
    assert len(_passage_requests(scripted)[0]) == 2  # one chunk each
    together = graph_dump(workspace)
    scripted.clear()
    assert together == _alone(texts)
    assert len(_passage_requests(scripted)) == 2
    for document in done:
        assert document.entity_count > 0
        assert document.relation_count > 0
        assert {"embed_chunks", "extract", "describe", "publish"} <= set(document.timings)
    assert not PendingRow.objects.exists()


def test_a_member_published_alone_after_its_group_died_serves_none_of_the_others_sources(
    scripted, workspace, monkeypatch
):
    assert ingestion.document_ingest(document_id=_create(workspace, "p.txt", FOUNDING).pk).status == "processed"
    a = _create(workspace, "a.txt", BERLIN)
    b = _create(workspace, "b.txt", DOC_B)

    class Died(BaseException):
        """The worker's process ends here (kill -9): nothing after runs."""

    publish = steps._publish

    def die_before_a_group_publishes(documents, owner):
        if len(documents) > 1:
            raise Died
        publish(documents, owner)

    monkeypatch.setattr(steps, "_publish", die_before_a_group_publishes)
    with pytest.raises(Died):
        ingestion.documents_ingest(document_ids=[a.pk, b.pk])
    assert set(Document.objects.filter(pk__in=[a.pk, b.pk]).values_list("stage", flat=True)) == {"publishing"}
    # What the group staged under its first document describes Acme Corp with B's sources too.
    acme = Entity.objects.get(workspace=workspace, key="acme corp")
    staged = PendingRow.objects.get(document=a, kind="entity", row_id=acme.pk).values["description"]
    assert "Acme Corp employs Bob Jones." in staged

    # Its leases run out; A is taken over alone and published before B.
    Document.objects.filter(pk__in=[a.pk, b.pk]).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert ingestion.document_ingest(document_id=a.pk).status == "processed"

    acme.refresh_from_db()
    assert "Acme Corp is based in Berlin." in acme.description
    assert "Bob Jones" not in acme.description
    assert "advice" not in acme.description
    assert not Entity.objects.get(workspace=workspace, key="bob jones").published
    assert not Relation.objects.filter(workspace=workspace, published=True, source__key="bob jones").exists()

    assert ingestion.document_ingest(document_id=b.pk).status == "processed"
    assert graph_dump(workspace) == _alone({"p.txt": FOUNDING, "a.txt": BERLIN, "b.txt": DOC_B})


def test_a_file_that_cannot_be_read_fails_alone_and_the_others_run_together(scripted, workspace):
    a = _create(workspace, "a.txt", DOC_A)
    broken = _create(workspace, "broken.csv", 'name,notes\nAda,"never closed\n' + "x" * 200_000 + "\n")
    b = _create(workspace, "b.txt", DOC_B)

    done = ingestion.documents_ingest(document_ids=[a.pk, broken.pk, b.pk])

    assert [document.status for document in done] == ["processed", "failed", "processed"]
    assert done[1].error.startswith("broken.csv could not be read as CSV")
    assert len(_passage_requests(scripted)) == 1  # a and b embedded together


def test_a_step_that_fails_for_the_group_lets_each_document_go_on_alone(scripted, workspace, monkeypatch):
    failed = []

    def build_fails(documents, owner):
        failed.append([document.pk for document in documents])
        raise RuntimeError("a bug in the group's build")

    monkeypatch.setattr(steps, "_build_together", build_fails)
    texts = {"a.txt": DOC_A, "b.txt": DOC_B}
    documents = [_create(workspace, name, text) for name, text in texts.items()]

    done = ingestion.documents_ingest(document_ids=[document.pk for document in documents])

    assert failed == [[document.pk for document in documents]]
    assert [document.status for document in done] == ["processed", "processed"]
    assert [document.attempts for document in done] == [0, 0]
    assert graph_dump(workspace) == _alone(texts)


def test_a_turn_takes_the_new_small_documents_of_the_first_ones_workspace(workspace, settings):
    settings.INGEST_GROUP_DOCUMENTS = 3
    first = _create(workspace, "a.txt", "First.")
    elsewhere = _create(make_workspace(slug="elsewhere"), "b.txt", "Elsewhere.")
    version = _create(workspace, "c.txt", "A new version.")
    Document.objects.filter(pk=version.pk).update(replaces=first)
    failed_before = _create(workspace, "d.txt", "Interrupted before.")
    Document.objects.filter(pk=failed_before.pk).update(attempts=1)
    large = _create(workspace, "e.txt", "Large.")
    Document.objects.filter(pk=large.pk).update(token_count=runs.GROUP_DOCUMENT_TOKENS + 1)
    # Short but in many chunks: a group would hold a small document back until they are extracted.
    long = _create(workspace, "long.txt", "Long.")
    Document.objects.filter(pk=long.pk).update(chunk_count=steps.EXTRACT_STEP_CHUNKS + 1)
    second = _create(workspace, "f.txt", "Second.")
    third = _create(workspace, "g.txt", "Third.")
    fourth = _create(workspace, "h.txt", "Fourth.")

    assert runs._claim_group("here:1:1") == [first.pk, second.pk, third.pk]
    assert runs._claim_group("here:1:1") == [elsewhere.pk]  # a turn of its own
    assert runs._claim_group("here:1:1") == [version.pk]  # a version runs alone
    assert runs._claim_group("here:1:1") == [failed_before.pk]
    assert runs._claim_group("here:1:1") == [large.pk]
    assert runs._claim_group("here:1:1") == [long.pk]
    assert runs._claim_group("here:1:1") == [fourth.pk]
    assert runs._claim_group("here:1:1") == []


@pytest.mark.django_db(transaction=True)
def test_a_group_runs_heartbeat_extends_every_lease_and_notes_one_taken_over(workspace, settings):
    settings.INGEST_LEASE_SECONDS = 3  # a beat a second
    owner = "here:1:1"
    documents = [_create(workspace, f"{name}.txt", name) for name in ("one", "two", "three")]
    ids = [document.pk for document in documents]
    soon = timezone.now() + timedelta(seconds=3)
    Document.objects.filter(pk__in=ids).update(lease_owner=owner, lease_expires_at=soon)

    def expiry(document_id):
        return Document.objects.get(pk=document_id).lease_expires_at

    heartbeat = runs._Heartbeat(ids, owner)
    heartbeat.start()
    try:
        wait_for(lambda: all(expiry(pk) > soon for pk in ids), timeout=30, what="every lease extended")
        Document.objects.filter(pk=ids[2]).delete()  # deleted: its run finds out by itself
        later = timezone.now() + timedelta(seconds=3)
        wait_for(lambda: expiry(ids[0]) > later, timeout=30, what="the leases extended again")
        assert not heartbeat.lost
        Document.objects.filter(pk=ids[1]).update(lease_owner="elsewhere:2:2")
        wait_for(lambda: heartbeat.lost, timeout=30, what="the heartbeat noting the lost lease")
        later = timezone.now() + timedelta(seconds=3)
        wait_for(lambda: expiry(ids[0]) > later, timeout=30, what="the first lease still extended")
        assert heartbeat.is_alive()
    finally:
        heartbeat.stop()
        connection.close()
