"""Versions: a changed file uploaded again costs model calls for its changed chunks only and
gives the graph a from-scratch ingest of the new text gives."""

import pytest
from django.core.files.storage import default_storage

from knowledge.models import Chunk, Document, EntitySource, LLMCacheEntry
from knowledge.services import ingestion
from knowledge.services.ingestion import versions
from tests.factories import make_workspace
from tests.knowledge.ingest_helpers import graph_dump, meetings, parts, small_chunks

pytestmark = pytest.mark.django_db

CHUNKS = 50


def _create(workspace, name: str, text: str, **extra) -> Document:
    return ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False, **extra)


def _extractions(double) -> list[str]:
    return [
        request.messages[1]["content"]
        for request in double.chat_requests()
        if request.messages[0]["content"].startswith("You build") and len(request.messages) == 2
    ]


def _embedded_chunks(double) -> list[str]:
    texts = [text for request in double.embedding_requests() for text in request.body["input"]]
    return [text for text in texts if text.startswith("Part ")]


@pytest.fixture
def scripted(openai_double):
    openai_double.reply(meetings)
    return openai_double


def test_editing_one_paragraph_of_a_50_chunk_document_costs_its_chunk_only_and_gives_the_from_scratch_graph(
    scripted,
):
    workspace = small_chunks(make_workspace(slug="versions"))
    old_text = parts("A", CHUNKS)
    first = ingestion.document_ingest(document_id=_create(workspace, "minutes.txt", old_text).pk)
    assert first.chunk_count == CHUNKS
    new_text = old_text.replace("Person A17 meets", "Person Z17 meets")
    # Without the model's reply cache, every call the new version makes reaches the double.
    LLMCacheEntry.objects.all().delete()
    scripted.clear()

    second = _create(workspace, "minutes.txt", new_text)
    assert (second.replaces_id, second.version, second.title) == (first.pk, 2, "minutes.txt")

    served_before_publish = []

    def progress(document):
        if document.stage == Document.Stage.PUBLISHING:
            served_before_publish.append(
                (
                    Chunk.objects.filter(document=first, embedding__isnull=False).count(),
                    Chunk.objects.filter(document=second, embedding__isnull=False).count(),
                )
            )

    second = ingestion.document_ingest(document_id=second.pk, progress=progress)
    assert second.status == Document.Status.PROCESSED
    assert served_before_publish == [(CHUNKS, 0)]  # the old version served until the new one is published
    assert [text for text in _extractions(scripted) if "meets" in text] == [
        "Text:\nPart 17: Person Z17 meets Shared Person.\n\nOutput:"
    ]
    assert _embedded_chunks(scripted) == ["Part 17: Person Z17 meets Shared Person."]

    first.refresh_from_db()
    assert first.superseded_by_id == second.pk
    assert not Chunk.objects.filter(document=first, embedding__isnull=False).exists()
    assert not EntitySource.objects.filter(chunk__document=first).exists()
    assert first.text == old_text  # readable in the history
    assert [version.pk for version in versions.versions_of(document=first)] == [second.pk, first.pk]

    scratch = small_chunks(make_workspace(slug="scratch"))
    ingestion.document_ingest(document_id=_create(scratch, "minutes.txt", new_text).pk)
    assert graph_dump(workspace) == graph_dump(scratch)
    workspace.refresh_from_db()
    scratch.refresh_from_db()
    assert (workspace.chunk_count, workspace.entity_count, workspace.relation_count) == (
        scratch.chunk_count,
        scratch.entity_count,
        scratch.relation_count,
    )


def test_the_same_file_again_is_refused_as_unchanged(scripted, workspace):
    document = ingestion.document_ingest(document_id=_create(workspace, "notes.txt", parts("A", 3)).pk)
    with pytest.raises(ingestion.DocumentRejected, match="unchanged"):
        _create(workspace, "notes.txt", parts("A", 3))
    assert Document.objects.filter(workspace=workspace).count() == 1
    assert document.version == 1


def test_a_new_version_waits_for_the_current_one_to_be_read(scripted, workspace):
    _create(workspace, "notes.txt", parts("A", 3))
    with pytest.raises(ingestion.DocumentRejected, match="still being read"):
        _create(workspace, "notes.txt", parts("B", 3))


def test_an_older_version_can_be_pruned_and_the_current_one_cannot(scripted, workspace):
    first = ingestion.document_ingest(document_id=_create(workspace, "notes.txt", parts("A", 3)).pk)
    second = ingestion.document_ingest(document_id=_create(workspace, "notes.txt", parts("B", 3)).pk)
    first.refresh_from_db()
    with pytest.raises(versions.VersionRefused):
        versions.version_prune(document=second)
    before = graph_dump(workspace)
    versions.version_prune(document=first)
    assert not Document.objects.filter(pk=first.pk).exists()
    assert graph_dump(workspace) == before


def test_deleting_a_document_deletes_its_older_versions_and_their_stored_files(
    scripted, workspace, settings, tmp_path, django_capture_on_commit_callbacks
):
    settings.MEDIA_ROOT = str(tmp_path)
    first = ingestion.document_ingest(document_id=_create(workspace, "notes.txt", parts("A", 3)).pk)
    second = ingestion.document_ingest(document_id=_create(workspace, "notes.txt", parts("B", 3)).pk)
    names = [first.source_file.name, second.source_file.name]
    assert all(default_storage.exists(name) for name in names)

    with django_capture_on_commit_callbacks(execute=True):
        ingestion.document_delete(document=second)

    assert not Document.objects.filter(workspace=workspace).exists()
    assert [name for name in names if default_storage.exists(name)] == []
