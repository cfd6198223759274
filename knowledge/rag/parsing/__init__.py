"""File to text with its structure. Pure: no database. Every refusal is a ParseError whose message
is shown to the user as is.

`parse_file(filename, data)` returns a ParsedDocument: the text, its sections (heading paths
with character offsets) and its regions (PDF pages, slides, sheets), so chunks and citations can
say where they come from.
"""

import os
import re

import filetype

from knowledge.rag.parsing.data import (
    csv_document,
    eml_document,
    json_document,
    rtf_document,
    xml_document,
    yaml_document,
)
from knowledge.rag.parsing.errors import ParseError
from knowledge.rag.parsing.html import html_document
from knowledge.rag.parsing.limits import Limits, checked_zip
from knowledge.rag.parsing.office import docx_document, epub_document, odt_document, pptx_document, xlsx_document
from knowledge.rag.parsing.pdf import pdf_document
from knowledge.rag.parsing.structure import Builder, ParsedDocument, Region, Section, clean_text, sections_from_headings

__all__ = [
    "ACCEPTED_TYPES",
    "Limits",
    "ParseError",
    "ParsedDocument",
    "Region",
    "Section",
    "TEXT_KINDS",
    "accepted_types",
    "check_filename",
    "clean_text",
    "decode_text",
    "kind_of",
    "parse_file",
]

# Source files are read as text and keep their language.
CODE_LANGUAGES = {
    ".py": "Python", ".js": "JavaScript", ".mjs": "JavaScript", ".jsx": "JavaScript", ".ts": "TypeScript",
    ".tsx": "TypeScript", ".java": "Java", ".kt": "Kotlin", ".go": "Go", ".rs": "Rust", ".c": "C", ".h": "C",
    ".cc": "C++", ".cpp": "C++", ".hpp": "C++", ".cs": "C#", ".rb": "Ruby", ".php": "PHP", ".swift": "Swift",
    ".scala": "Scala", ".sh": "Shell", ".bash": "Shell", ".sql": "SQL", ".r": "R", ".lua": "Lua", ".pl": "Perl",
    ".css": "CSS", ".toml": "TOML", ".ini": "INI",
}  # fmt: skip
ACCEPTED_TYPES = {
    ".txt": "text",
    ".md": "markdown",
    ".markdown": "markdown",
    ".html": "html",
    ".htm": "html",
    ".xhtml": "html",
    ".pdf": "pdf",
    ".docx": "docx",
    ".pptx": "pptx",
    ".xlsx": "xlsx",
    ".csv": "csv",
    ".epub": "epub",
    ".odt": "odt",
    ".rtf": "rtf",
    ".json": "json",
    ".yaml": "yaml",
    ".yml": "yaml",
    ".xml": "xml",
    ".eml": "eml",
    **dict.fromkeys(CODE_LANGUAGES, "code"),
}
_ZIPPED = {
    "docx": ("a Word .docx file", docx_document),
    "pptx": ("a PowerPoint .pptx file", pptx_document),
    "xlsx": ("an Excel .xlsx workbook", xlsx_document),
    "odt": ("an OpenDocument .odt file", odt_document),
    "epub": ("an EPUB book", epub_document),
}
# Kinds read as decoded text: a look at their first bytes tells a binary file under their name.
TEXT_KINDS = {"text", "markdown", "html", "code", "csv", "json", "yaml", "rtf"}
_FROM_TEXT = {
    "csv": csv_document,
    "json": json_document,
    "yaml": yaml_document,
    "rtf": rtf_document,
}
FALLBACK_ENCODING = "cp1252"
_CONTROL = re.compile(rb"[\x00-\x08\x0e-\x1f]")
_UNPRINTABLE_NAME = re.compile(r"[\x00-\x1f\x7f]")
MAX_FILENAME_BYTES = 255


def accepted_types() -> str:
    return ", ".join(ACCEPTED_TYPES)


