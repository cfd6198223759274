import email.message
import io
import json
import tracemalloc
import types
import zipfile

import docx
import pytest
import yaml
from lxml import etree
from pypdf import PdfWriter

from knowledge.models import Document, Entity
from knowledge.rag import parsing
from knowledge.services import ingestion
from tests.knowledge.documents import (
    SPHINX_PAGE,
    epub_book,
    odt_document,
    pdf_report,
    pptx_deck,
    text_pdf,
    xlsx_workbook,
)

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


def _encrypted_pdf() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    writer.encrypt("secret")
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def _blank_pdf() -> bytes:
    writer = PdfWriter()
    writer.add_blank_page(width=200, height=200)
    buffer = io.BytesIO()
    writer.write(buffer)
    return buffer.getvalue()


def _text_of(filename: str, data: bytes, **limits) -> str:
    return parsing.parse_file(filename, data, limits=parsing.Limits(**limits)).text


def test_it_reads_text_and_markdown_and_strips_nul_bytes():
    assert _text_of("notes.txt", b"Hello\x00 team\r\nSecond line  \n") == "Hello team\nSecond line"
    assert _text_of("readme.md", b"# Title\n\nSome *text*.") == "# Title\n\nSome *text*."


def test_it_falls_back_when_the_text_is_not_utf8():
    assert _text_of("old.txt", "Café crème".encode("cp1252")) == "Café crème"
    assert _text_of("wide.txt", "Grüße".encode("utf-16")) == "Grüße"


def test_a_small_html_page_keeps_its_visible_text_and_headings():
    html = b"""<html><head><title>T</title><style>p {color: red}</style></head>
    <body><script>var secret = 1;</script><h1>Report</h1><p>Acme &amp; Co grew.</p><p>Second</p></body></html>"""

    parsed = parsing.parse_file("page.html", html)

    assert parsed.text == "Report\n\nAcme & Co grew.\n\nSecond"
    assert parsed.sections == (parsing.Section(("Report",), 0, len(parsed.text)),)


def test_a_documentation_page_keeps_its_main_content_without_navigation_sidebar_or_footer():
    parsed = parsing.parse_file("sorting.html", SPHINX_PAGE.encode())

    for boilerplate in ("Previous topic", "Next topic", "Quick search", "Show Source", "Navigation", "Copyright"):
        assert boilerplate not in parsed.text
    assert "modules |" not in parsed.text
    assert "Python lists have a built-in list.sort() method" in parsed.text
    assert ">>> sorted([5, 2, 3, 1, 4])\n[1, 2, 3, 4, 5]" in parsed.text  # a code block keeps its lines
    assert "- The reverse parameter still maintains sort stability." in parsed.text  # a list item
    assert "Function | Purpose\nsorted() | Builds a new sorted list" in parsed.text  # a table's rows
    assert [section.path for section in parsed.sections] == [
        ("Sorting HOW TO",),
        ("Sorting HOW TO", "Sorting Basics"),
        ("Sorting HOW TO", "Sorting Basics", "Key Functions"),
        ("Sorting HOW TO", "Odds and Ends"),
    ]


# The layout asciidoc gives every manual page (git-doc's, for one): the title and the NAME line
# sit in a header block above the content.
MANUAL_PAGE = """<html><head><title>git-frob(1)</title></head><body class="manpage">
<div id="header"><h1>git-frob(1) Manual Page</h1><h2>NAME</h2>
<div class="sectionbody"><p>git-frob - Rewrite every commit in reverse order</p></div></div>
<div id="content"><div class="sect1"><h2 id="_synopsis">SYNOPSIS</h2><div class="sectionbody">
<div class="verseblock"><pre class="content">git frob [--dry-run] [&lt;commit&gt;]</pre></div></div></div>
<div class="sect1"><h2 id="_description">DESCRIPTION</h2><div class="sectionbody">
<div class="paragraph"><p>This command walks the history from the given commit backwards and writes each commit
again with its parents reversed. It is meant for demonstrations of history rewriting and should
never be used on a branch that others have fetched, because every commit gets a new name.</p></div>
<div class="paragraph"><p>With --dry-run it only prints the commits it would rewrite.</p></div></div></div></div>
<div id="footer"><div id="footer-text">Last updated 2024-01-01</div></div></body></html>"""


