import io
import json

import pytest
from django.contrib.messages import get_messages
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse
from pypdf import PdfWriter

from knowledge.models import Document, Role
from knowledge.services import ingestion
from tests.factories import make_user

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


def upload_url(workspace) -> str:
    return reverse("knowledge:upload", args=[workspace.slug])


def _blank_pdf() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def _stored_files(media) -> list:
    return [path for path in media.rglob("*") if path.is_file()]


def _upload(client, workspace, *files, **fields):
    return client.post(upload_url(workspace), {"files": list(files), **fields})


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("empty.txt", b"", "empty"),
        ("data.exe", b"MZ\x90\x00 some program", "is not supported"),
        ("binary.txt", bytes(range(256)) * 8, "not text"),
    ],
    ids=["empty", "unsupported-type", "binary-named-txt"],
)
def test_it_refuses_a_bad_file_with_a_message_and_stores_nothing(
    editor_client, workspace, media, name, content, message
):
    response = _upload(editor_client, workspace, SimpleUploadedFile(name, content))

    assert response.status_code == 200
    results = response.context["results"]
    assert len(results) == 1
    level, text = results[0]["level"], results[0]["message"]
    assert level == "error"
    assert name in text
    assert message.lower() in text.lower()
    assert not Document.objects.exists()
    assert _stored_files(media) == []


def test_a_pdf_without_text_is_queued_and_fails_in_the_worker_with_what_to_do(editor_client, workspace, media):
    response = _upload(editor_client, workspace, SimpleUploadedFile("scan.pdf", _blank_pdf()))

    assert response.status_code == 302  # accepted: reading it is the worker's job, off the request
    document = Document.objects.get()
    ingestion.document_ingest(document_id=document.pk)
    document.refresh_from_db()
    assert document.status == "failed"
    assert "needs text recognition" in document.error


