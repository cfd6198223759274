"""PDF: the text layer page by page (each page a region), sections from the outline (bookmarks)."""

import io
import logging

from knowledge.rag.parsing.errors import ParseError
from knowledge.rag.parsing.limits import Limits
from knowledge.rag.parsing.structure import Builder, Section, sections_from_headings

logger = logging.getLogger(__name__)


def pdf_document(filename: str, data: bytes, builder: Builder, limits: Limits) -> tuple[Section, ...]:
    """Add the pages to `builder`; return the sections the outline gives (empty without one)."""
    from pypdf import PdfReader
    from pypdf.errors import LimitReachedError, PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ParseError(f"{filename} is password-protected. Remove the password and upload it again.")
        pages = len(reader.pages)
        if pages > limits.max_pdf_pages:
            raise ParseError(
                f"{filename} has {pages:,} pages, more than the {limits.max_pdf_pages:,} allowed "
                "(PARSE_MAX_PDF_PAGES). Split it into smaller documents."
            )
        page_starts = []
        for number, page in enumerate(reader.pages, 1):
            builder.start_region("page", number)
            start = builder.block(page.extract_text() or "")
            page_starts.append(start)
            builder.end_region()
        outline = _outline(reader)
    except ParseError:
        raise
    except LimitReachedError as exc:
        # A stream that inflates past pypdf's limits (75 MB): a decompression bomb, or a page far
        # beyond any text a person uploads. Refused as such, not as an unexpected failure.
        raise ParseError(
            f"{filename} holds a compressed stream that expands beyond what a PDF is allowed to here "
            "(a decompression bomb?); it was not read."
        ) from exc
    except (PdfReadError, ValueError, KeyError, TypeError, OSError, AttributeError, RecursionError) as exc:
        raise ParseError(f"{filename} could not be read as a PDF ({exc}).") from exc
    text = "".join(builder.parts)
    headings = []
    for level, title, page_index in outline:
        start = page_starts[page_index] if 0 <= page_index < len(page_starts) else None
        if start is None:
            continue
        # The title usually opens a line on its page; there the section starts, else at the page.
        page_end = next((s for s in page_starts[page_index + 1 :] if s is not None), len(text))
        found = text.find(title, start, page_end)
        headings.append((found if found >= 0 else start, level, title))
    headings.sort(key=lambda heading: heading[0])
    return sections_from_headings(text, headings)


def _outline(reader) -> list[tuple[int, str, int]]:
    """(level, title, page index) of every outline entry, in document order."""
    entries = []

    def walk(items, level):
        for item in items:
            if isinstance(item, list):
                walk(item, level + 1)
                continue
            try:
                page_index = reader.get_destination_page_number(item)
            except (KeyError, ValueError, TypeError, AttributeError):
                continue
            title = " ".join(str(getattr(item, "title", "") or "").split())
            if title and page_index is not None:
                entries.append((level, title, page_index))

    try:
        walk(reader.outline, 1)
    except (KeyError, ValueError, TypeError, AttributeError, RecursionError):
        logger.info("ignoring an unreadable PDF outline", exc_info=True)
    return entries