def check_filename(filename: str) -> str:
    """The file's base name, or a ParseError for a name no file system or page should carry."""
    name = os.path.basename(filename.replace("\\", "/"))
    if not name.strip(". "):
        raise ParseError(f"{filename!r} is not a usable file name. Rename the file and upload it again.")
    if _UNPRINTABLE_NAME.search(name):
        raise ParseError(f"{name!r} has control characters in its name. Rename the file and upload it again.")
    try:
        encoded = name.encode("utf-8")
    except UnicodeEncodeError as exc:
        shown = name.encode("utf-8", "replace").decode()
        raise ParseError(f"{shown!r} has a name that is not valid UTF-8. Rename the file and upload it again.") from exc
    if len(encoded) > MAX_FILENAME_BYTES:
        raise ParseError(
            f"{name[:60]}… has a name longer than {MAX_FILENAME_BYTES} bytes. Rename the file and upload it again."
        )
    return name


def kind_of(filename: str) -> str:
    extension = os.path.splitext(filename)[1].lower()
    kind = ACCEPTED_TYPES.get(extension)
    if kind is None:
        shown = extension or "files without an extension"
        raise ParseError(f"{filename}: {shown} is not supported. Upload one of: {accepted_types()}, or paste the text.")
    return kind


def parse_file(filename: str, data: bytes, *, limits: Limits | None = None) -> ParsedDocument:
    """The text of an uploaded file and its structure; the text is empty when it holds none (the
    caller says so)."""
    filename = check_filename(filename)
    kind = kind_of(filename)
    if not data:
        raise ParseError(f"{filename} is empty.")
    limits = limits or Limits.from_settings()
    builder = Builder(filename=filename, max_chars=limits.max_text_chars)
    if kind in {"text", "markdown", "code"}:  # kept as they are, not rebuilt from blocks
        text = clean_text(decode_text(filename, data))
        if len(text) > limits.max_text_chars:
            builder.block(text)  # raises the size refusal
        sections = markdown_sections(text) if kind == "markdown" else ()
        return ParsedDocument(text, sections, (), CODE_LANGUAGES.get(os.path.splitext(filename)[1].lower(), ""))
    if kind == "html":
        html_document(decode_text(filename, data), builder)
    elif kind in _FROM_TEXT:
        _FROM_TEXT[kind](filename, decode_text(filename, data), builder)
    elif kind == "xml":
        xml_document(filename, data, builder)
    elif kind == "eml":
        eml_document(filename, data, builder)
    elif kind == "pdf":
        sections = pdf_document(filename, data, builder, limits)
        parsed = builder.result()
        return ParsedDocument(parsed.text, sections, parsed.regions)
    else:
        what, read = _ZIPPED[kind]
        with checked_zip(filename, data, limits, what):
            read(filename, data, builder)
    return builder.result()


def _not_text(filename: str, sample: bytes, controls: int) -> str:
    """Why a file under a text name is refused: what it is, by its magic bytes (filetype), and what to
    do; or, when nothing is recognized, what in its bytes said binary."""
    found = filetype.guess(sample)
    if found is None:
        return (
            f"{filename} is not text: {controls} of its first {len(sample)} bytes are control characters, "
            "as in a binary file."
        )
    detected = f"{filename} is not text: it was detected as {found.mime} (.{found.extension})"
    if f".{found.extension}" in ACCEPTED_TYPES:
        return f"{detected}. Rename it to .{found.extension} and upload it again."
    return f"{detected}, which cannot be read here."


def decode_text(filename: str, data: bytes) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        return data.decode("utf-16")
    sample = data[:8192]
    # Stray NULs are stripped, but a text extension on mostly-control bytes is a binary file.
    controls = len(_CONTROL.findall(sample))
    if controls > max(8, len(sample) // 10):
        raise ParseError(_not_text(filename, sample, controls))
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return data.decode(FALLBACK_ENCODING, errors="replace")


def markdown_sections(text: str) -> tuple[Section, ...]:
    """Sections of a Markdown text from its ATX and setext headings (not the ones in code blocks)."""
    from markdown_it import MarkdownIt

    tokens = MarkdownIt("commonmark").parse(text)
    line_starts = [0]
    for line in text.split("\n"):
        line_starts.append(line_starts[-1] + len(line) + 1)
    headings = [
        (line_starts[token.map[0]], int(token.tag[1]), tokens[index + 1].content)
        for index, token in enumerate(tokens)
        if token.type == "heading_open" and token.map
    ]
    return sections_from_headings(text, headings)
