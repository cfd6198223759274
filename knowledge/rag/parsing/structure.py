"""What a parser returns: the text and its shape (heading sections, pages, slides, sheets), built
block by block so every offset points into the final text."""

import re
from dataclasses import dataclass, field

from knowledge.rag.parsing.errors import ParseError

PARAGRAPH_BREAK = "\n\n"
_TRAILING_SPACE = re.compile(r"[ \t]+\n")
_BLANK_RUNS = re.compile(r"\n{3,}")


def clean_text(text: str) -> str:
    """NULs out, newlines normalized, trailing spaces and runs of blank lines trimmed."""
    text = text.replace("\x00", "").replace("\r\n", "\n").replace("\r", "\n")
    text = _TRAILING_SPACE.sub("\n", text)
    return _BLANK_RUNS.sub("\n\n", text).strip()


@dataclass(frozen=True)
class Section:
    """The text from a heading to the next heading, with the path of headings above it."""

    path: tuple[str, ...]
    start: int
    end: int


@dataclass(frozen=True)
class Region:
    """A page of a PDF, a slide of a deck or a sheet of a workbook (numbered from 1)."""

    kind: str
    number: int
    start: int
    end: int
    name: str = ""


@dataclass(frozen=True)
class ParsedDocument:
    text: str
    sections: tuple[Section, ...] = ()
    regions: tuple[Region, ...] = ()
    # The programming language of a source file, "" for everything else.
    language: str = ""

    def to_json(self) -> dict:
        return {
            "sections": [{"path": list(s.path), "start": s.start, "end": s.end} for s in self.sections],
            "regions": [
                {"kind": r.kind, "number": r.number, "name": r.name, "start": r.start, "end": r.end}
                for r in self.regions
            ],
            "language": self.language,
        }

    @classmethod
    def from_json(cls, text: str, data: dict | None) -> "ParsedDocument":
        data = data or {}
        return cls(
            text=text,
            sections=tuple(Section(tuple(s["path"]), s["start"], s["end"]) for s in data.get("sections", [])),
            regions=tuple(
                Region(r["kind"], r["number"], r["start"], r["end"], r.get("name", "")) for r in data.get("regions", [])
            ),
            language=data.get("language", ""),
        )


@dataclass
class Builder:
    """Collects blocks of text separated by blank lines, headings and regions, under a size limit.

    The limit is checked as blocks arrive, so a document far past it is refused after reading
    about the limit's worth of text, not all of it.
    """

    filename: str
    max_chars: int
    parts: list[str] = field(default_factory=list)
    length: int = 0
    sections: list[Section] = field(default_factory=list)
    regions: list[Region] = field(default_factory=list)
    _headings: list[tuple[int, str]] = field(default_factory=list)
    _section_start: int | None = None
    _region: tuple[str, int, str, int] | None = None

    def block(self, text: str, *, keep_lines: bool = True) -> int | None:
        """Append a block; returns its offset, or None when it holds no text."""
        text = clean_text(text) if keep_lines else " ".join(text.split())
        if not text:
            return None
        if self.parts:
            self.parts.append(PARAGRAPH_BREAK)
            self.length += len(PARAGRAPH_BREAK)
        start = self.length
        self.parts.append(text)
        self.length += len(text)
        if self.length > self.max_chars:
            raise ParseError(
                f"{self.filename} holds more than {self.max_chars:,} characters of text "
                "(PARSE_MAX_TEXT_CHARS). Split it into smaller documents."
            )
        return start

    def heading(self, level: int, title: str) -> None:
        title = " ".join(title.split())
        if not title:
            return
        self._close_section()
        while self._headings and self._headings[-1][0] >= level:
            self._headings.pop()
        self._headings.append((level, title))
        self._section_start = self.block(title)

    def start_region(self, kind: str, number: int, name: str = "") -> None:
        self.end_region()
        self._region = (kind, number, name, self.length + (len(PARAGRAPH_BREAK) if self.parts else 0))

    def end_region(self) -> None:
        if self._region is not None:
            kind, number, name, start = self._region
            if self.length > start:
                self.regions.append(Region(kind, number, start, self.length, name))
            self._region = None

    def _close_section(self) -> None:
        if self._section_start is not None and self.length > self._section_start:
            self.sections.append(Section(tuple(title for _, title in self._headings), self._section_start, self.length))
        self._section_start = None

    def result(self, language: str = "") -> ParsedDocument:
        self._close_section()
        self.end_region()
        return ParsedDocument("".join(self.parts), tuple(self.sections), tuple(self.regions), language)


def sections_from_headings(text: str, headings: list[tuple[int, int, str]]) -> tuple[Section, ...]:
    """Sections of a text whose headings are known as (offset, level, title), in order."""
    sections, path = [], []
    for index, (start, level, title) in enumerate(headings):
        while path and path[-1][0] >= level:
            path.pop()
        path.append((level, " ".join(title.split())))
        end = headings[index + 1][0] if index + 1 < len(headings) else len(text)
        end = len(text[:end].rstrip())
        if end > start:
            sections.append(Section(tuple(name for _, name in path), start, end))
    return tuple(sections)
