import io
import types

import docx
import pytest
from pypdf import PdfWriter

from knowledge import ingestion, parsing
from knowledge.models import Document, Entity

pytestmark = pytest.mark.django_db


def _docx(*paragraphs: str) -> bytes:
    document = docx.Document()
    for paragraph in paragraphs:
        document.add_paragraph(paragraph)
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Revenue", "42"
    buffer = io.BytesIO()
    document.save(buffer)
    return buffer.getvalue()


def _blank_pdf() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def _text_pdf(text: str) -> bytes:
    content = f"BT /F1 12 Tf 20 100 Td ({text}) Tj ET".encode()
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = io.BytesIO(), []
    out.write(b"%PDF-1.4\n")
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def test_it_reads_text_and_markdown_and_strips_nul_bytes():
    assert parsing.parse_file("notes.txt", b"Hello\x00 team\r\nSecond line  \n") == "Hello team\nSecond line"
    assert parsing.parse_file("readme.md", b"# Title\n\nSome *text*.") == "# Title\n\nSome *text*."


def test_it_falls_back_when_the_text_is_not_utf8():
    assert parsing.parse_file("old.txt", "Café crème".encode("cp1252")) == "Café crème"
    assert parsing.parse_file("wide.txt", "Grüße".encode("utf-16")) == "Grüße"


def test_html_keeps_only_the_visible_text():
    html = b"""<html><head><title>T</title><style>p {color: red}</style></head>
    <body><script>var secret = 1;</script><h1>Report</h1><p>Acme &amp; Co grew.</p><p>Second</p></body></html>"""

    assert parsing.parse_file("page.html", html) == "Report\n\nAcme & Co grew.\n\nSecond"


def test_it_reads_docx_paragraphs_and_tables():
    text = parsing.parse_file("memo.docx", _docx("Dear team,", "The plan is ready."))

    assert "Dear team," in text
    assert "The plan is ready." in text
    assert "Revenue | 42" in text


def test_it_reads_the_text_layer_of_a_pdf():
    assert "Quarterly results" in parsing.parse_file("report.pdf", _text_pdf("Quarterly results"))


@pytest.mark.parametrize(
    ("filename", "data", "message"),
    [
        ("image.png", b"\x89PNG....", "Upload one of: .txt, .md, .markdown, .html, .htm, .pdf, .docx"),
        ("empty.txt", b"", "empty"),
        ("binary.txt", bytes(range(256)) * 10, "binary"),
    ],
)
def test_an_upload_that_cannot_be_text_is_refused_at_once_with_a_message(workspace, filename, data, message):
    with pytest.raises(ingestion.DocumentRejected, match=message):
        ingestion.document_create(workspace=workspace, filename=filename, data=data, enqueue=False)

    assert not Document.objects.exists()


@pytest.mark.parametrize(
    ("filename", "data", "message"),
    [
        ("broken.pdf", b"%PDF-1.4 nonsense", "could not be read as a PDF"),
        ("broken.docx", b"PK not a zip", "could not be read as a Word .docx file"),
        ("scan.pdf", _blank_pdf(), "No text found in scan.pdf"),
    ],
)
def test_a_file_the_worker_cannot_read_fails_with_a_message_and_adds_nothing(workspace, filename, data, message):
    document = ingestion.document_create(workspace=workspace, filename=filename, data=data, enqueue=False)

    ingestion.document_ingest(document_id=document.pk)

    document.refresh_from_db()
    assert document.status == "failed"
    assert message in document.error
    assert not document.chunks.exists()
    assert not Entity.objects.exists()


def test_the_same_file_twice_is_refused_at_upload_and_the_same_text_fails_in_the_worker(workspace, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    first = ingestion.document_create(workspace=workspace, filename="a.txt", data=b"Same words.", enqueue=False)
    with pytest.raises(ingestion.DocumentRejected, match="same text as “a.txt”"):
        ingestion.document_create(workspace=workspace, filename="again.txt", data=b"Same words.", enqueue=False)
    ingestion.document_ingest(document_id=first.pk)
    copy = ingestion.document_create(workspace=workspace, filename="copy.md", data=b"Same words.\n", enqueue=False)

    ingestion.document_ingest(document_id=copy.pk)

    copy.refresh_from_db()
    assert copy.status == "failed"
    assert "same text as “a.txt”" in copy.error


def test_pasted_text_becomes_a_pending_document_titled_by_its_first_line(workspace, owner):
    document = ingestion.document_create(
        workspace=workspace, user=owner, filename="Pasted text", text="  Meeting notes\nAlice will call.", enqueue=False
    )

    assert document.title == "Meeting notes"
    assert document.status == "pending"
    assert document.text == "Meeting notes\nAlice will call."
    assert not document.source_file
    assert document.created_by == owner


def test_an_upload_keeps_its_source_file_and_is_queued_after_commit(
    workspace, django_capture_on_commit_callbacks, settings, tmp_path, monkeypatch
):
    settings.MEDIA_ROOT = tmp_path
    queued = []
    sender = types.SimpleNamespace(send_task=queued.append)
    monkeypatch.setattr("knowledge.ingestion.uploads.current_app", sender)

    with django_capture_on_commit_callbacks(execute=True):
        document = ingestion.document_create(workspace=workspace, filename="notes.txt", data=b"Hello team.")

    assert document.title == "notes.txt"
    assert document.source_file.read() == b"Hello team."
    assert queued == ["knowledge.tasks.ingest_next"]