def test_a_manual_page_keeps_the_title_and_summary_line_of_its_header_block():
    parsed = parsing.parse_file("git-frob.html", MANUAL_PAGE.encode())

    assert parsed.text.startswith("git-frob(1) Manual Page\n\nNAME\n\ngit-frob - Rewrite every commit in reverse order")
    assert "This command walks the history" in parsed.text
    assert "Last updated" not in parsed.text
    assert [section.path for section in parsed.sections][:3] == [
        ("git-frob(1) Manual Page",),
        ("git-frob(1) Manual Page", "NAME"),
        ("git-frob(1) Manual Page", "SYNOPSIS"),
    ]


def test_markdown_headings_give_exact_section_paths_and_offsets():
    text = (
        "# Guide\n\nIntro.\n\n## Setup\n\nInstall it.\n\n```\n# not a heading\n```\n\n"
        "### Linux\n\napt-get.\n\n## Use\n\nRun."
    )

    parsed = parsing.parse_file("guide.md", text.encode())

    assert [(section.path, parsed.text[section.start : section.end]) for section in parsed.sections] == [
        (("Guide",), "# Guide\n\nIntro."),
        (("Guide", "Setup"), "## Setup\n\nInstall it.\n\n```\n# not a heading\n```"),
        (("Guide", "Setup", "Linux"), "### Linux\n\napt-get."),
        (("Guide", "Use"), "## Use\n\nRun."),
    ]


def test_docx_headings_paragraphs_and_tables_keep_their_order_and_paths():
    document = docx.Document()
    document.add_heading("Handbook", level=0)
    document.add_heading("2 Retrieval", level=1)
    document.add_paragraph("Retrieval has two levels.")
    document.add_heading("2.3 Dual-level retrieval", level=2)
    document.add_paragraph("Low-level keywords find entities.")
    table = document.add_table(rows=1, cols=2)
    table.cell(0, 0).text, table.cell(0, 1).text = "Revenue", "42"
    buffer = io.BytesIO()
    document.save(buffer)

    parsed = parsing.parse_file("memo.docx", buffer.getvalue())

    assert parsed.text == (
        "Handbook\n\n2 Retrieval\n\nRetrieval has two levels.\n\n2.3 Dual-level retrieval\n\n"
        "Low-level keywords find entities.\n\nRevenue | 42"
    )
    last = parsed.sections[-1]
    assert last.path == ("Handbook", "2 Retrieval", "2.3 Dual-level retrieval")
    assert parsed.text[last.start : last.end].endswith("Revenue | 42")


def test_a_pdf_has_a_region_per_page_and_sections_from_its_outline():
    parsed = parsing.parse_file("report.pdf", pdf_report())

    assert [(region.kind, region.number) for region in parsed.regions] == [("page", 1), ("page", 2), ("page", 3)]
    page_two = parsed.regions[1]
    assert "Dual-level retrieval uses two kinds of keywords." in parsed.text[page_two.start : page_two.end]
    assert [section.path for section in parsed.sections] == [
        ("1 Introduction",),
        ("2 Method",),
        ("2 Method", "2.3 Dual-level retrieval"),
        ("3 Results",),
    ]
    dual = parsed.sections[2]
    assert parsed.text[dual.start :].startswith("2.3 Dual-level retrieval")


def test_it_reads_the_text_layer_of_a_hand_made_pdf():
    assert "Quarterly results" in _text_of("report.pdf", text_pdf("Quarterly results"))


def test_pptx_slides_become_regions_with_their_titles_notes_and_tables():
    parsed = parsing.parse_file("deck.pptx", pptx_deck())

    assert [(region.kind, region.number) for region in parsed.regions] == [("slide", 1), ("slide", 2)]
    second = parsed.text[parsed.regions[1].start : parsed.regions[1].end]
    assert second.startswith("Roadmap")
    assert "Ship the graph view" in second
    assert "Notes: Ask about budgets." in second
    assert "Quarter: Q1; Goal: Beta" in second
    assert [section.path for section in parsed.sections] == [("Welcome",), ("Roadmap",)]


def test_xlsx_sheets_become_regions_whose_rows_carry_their_headers():
    parsed = parsing.parse_file("finance.xlsx", xlsx_workbook())

    assert [(region.kind, region.number, region.name) for region in parsed.regions] == [
        ("sheet", 1, "Revenue"),
        ("sheet", 2, "Costs"),
    ]
    assert "Region: North; Revenue: 120; Booked: 2024-03-01" in parsed.text
    assert "Item: Servers; Cost: 80.5" in parsed.text


def test_csv_rows_carry_their_headers_whatever_the_delimiter():
    assert _text_of("a.csv", b"name;city\nAda;London\nGrace;Arlington\n") == (
        "name: Ada; city: London\nname: Grace; city: Arlington"
    )