def test_it_refuses_a_file_over_the_size_limit_before_parsing_it(editor_client, workspace, media, settings):
    settings.UPLOAD_MAX_MB = 1
    big = SimpleUploadedFile("big.txt", b"word " * (2**20 // 5 + 10))

    response = _upload(editor_client, workspace, big)

    assert response.context["results"] == [
        {"name": "big.txt", "level": "error", "message": "big.txt is larger than the 1 MB upload limit."}
    ]
    assert not Document.objects.exists()
    assert _stored_files(media) == []


def test_it_ingests_several_files_and_pasted_text_in_one_go(
    editor_client, workspace, media, django_capture_on_commit_callbacks
):
    files = [
        SimpleUploadedFile("notes.txt", b"Ada Lovelace wrote the first program."),
        SimpleUploadedFile("guide.md", b"# Guide\n\nCharles Babbage designed the Analytical Engine."),
    ]
    with django_capture_on_commit_callbacks() as queued:
        response = _upload(editor_client, workspace, *files, text="Grace Hopper wrote a compiler.", title="Hopper note")

    assert response.status_code == 302
    assert response.url == reverse("knowledge:documents", args=[workspace.slug])
    titles = set(Document.objects.filter(workspace=workspace).values_list("title", flat=True))
    assert titles == {"notes.txt", "guide.md", "Hopper note"}
    assert set(Document.objects.values_list("status", flat=True)) == {"pending"}
    assert len(_stored_files(media)) == 2  # the pasted text has no source file
    assert len(queued) >= 3  # each document's ingestion task is sent once the upload commits
    messages = [str(message) for message in get_messages(response.wsgi_request)]
    assert any(message.startswith("notes.txt: queued") for message in messages)


def test_it_reports_each_file_and_keeps_the_good_ones(editor_client, workspace, media):
    good = SimpleUploadedFile("good.txt", b"Marie Curie discovered polonium.")
    empty = SimpleUploadedFile("empty.txt", b"")

    response = _upload(editor_client, workspace, good, empty)

    assert [result["level"] for result in response.context["results"]] == ["success", "error"]
    assert response.context["results"][1]["message"] == "empty.txt is empty."
    assert list(Document.objects.values_list("title", flat=True)) == ["good.txt"]
    # Each outcome is shown once: listed on the page, not repeated as a flash message.
    assert response.content.decode().count("empty.txt is empty.") == 1
    assert list(get_messages(response.wsgi_request)) == []


def test_it_reports_a_duplicate_instead_of_ingesting_it_twice(editor_client, workspace):
    _upload(editor_client, workspace, SimpleUploadedFile("first.txt", b"The same words."))

    response = _upload(editor_client, workspace, SimpleUploadedFile("second.txt", b"The same words."))

    [result] = response.context["results"]
    level, text = result["level"], result["message"]
    assert level == "error"
    assert "same text" in text
    assert Document.objects.count() == 1


def test_it_asks_for_a_file_or_text(editor_client, workspace):
    response = editor_client.post(upload_url(workspace), {"text": "   "})

    assert response.status_code == 400
    assert "Choose at least one file or paste some text." in response.content.decode()


def test_a_viewer_cannot_upload(client, workspace):
    viewer = make_user("viewer")
    workspace.memberships.create(user=viewer, role=Role.VIEWER)
    client.force_login(viewer)

    response = _upload(client, workspace, SimpleUploadedFile("notes.txt", b"Some text."))

    assert response.status_code == 403
    assert not Document.objects.exists()


def test_it_retries_a_failed_document_and_deletes_one_after_confirmation(editor_client, workspace):
    _upload(editor_client, workspace, SimpleUploadedFile("notes.txt", b"Ada Lovelace wrote the first program."))
    document = Document.objects.get()
    Document.objects.filter(pk=document.pk).update(status="failed", error="The model timed out.")

    row = editor_client.post(
        reverse("knowledge:document_retry", args=[workspace.slug, document.pk]), headers={"HX-Request": "true"}
    )
    assert row.status_code == 200
    assert f'id="document-{document.pk}"' in row.content.decode()
    document.refresh_from_db()
    assert (document.status, document.error) == ("pending", "")

    confirm = editor_client.get(reverse("knowledge:document_delete", args=[workspace.slug, document.pk]))
    assert "cannot be undone" in confirm.content.decode()
    editor_client.post(reverse("knowledge:document_delete", args=[workspace.slug, document.pk]))
    assert not Document.objects.exists()


def test_it_keeps_titles_apart_by_extension_and_folder_and_a_same_name_is_a_new_version(
    editor_client, workspace, media
):
    files = [
        SimpleUploadedFile("report.txt", b"Ada Lovelace wrote the first program."),
        SimpleUploadedFile("report.md", b"Charles Babbage designed the Analytical Engine."),
        SimpleUploadedFile("index.md", b"Grace Hopper wrote a compiler."),
        SimpleUploadedFile("index.md", b"Alan Turing described a universal machine."),
    ]
    _upload(
        editor_client, workspace, *files, path=["report.txt", "report.md", "guides/index.md", "../notes/./index.md"]
    )
    # The same name is the next version of report.txt, which must be read first (versions).
    response = _upload(editor_client, workspace, SimpleUploadedFile("report.txt", b"A second report, other words."))
    assert "report.txt: “report.txt” is still being read" in response.content.decode()

    titles = set(Document.objects.filter(workspace=workspace).values_list("title", flat=True))
    assert titles == {"report.txt", "report.md", "guides/index.md", "notes/index.md"}
    assert set(Document.objects.values_list("original_filename", flat=True)) == {"report.txt", "report.md", "index.md"}


def test_it_answers_a_scripted_upload_with_each_outcome_as_json(editor_client, workspace, media):
    response = editor_client.post(
        upload_url(workspace),
        {"files": [SimpleUploadedFile("notes.txt", b"Ada Lovelace wrote the first program.")], "path": ["a/notes.txt"]},
        HTTP_ACCEPT="application/json",
    )

    [result] = response.json()["results"]
    document = Document.objects.get()
    assert result == {
        "name": "a/notes.txt",
        "level": "success",
        "message": "a/notes.txt: queued as “a/notes.txt”.",
        "document": {
            "id": document.pk,
            "title": "a/notes.txt",
            "url": reverse("knowledge:document", args=[workspace.slug, document.pk]),
        },
    }
    assert list(get_messages(response.wsgi_request)) == []

    refused = editor_client.post(upload_url(workspace), {"text": " "}, HTTP_ACCEPT="application/json")
    assert refused.status_code == 400
    assert "Choose at least one file" in refused.json()["error"]


def test_it_refuses_uploads_past_the_limit_with_429_and_retry_after(
    editor_client, workspace, media, settings, ten_seconds_into_an_hour
):
    settings.RATE_LIMIT_UPLOAD = (2, 3600)
    files = [SimpleUploadedFile(f"note{n}.txt", f"Note number {n} about the plan.".encode()) for n in range(3)]

    accepted = [
        editor_client.post(upload_url(workspace), {"files": [file]}, HTTP_ACCEPT="application/json") for file in files
    ]

    assert [response.status_code for response in accepted] == [200, 200, 429]
    assert "Too many uploads for now; try again in" in accepted[-1].json()["error"]
    assert int(accepted[-1]["Retry-After"]) == 3590
    assert Document.objects.count() == 2
    # Without script, the page says it above the form.
    page = _upload(editor_client, workspace, SimpleUploadedFile("late.txt", b"Late note."))
    assert page.status_code == 429
    assert "Too many uploads" in page.content.decode()


def test_it_counts_every_file_of_one_request_against_the_upload_limit(editor_client, workspace, media, settings):
    settings.RATE_LIMIT_UPLOAD = (2, 3600)
    files = [SimpleUploadedFile(f"note{n}.txt", f"Note number {n} about the plan.".encode()) for n in range(3)]

    response = _upload(editor_client, workspace, *files)

    assert response.status_code == 429
    assert Document.objects.count() == 0


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (
            b"%PDF-1.7\n" + bytes(range(256)) * 8,
            "is not text: it was detected as application/pdf (.pdf). Rename it to .pdf",
        ),
        (b"MZ\x90\x00" + bytes(range(256)) * 8, "is not text: it was detected as application/x-msdownload (.exe)"),
        (bytes(range(256)) * 8, "is not text: 216 of its first 2048 bytes are control characters"),
    ],
    ids=["pdf", "program", "unknown"],
)
def test_a_binary_file_named_txt_is_refused_with_what_was_detected(editor_client, workspace, content, said):
    response = _upload(editor_client, workspace, SimpleUploadedFile("notes.txt", content))

    [result] = response.context["results"]
    assert result["message"].startswith(f"notes.txt {said}")
    # Not the list of every accepted type, .txt among them.
    assert ".docx" not in result["message"]


