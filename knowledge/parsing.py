"""File to text. Every refusal is a ParseError whose message is shown to the user as is."""

import io
import os
import re
from html.parser import HTMLParser

ACCEPTED_TYPES = {
    ".txt": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".pdf": "pdf",
    ".docx": "docx",
}
TEXT_KINDS = {"text", "markdown", "html"}
FALLBACK_ENCODING = "cp1252"
_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1f]")


class ParseError(ValueError):
    pass


def accepted_types() -> str:
    return ", ".join(ACCEPTED_TYPES)


def kind_of(filename: str) -> str:
    extension = os.path.splitext(filename)[1].lower()
    kind = ACCEPTED_TYPES.get(extension)
    if kind is None:
        shown = extension or "files without an extension"
        raise ParseError(f"{filename}: {shown} is not supported. Upload one of: {accepted_types()}, or paste the text.")
    return kind


def clean_text(text: str) -> str:
    """NULs out, newlines normalized, trailing spaces and runs of blank lines trimmed."""
    text = text.replace("\x00", "").replace("\r\n", "\n").replace("\r", "\n")
    text = re.sub(r"[ \t]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def parse_file(filename: str, data: bytes) -> str:
    """The text of an uploaded file; empty when it holds none (the caller says so)."""
    kind = kind_of(filename)
    if not data:
        raise ParseError(f"{filename} is empty.")
    if kind in TEXT_KINDS:
        text = decode_text(filename, data)
        if kind == "html":
            text = html_to_text(text)
        return clean_text(text)
    if kind == "pdf":
        return clean_text(_pdf_text(filename, data))
    return clean_text(_docx_text(filename, data))


def decode_text(filename: str, data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    sample = data[:8192]
    # Stray NULs are stripped, but a text extension on mostly-control bytes is a binary file.
    if len(_CONTROL.findall(sample)) > max(8, len(sample) // 10):
        raise ParseError(f"{filename} looks like a binary file, not text. Upload one of: {accepted_types()}.")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode(FALLBACK_ENCODING, errors="replace")


class _VisibleText(HTMLParser):
    HIDDEN = {"script", "style", "noscript", "template", "head", "svg", "iframe", "object"}
    BLOCKS = {
        "p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer",
        "h1", "h2", "h3", "h4", "h5", "h6", "blockquote", "pre", "hr", "dd", "dt", "title", "main", "nav",
    }  # fmt: skip

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.hidden_depth = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.HIDDEN:
            self.hidden_depth += 1
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.HIDDEN:
            self.hidden_depth = max(0, self.hidden_depth - 1)
        elif tag in self.BLOCKS:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.hidden_depth:
            self.parts.append(data)


def html_to_text(html: str) -> str:
    parser = _VisibleText()
    parser.feed(html)
    parser.close()
    lines = (" ".join(line.split()) for line in "".join(parser.parts).split("\n"))
    return "\n".join(lines)


def _pdf_text(filename: str, data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ParseError(f"{filename} is password-protected. Remove the password and upload it again.")
        return "\n\n".join(page.extract_text() or "" for page in reader.pages)
    except ParseError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, OSError) as exc:
        raise ParseError(f"{filename} could not be read as a PDF ({exc}).") from exc


def _docx_text(filename: str, data: bytes) -> str:
    import docx
    from docx.opc.exceptions import PackageNotFoundError

    try:
        document = docx.Document(io.BytesIO(data))
    except (PackageNotFoundError, ValueError, KeyError, OSError) as exc:
        raise ParseError(f"{filename} could not be read as a Word .docx file ({exc}).") from exc
    except Exception as exc:  # python-docx surfaces zip and XML errors of damaged files in many types
        raise ParseError(f"{filename} could not be read as a Word .docx file ({exc}).") from exc
    parts = [paragraph.text for paragraph in document.paragraphs]
    for table in document.tables:
        for row in table.rows:
            parts.append(" | ".join(cell.text for cell in row.cells))
    return "\n\n".join(parts)
