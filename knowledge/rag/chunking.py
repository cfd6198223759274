"""Token chunks with their character offsets in the document (for citations) and where they sit:
the section path, the pages (slides, sheets) they cover and a short label for people."""

import bisect
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

from knowledge.rag.parsing import Region, Section
from knowledge.rag.tokens import encode, encoding

SECTION_SEPARATOR = " > "
# Break points, strongest first: a heading starts a section; a blank line a paragraph (pages start
# at one too); then a line; then a sentence.
_PARAGRAPH = re.compile(r"\n\s*\n")
_LINE = re.compile(r"\n")
_SENTENCE = re.compile(r"[.!?:;][\"')\]]?\s+")
# A chunk ends at a break point only in the second half of its window, so chunks stay big.
_MIN_FILL = 0.5


@dataclass(frozen=True)
class ChunkSpan:
    order: int
    text: str
    token_count: int
    char_start: int
    char_end: int
    section: str = ""
    page_start: int | None = None
    page_end: int | None = None
    location: str = ""
    # Where the document page jumps for this chunk: "page-4", "slide-3", "sheet-2", "section-5" or "".
    anchor: str = ""


def chunk_text(
    text: str,
    *,
    size: int = 1200,
    overlap: int = 100,
    sections: Sequence[Section] = (),
    regions: Sequence[Region] = (),
) -> list[ChunkSpan]:
    """Chunks of at most `size` tokens, each starting `overlap` tokens before the last one ended.

    A chunk ends where its window holds the strongest break point in its second half: a section
    start (the next chunk then starts there, without overlap, so a section's first chunk holds
    nothing of the section before), else a paragraph, a line, a sentence, else at `size` tokens.
    A chunk's text is exactly `text[char_start:char_end]`, so a citation can point into the
    document; a boundary that falls inside a multi-byte character moves to the next character.
    """
    if size < 1:
        raise ValueError("chunk size must be at least one token")
    overlap = min(max(overlap, 0), size - 1)
    tokens = encode(text)
    if not tokens:
        return []
    char_at = _char_offsets(text, tokens)
    section_starts = sorted({section.start for section in sections})
    breaks = [
        _token_boundaries(char_at, section_starts),
        _token_boundaries(
            char_at, sorted({m.end() for m in _PARAGRAPH.finditer(text)} | {region.start for region in regions})
        ),
        _token_boundaries(char_at, [m.end() for m in _LINE.finditer(text)]),
        _token_boundaries(char_at, [m.end() for m in _SENTENCE.finditer(text)]),
    ]
    windows, start = [], 0
    while True:
        limit = start + size
        if limit >= len(tokens):
            windows.append((start, len(tokens)))
            break
        end, at_section = limit, False
        for strength, points in enumerate(breaks):
            best = _last_between(points, start + max(1, int(size * _MIN_FILL)), limit)
            if best is not None:
                end, at_section = best, strength == 0
                break
        windows.append((start, end))
        start = end if at_section else max(end - overlap, start + 1)
    spans = []
    for order, (first, last) in enumerate(windows):
        char_start, char_end = _trimmed(text, char_at[first], char_at[last])
        spans.append(
            _located(
                order=order,
                text=text,
                token_count=last - first,
                char_start=char_start,
                char_end=char_end,
                sections=sections,
                regions=regions,
            )
        )
    return spans


def _char_offsets(text: str, tokens: list[int]) -> list[int]:
    """Character offset of every token boundary, in one pass over byte lengths."""
    data = text.encode("utf-8")
    byte_ends = [0, *itertools.accumulate(map(len, encoding().decode_tokens_bytes(tokens)))]
    offsets, previous_byte, previous_char = [], 0, 0
    for byte in byte_ends:
        while byte < len(data) and data[byte] & 0xC0 == 0x80:  # a UTF-8 continuation byte
            byte += 1
        previous_char += len(data[previous_byte:byte].decode("utf-8"))
        previous_byte = byte
        offsets.append(previous_char)
    return offsets


def _token_boundaries(char_at: list[int], offsets: list[int]) -> list[int]:
    """The token boundary at or just before each character offset, sorted and unique."""
    return sorted({bisect.bisect_right(char_at, offset) - 1 for offset in offsets} - {0})


def _last_between(points: list[int], low: int, high: int) -> int | None:
    index = bisect.bisect_right(points, high) - 1
    return points[index] if index >= 0 and points[index] >= low else None


def _trimmed(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _located(*, order, text, token_count, char_start, char_end, sections, regions) -> ChunkSpan:
    index = section_index(sections, char_start, char_end)
    fields = region_fields(regions, char_start, char_end)
    # A page is the more precise place to jump to; a section when there are no pages.
    if not fields["anchor"] and index is not None:
        fields["anchor"] = f"section-{index + 1}"
    return ChunkSpan(
        order=order,
        text=text[char_start:char_end],
        token_count=token_count,
        char_start=char_start,
        char_end=char_end,
        section=SECTION_SEPARATOR.join(sections[index].path) if index is not None else "",
        **fields,
    )


def section_index(sections: Sequence[Section], start: int, end: int) -> int | None:
    """The index of the section holding most of the span, None for none."""
    best, best_overlap = None, 0
    for index, section in enumerate(sections):
        covered = min(end, section.end) - max(start, section.start)
        if covered > best_overlap:
            best, best_overlap = index, covered
    return best


def region_fields(regions: Sequence[Region], start: int, end: int) -> dict:
    """page_start, page_end, the location label ("p. 4", "pp. 4-5", "slide 3", "sheet Revenue")
    and the anchor of the first region."""
    covered = [region for region in regions if region.start < max(end, start + 1) and region.end > start]
    if not covered:
        return {"page_start": None, "page_end": None, "location": "", "anchor": ""}
    first, last = covered[0], covered[-1]
    return {
        "page_start": first.number,
        "page_end": last.number,
        "location": location_label(covered),
        "anchor": f"{first.kind}-{first.number}",
    }


def location_label(regions: Sequence[Region]) -> str:
    first, last = regions[0], regions[-1]
    if first.kind == "sheet":
        names = ", ".join(region.name for region in regions)
        return f"sheet{'s' if len(regions) > 1 else ''} {names}"[:80]
    if first.kind == "slide":
        return f"slide {first.number}" if first is last else f"slides {first.number}-{last.number}"
    return f"p. {first.number}" if first is last else f"pp. {first.number}-{last.number}"


def embedding_text(section: str, text: str) -> str:
    """What a chunk's vector is computed from: its section path, then its text, so a passage is
    found by the headings above it too."""
    return f"{section}\n\n{text}" if section else text