SCRIPT_NAME = "<script>alert('name')</script>.txt"


def test_a_file_name_with_markup_is_kept_whole_and_shown_escaped(editor_client, workspace, media):
    """The page's script sends the name as the browser has it; Django's parser would cut it at the
    slash of `</script>`."""
    uploaded = SimpleUploadedFile(SCRIPT_NAME, b"Ada Lovelace wrote the first program.")

    response = _upload(editor_client, workspace, uploaded, path=[SCRIPT_NAME], name=[SCRIPT_NAME])

    assert response.status_code == 302
    document = Document.objects.get()
    assert (document.title, document.original_filename) == (SCRIPT_NAME, SCRIPT_NAME)
    assert document.source_file.read() == b"Ada Lovelace wrote the first program."
    listing = editor_client.get(reverse("knowledge:documents", args=[workspace.slug])).content.decode()
    assert "&lt;script&gt;alert(&#x27;name&#x27;)&lt;/script&gt;.txt" in listing
    assert "<script>alert(" not in listing


def test_an_upload_is_recorded_in_the_audit_log(editor_client, workspace, media):
    _upload(editor_client, workspace, SimpleUploadedFile("notes.txt", b"Ada Lovelace wrote the first program."))
    editor_client.post(upload_url(workspace), {"text": "Grace Hopper wrote a compiler.", "title": "Hopper"})

    events = list(workspace.audit_events.order_by("created_at").values("action", "summary", "actor__username"))
    assert events == [
        {"action": "document.upload", "summary": "Uploaded document “notes.txt”", "actor__username": "editor"},
        {"action": "document.upload", "summary": "Pasted “Hopper”", "actor__username": "editor"},
    ]
    first = workspace.audit_events.order_by("created_at").first()
    assert first.detail == {
        "document_id": Document.objects.get(title="notes.txt").pk,
        "title": "notes.txt",
        "filename": "notes.txt",
        "bytes": 37,
    }


def test_an_oversized_upload_is_refused_from_its_length_before_its_body_is_read(settings):
    """In front of Django, whose ASGI handler reads the whole body before any view runs."""
    from asgiref.sync import async_to_sync

    from config.asgi import application

    settings.UPLOAD_MAX_MB = 50
    sent = []

    async def receive():
        raise AssertionError("the body was read")

    async def send(message):
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/workspaces/acme/documents/upload/",
        "query_string": b"",
        "headers": [
            (b"host", b"localhost"),
            (b"accept", b"application/json"),
            (b"content-type", b"multipart/form-data; boundary=x"),
            (b"content-length", str(60 * 2**20).encode()),
        ],
    }

    async_to_sync(application)(scope, receive, send)

    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"]) == {"error": "This upload is larger than the 50 MB upload limit."}
