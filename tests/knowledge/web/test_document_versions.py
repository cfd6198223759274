"""The document page: tags and the enabled flag, "replace" and the history of versions."""

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from knowledge.models import Document, Role
from knowledge.services import ingestion
from tests.factories import make_user
from tests.knowledge.ingest_helpers import meetings, parts

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def media(settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path
    return tmp_path


@pytest.fixture
def editor_client(client, workspace):
    editor = make_user("editor")
    workspace.memberships.create(user=editor, role=Role.EDITOR)
    client.force_login(editor)
    return client


def _url(name, document):
    return reverse(f"knowledge:{name}", args=[document.workspace.slug, document.pk])


def _ingested(workspace, name, text):
    document = ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
    return ingestion.document_ingest(document_id=document.pk)


def _messages(response) -> list[str]:
    return [str(message) for message in get_messages(response.wsgi_request)]


def test_it_labels_a_document_with_tags_and_disables_it(editor_client, workspace, openai_double):
    openai_double.reply(meetings)
    document = _ingested(workspace, "minutes.txt", parts("A", 2))

    response = editor_client.post(_url("document_label", document), {"tags": "Handbook, legal , handbook"})

    document.refresh_from_db()
    workspace.refresh_from_db()
    assert (document.tags, document.enabled, workspace.disabled_documents) == (["handbook", "legal"], False, 1)
    assert _messages(response) == ["Saved the tags of “minutes.txt”."]
    page = editor_client.get(_url("document", document)).content.decode()
    assert "disabled: questions do not read it" in page
    assert '<span class="badge">legal</span>' in page


def test_it_refuses_a_tag_a_model_name_cannot_carry(editor_client, workspace, openai_double):
    openai_double.reply(meetings)
    document = _ingested(workspace, "minutes.txt", parts("A", 2))

    response = editor_client.post(_url("document_label", document), {"tags": "a/b", "enabled": "on"})

    assert _messages(response) == ["“a/b”: a tag cannot contain “/” or “:”."]
    document.refresh_from_db()
    assert document.tags == []


def test_replace_makes_the_next_version_and_the_history_shows_both(editor_client, workspace, openai_double):
    openai_double.reply(meetings)
    first = _ingested(workspace, "minutes.txt", parts("A", 3))
    editor_client.post(_url("document_label", first), {"tags": "team", "enabled": "on"})

    response = editor_client.post(
        _url("document_replace", first), {"file": SimpleUploadedFile("minutes-v2.txt", parts("B", 3).encode())}
    )

    second = Document.objects.get(replaces=first)
    assert response.url == _url("document", second)
    assert (second.version, second.title, second.tags) == (2, "minutes.txt", ["team"])
    assert _messages(response)[-1] == "minutes-v2.txt: queued version 2 of “minutes.txt”."
    ingestion.document_ingest(document_id=second.pk)

    page = editor_client.get(_url("document", second)).content.decode()
    assert "History" in page
    assert _url("document", first) in page
    old_page = editor_client.get(_url("document", first)).content.decode()
    assert "This is an older version" in old_page
    listed = editor_client.get(reverse("knowledge:documents", args=[workspace.slug])).content.decode()
    assert f"document-{second.pk}" in listed
    assert f"document-{first.pk}" not in listed

    response = editor_client.post(_url("document_version_prune", first))
    assert response.url == _url("document", second)
    assert not Document.objects.filter(pk=first.pk).exists()


def test_upload_tags_what_it_brings(editor_client, workspace):
    editor_client.post(
        reverse("knowledge:upload", args=[workspace.slug]),
        {"files": [SimpleUploadedFile("a.txt", b"Ada wrote programs.")], "tags": "History, people"},
    )

    assert Document.objects.get(workspace=workspace).tags == ["history", "people"]