def test_epub_chapters_keep_the_book_title_and_headings_as_their_path():
    parsed = parsing.parse_file("book.epub", epub_book())

    assert "Graphs are everywhere." in parsed.text
    assert [section.path for section in parsed.sections] == [
        ("A Book of Graphs",),
        ("A Book of Graphs", "Chapter 1 Nodes"),
        ("A Book of Graphs", "Chapter 1 Nodes", "1.1 Degrees"),
        ("A Book of Graphs", "Chapter 2 Edges"),
    ]


def test_odt_headings_paragraphs_and_lists_are_read():
    parsed = parsing.parse_file("notes.odt", odt_document())

    assert parsed.text == "Meeting notes\n\nWe agreed on the plan.\n\nBudget\n\n- Servers\n- Licences"
    assert [section.path for section in parsed.sections] == [("Meeting notes",), ("Meeting notes", "Budget")]


def test_rtf_json_yaml_xml_eml_and_source_code_are_read_as_text():
    assert _text_of("letter.rtf", rb"{\rtf1\ansi{\fonttbl\f0 Arial;}\f0 Dear team,\par the plan is ready.}") == (
        "Dear team,\nthe plan is ready."
    )
    config = {"service": {"name": "graphrag", "replicas": 3}}
    assert '"replicas": 3' in _text_of("config.json", json.dumps(config, indent=2).encode())
    assert "replicas: 3" in _text_of("config.yaml", yaml.safe_dump(config).encode())
    root = etree.Element("catalog")
    etree.SubElement(root, "book", id="b1").text = "Graph Theory"
    assert _text_of("catalog.xml", etree.tostring(root, xml_declaration=True, encoding="utf-8")) == (
        'book id="b1": Graph Theory'
    )
    message = email.message.EmailMessage()
    message["From"], message["To"], message["Subject"] = "ada@example.com", "team@example.com", "Launch date"
    message.set_content("We launch on Monday.")
    message.add_attachment(b"%PDF", maintype="application", subtype="pdf", filename="plan.pdf")
    mail = parsing.parse_file("launch.eml", message.as_bytes())
    assert mail.text.startswith("Launch date\n\nFrom: ada@example.com\nTo: team@example.com")
    assert "We launch on Monday." in mail.text
    assert mail.text.endswith("Attachments: plan.pdf")
    code = parsing.parse_file("tool.py", b"def main():\n    return 42\n")
    assert (code.text, code.language) == ("def main():\n    return 42", "Python")


