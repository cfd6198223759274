"""Zip-based office and book formats: .docx, .pptx, .xlsx, .odt, .epub. Each is checked by
limits.checked_zip before its library opens it."""

import datetime
import io
import re

from knowledge.rag.parsing.errors import ParseError
from knowledge.rag.parsing.html import html_blocks
from knowledge.rag.parsing.structure import Builder

_HEADING_STYLE = re.compile(r"^heading\s*(\d)$", re.IGNORECASE)
# Rows of a table or sheet per block, so chunks can break between groups of rows.
ROWS_PER_BLOCK = 25


def _unreadable(filename: str, what: str, exc: Exception) -> ParseError:
    return ParseError(f"{filename} could not be read as {what} ({exc.__class__.__name__}: {exc}).")


def cell_text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, datetime.datetime) and not (value.hour or value.minute or value.second):
        return value.date().isoformat()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return " ".join(str(value).split())


def table_rows(rows, builder: Builder) -> None:
    """A table as rows that carry their headers ("Region: North; Revenue: 120"), in blocks of rows.

    The first row with any value is the header; a column without a header is named by its
    number. A row read alone (in a chunk, a citation) still says what each value is.
    """
    header, lines = None, []
    for row in rows:
        cells = [cell_text(value) for value in row]
        if not any(cells):
            continue
        if header is None:
            header = cells
            continue
        names = [header[i] if i < len(header) and header[i] else f"column {i + 1}" for i in range(len(cells))]
        lines.append("; ".join(f"{name}: {cell}" for name, cell in zip(names, cells, strict=True) if cell))
        if len(lines) == ROWS_PER_BLOCK:
            builder.block("\n".join(lines))
            lines = []
    if header is not None and not lines and not builder.parts:
        lines = ["; ".join(cell for cell in header if cell)]
    builder.block("\n".join(lines))


def docx_document(filename: str, data: bytes, builder: Builder) -> None:
    import docx
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    try:
        document = docx.Document(io.BytesIO(data))
    except Exception as exc:  # python-docx surfaces zip and XML errors of damaged files in many types
        raise _unreadable(filename, "a Word .docx file", exc) from exc
    for element in document.element.body.iterchildren():
        tag = element.tag.rsplit("}", 1)[-1]
        if tag == "p":
            paragraph = Paragraph(element, document)
            style = paragraph.style.name if paragraph.style is not None else ""
            heading = _HEADING_STYLE.match(style or "")
            if style == "Title":
                builder.heading(0, paragraph.text)
            elif heading:
                builder.heading(int(heading.group(1)), paragraph.text)
            else:
                builder.block(paragraph.text)
        elif tag == "tbl":
            rows = [" | ".join(cell.text.strip() for cell in row.cells) for row in Table(element, document).rows]
            builder.block("\n".join(row for row in rows if row.strip(" |")))


def pptx_document(filename: str, data: bytes, builder: Builder) -> None:
    from pptx import Presentation

    try:
        presentation = Presentation(io.BytesIO(data))
    except Exception as exc:  # python-pptx, like python-docx, raises many types for damaged packages
        raise _unreadable(filename, "a PowerPoint .pptx file", exc) from exc
    for number, slide in enumerate(presentation.slides, 1):
        builder.start_region("slide", number)
        title = slide.shapes.title
        builder.heading(1, title.text_frame.text if title is not None else f"Slide {number}")
        for shape in slide.shapes:
            if title is None or shape.shape_id != title.shape_id:
                _pptx_shape(shape, builder)
        if slide.has_notes_slide:
            notes = slide.notes_slide.notes_text_frame
            if notes is not None and notes.text.strip():
                builder.block(f"Notes: {notes.text}")
        builder.end_region()


def _pptx_shape(shape, builder: Builder) -> None:
    if getattr(shape, "shapes", None) is not None:  # a group
        for member in shape.shapes:
            _pptx_shape(member, builder)
    elif shape.has_text_frame:
        builder.block("\n".join(paragraph.text for paragraph in shape.text_frame.paragraphs))
    elif getattr(shape, "has_table", False) and shape.has_table:
        table_rows(([cell.text for cell in row.cells] for row in shape.table.rows), builder)


def xlsx_document(filename: str, data: bytes, builder: Builder) -> None:
    import openpyxl

    try:
        workbook = openpyxl.load_workbook(io.BytesIO(data), read_only=True, data_only=True)
    except Exception as exc:  # openpyxl raises KeyError, zip and XML errors for damaged workbooks
        raise _unreadable(filename, "an Excel .xlsx workbook", exc) from exc
    try:
        for number, sheet in enumerate(workbook.worksheets, 1):
            builder.start_region("sheet", number, sheet.title)
            builder.heading(1, sheet.title)
            table_rows(sheet.iter_rows(values_only=True), builder)
            builder.end_region()
    finally:
        workbook.close()


def odt_document(filename: str, data: bytes, builder: Builder) -> None:
    from odf.opendocument import load

    try:
        document = load(io.BytesIO(data))
    except Exception as exc:  # odfpy raises zip, XML and KeyError for damaged documents
        raise _unreadable(filename, "an OpenDocument .odt file", exc) from exc
    _odt_nodes(document.text, builder)


def _odt_nodes(parent, builder: Builder) -> None:
    from odf import teletype
    from odf.namespaces import TABLENS, TEXTNS

    for node in parent.childNodes:
        qname = getattr(node, "qname", None)
        if qname == (TEXTNS, "h"):
            level = node.getAttrNS(TEXTNS, "outline-level")
            builder.heading(int(level) if level and level.isdigit() else 1, teletype.extractText(node))
        elif qname == (TEXTNS, "p"):
            builder.block(teletype.extractText(node))
        elif qname == (TEXTNS, "list"):
            items = [teletype.extractText(item) for item in node.childNodes if item.qname == (TEXTNS, "list-item")]
            builder.block("\n".join(f"- {item}" for item in items if item.strip()))
        elif qname == (TABLENS, "table"):
            rows = [
                [teletype.extractText(cell) for cell in row.childNodes if cell.qname == (TABLENS, "table-cell")]
                for row in node.getElementsByType(_odf_table_row())
            ]
            table_rows(rows, builder)
        elif qname in {(TEXTNS, "section"), (TEXTNS, "soft-page-break")}:
            _odt_nodes(node, builder)


def _odf_table_row():
    from odf.table import TableRow

    return TableRow


def epub_document(filename: str, data: bytes, builder: Builder) -> None:
    import ebooklib
    import lxml.etree
    import lxml.html
    from ebooklib import epub

    with io.BytesIO(data) as stream:
        try:
            book = epub.read_epub(stream, options={"ignore_ncx": True})
        except Exception as exc:  # ebooklib raises its own, zip, XML and KeyError types
            raise _unreadable(filename, "an EPUB book", exc) from exc
    if book.get_item_with_href("META-INF/encryption.xml") is not None:
        raise ParseError(f"{filename} is DRM-protected (encrypted). Upload an unprotected copy.")
    titles = book.get_metadata("DC", "title")
    if titles and titles[0][0]:
        builder.heading(0, titles[0][0])
    for item_id, _linear in book.spine:
        item = book.get_item_with_id(item_id)
        if item is None or item.get_type() != ebooklib.ITEM_DOCUMENT or isinstance(item, epub.EpubNav):
            continue
        content = item.get_content()
        if not content.strip():
            continue
        try:
            root = lxml.html.document_fromstring(content)
        except (lxml.etree.ParserError, ValueError):
            continue
        body = root.find("body")
        html_blocks(body if body is not None else root, builder)