@pytest.mark.parametrize(
    ("filename", "data", "message"),
    [
        ("image.png", b"\x89PNG....", "Upload one of: .txt, .md, .markdown, .html, .htm"),
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
        ("broken.pptx", b"PK not a zip", "could not be read as a PowerPoint .pptx file"),
        ("broken.xlsx", b"PK not a zip", "could not be read as an Excel .xlsx workbook"),
        ("broken.epub", b"PK not a zip", "could not be read as an EPUB book"),
        ("broken.odt", b"PK not a zip", "could not be read as an OpenDocument .odt file"),
        ("broken.rtf", b"Dear team, no RTF header here", "not an RTF document"),
        ("broken.json", b'{"a": [1, 2', "not valid JSON"),
        ("broken.yaml", b"a: [1, 2\nb: {", "not valid YAML"),
        ("broken.xml", b"<catalog><book></catalog>", "not well-formed XML"),
        ("broken.eml", b"just some words\n", "not an email message"),
        ("locked.docx", b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1" + bytes(600), "password-protected or encrypted"),
        ("locked.pdf", _encrypted_pdf(), "password-protected"),
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


def _zip_with(names_and_sizes: dict[str, int]) -> bytes:
    """A zip whose members are runs of zeros of the given sizes, written in pieces (never whole)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED, compresslevel=9) as archive:
        for name, size in names_and_sizes.items():
            with archive.open(name, "w", force_zip64=True) as member:
                for _ in range(size // 2**20):
                    member.write(bytes(2**20))
    return buffer.getvalue()


@pytest.mark.parametrize("extension", [".docx", ".pptx", ".xlsx", ".odt", ".epub"])
def test_a_zip_bomb_is_refused_from_its_directory_without_inflating_it(extension):
    bomb = _zip_with({"[Content_Types].xml": 2**20, "word/document.xml": 300 * 2**20})
    assert len(bomb) < 2**20

    tracemalloc.start()
    try:
        with pytest.raises(parsing.ParseError, match=r"expand to 301 MB .* 200 MB allowed \(PARSE_MAX_UNZIPPED_MB\)"):
            parsing.parse_file(f"bomb{extension}", bomb, limits=parsing.Limits(max_unzipped_bytes=200 * 2**20))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Reading it whole would take 300 MB; refusing it takes about the size of the upload.
    assert peak < 4 * len(bomb) + 2**20


def test_a_member_that_inflates_far_more_than_documents_do_is_refused():
    bomb = _zip_with({"word/document.xml": 40 * 2**20})

    with pytest.raises(parsing.ParseError, match=r"zip bomb: word/document.xml expands [\d,]+ times"):
        parsing.parse_file("memo.docx", bomb, limits=parsing.Limits(max_zip_ratio=100))


def test_zipfile_never_inflates_more_than_the_directory_declares():
    """What the directory check relies on: a member whose declared size lies yields no more."""
    real = _zip_with({"word/document.xml": 8 * 2**20})
    archive = zipfile.ZipFile(io.BytesIO(real))
    archive.getinfo("word/document.xml").file_size = 2**20  # as a forged central directory would say

    pieces = []

    def read_all():
        with archive.open("word/document.xml") as member:
            while piece := member.read(2**16):
                pieces.append(len(piece))

    with pytest.raises(zipfile.BadZipFile, match="CRC"):
        read_all()
    assert sum(pieces) < 2**20


def test_the_text_limit_refuses_a_document_after_reading_about_the_limit(monkeypatch):
    seen = []
    read = parsing.structure.Builder.block

    def counting(self, text, **options):
        seen.append(len(text))
        return read(self, text, **options)

    monkeypatch.setattr(parsing.structure.Builder, "block", counting)
    many = _docx(*[f"Paragraph {i} of a very long report." for i in range(5000)])

    with pytest.raises(parsing.ParseError, match=r"more than 10,000 characters of text \(PARSE_MAX_TEXT_CHARS\)"):
        parsing.parse_file("long.docx", many, limits=parsing.Limits(max_text_chars=10_000))
    assert sum(seen) < 11_000


def test_a_pdf_past_the_page_limit_is_refused():
    with pytest.raises(parsing.ParseError, match=r"has 3 pages, more than the 2 allowed \(PARSE_MAX_PDF_PAGES\)"):
        parsing.parse_file("report.pdf", pdf_report(), limits=parsing.Limits(max_pdf_pages=2))


@pytest.mark.parametrize(
    ("filename", "message"),
    [
        ("..", "has no name"),
        ("bad\x00name.txt", "control characters"),
        ("bell\x07.txt", "control characters"),
        ("broken-\udcff.txt", "must be valid UTF-8"),
    ],
)
def test_odd_file_names_are_refused_with_a_message(workspace, filename, message):
    with pytest.raises(ingestion.DocumentRejected, match=message):
        ingestion.document_create(workspace=workspace, filename=filename, data=b"Some words.", enqueue=False)

    assert not Document.objects.exists()


def test_a_path_in_a_file_name_never_reaches_the_disk(workspace, settings, tmp_path):
    settings.MEDIA_ROOT = tmp_path

    document = ingestion.document_create(
        workspace=workspace, filename="..\\..\\etc/notes.txt", data=b"Some words.", enqueue=False
    )

    # The name is kept as given, to be shown escaped (a name may hold "/", as in "<b>x</b>.txt");
    # what touches the disk is a safe base name.
    assert document.original_filename == "..\\..\\etc/notes.txt"
    assert ".." not in document.source_file.name
    assert document.source_file.name.rsplit("/", 1)[-1].endswith("notes.txt")


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
    monkeypatch.setattr("knowledge.services.ingestion.uploads.current_app", sender)

    with django_capture_on_commit_callbacks(execute=True):
        document = ingestion.document_create(workspace=workspace, filename="notes.txt", data=b"Hello team.")

    assert document.title == "notes.txt"
    assert document.source_file.read() == b"Hello team."
    assert queued == ["knowledge.tasks.ingest_next"]


def test_the_upload_form_the_ingest_command_and_the_ingestion_doc_list_the_same_types():
    from pathlib import Path

    from knowledge.web.forms import UploadForm

    ingestion_doc = (Path(__file__).resolve().parents[3] / "docs" / "ingestion.md").read_text()
    for extension in parsing.ACCEPTED_TYPES:
        assert f"`{extension}`" in ingestion_doc, extension
    assert UploadForm().fields["files"].widget.attrs["accept"] == ",".join(parsing.ACCEPTED_TYPES)
