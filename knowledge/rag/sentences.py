"""The sentences of a document's text, each with its exact character span.

Extractive answers are made of these sentences and citations point at them, so a sentence must
read well on its own and its span must be exact. Structure comes from markdown-it-py: only
paragraphs (also inside list items and quotes) hold prose; headings, code, tables and HTML
blocks do not, and list and quote markers are not part of a sentence. Inside a paragraph,
spaCy's rule-based sentencizer on the tokenizer of the text's language (knowledge/rag/language.py;
English keeps "e.g.", "Dr." or "3.5" whole) finds the boundaries; a language written without
spaces (Japanese) ends a sentence at the same marks ("。", "？", "！") with the closing brackets
after them, never inside a 「quotation」. Text converted from HTML or PDF is parsed the same way;
a few line rules catch what Markdown does not mark there: short lines without punctuation inside
a paragraph (a PDF's headings and captions), lines without letters (page numbers), bullet
glyphs and numbered lines.

A sentence's `text` is `source[start:end]` made readable: whitespace runs become one space (none
between two characters of a script written without spaces), a word hyphenated across a line
break is joined ("retrie-\\nval" becomes "retrieval", unless the word already has a hyphen) and
the markers at the starts of lines inside it (a quote's ">", a list item's indentation, a
listing's line numbers) are left out.
"""

import bisect
import re
import threading
from dataclasses import dataclass
from functools import cache

from markdown_it import MarkdownIt

from knowledge.rag import language
from knowledge.rag.language import Language

# Abbreviations of papers and manuals that spaCy's English tokenizer would end a sentence on.
_ABBREVIATIONS = ("al.", "Fig.", "Figs.", "Eq.", "Eqs.", "Sec.", "Secs.", "Ch.", "Tab.", "cf.", "Cf.", "approx.")
# Indented code is not a thing in PDF or plain text, where indentation means nothing; fenced code is.
_MARKDOWN = MarkdownIt("commonmark").enable("table").disable("code")
_FENCE_LINE = re.compile(r"^ {0,3}(```|~~~)")
_NUMBERED_LINE = re.compile(r"^(\d{1,5})\s+(?=\S)")
_ITEM_MARKER = re.compile(r"^(?:[•◦▪‣●○■□➢✓-]|\(?\d{1,3}[.)])\s+(?=\S)")
_CLAUSE_END = tuple(".!?:;,")
_OPENING = frozenset("([{“‘«\"'")
_SENTENCE_END = re.compile(r"[.!?][\"'”’»)\]*_]*$")
_SENTENCE_START = re.compile(r"^[\"'“‘«(\[*_`]*\s*([^\W_])")
# Languages written without spaces: sentence ends, brackets closing after them, quotations.
_UNSPACED_END = re.compile(r"[。．！？｡.!?][」』）)】〕〉》”’\"']*$")
_UNSPACED_START = re.compile(r"^[「『（(【〔〈《“‘\"']*[^\W_]")
_CLOSING = "」』）)】〕〉》”’"
_QUOTATION = {"「": "」", "『": "』"}
_UNSPACED_MIN_CHARACTERS = 8
_WORD = re.compile(r"[^\W\d_][\w-]*")
_CAPTION = re.compile(r"^(?:Table|Figure|Fig\.|Listing|Algorithm)\s+\d+[.:]")
_HYPHENATED_BREAK = re.compile(r"(\S*[^\W\d_])-\n(?=[a-z])")
_MIN_WORDS = 4
_MAX_CHARS = 600
_MIN_LETTER_SHARE = 0.6
_lock = threading.Lock()


@dataclass(frozen=True)
class Sentence:
    text: str
    start: int
    end: int
    # Reads as a whole sentence on its own: starts like one, ends like one, is mostly words,
    # and is not the tail of a sentence cut off where the text begins.
    complete: bool


@cache
def _sentencizer(code: str):
    import spacy

    nlp = spacy.blank(code)
    nlp.add_pipe("sentencizer")
    for abbreviation in _ABBREVIATIONS:
        nlp.tokenizer.add_special_case(abbreviation, [{"ORTH": abbreviation}])
    return nlp


@cache
def _final_marks() -> frozenset[str]:
    # The sentencizer's own list of sentence-final punctuation, for every script.
    from spacy.pipeline.sentencizer import Sentencizer

    return frozenset(Sentencizer.default_punct_chars)


def _unspaced_spans(text: str) -> list[tuple[int, int]]:
    """Sentence spans of a text written without spaces: a sentence ends after its final marks
    and the closing brackets that follow them, outside any 「quotation」. An ASCII mark ends one
    only before a space or the end ("v1.5", "e.g." inside a Japanese sentence)."""
    spans, start, quoting, index = [], 0, [], 0
    marks = _final_marks()
    while index < len(text):
        character = text[index]
        if character in _QUOTATION:
            quoting.append(_QUOTATION[character])
        elif quoting and character == quoting[-1]:
            quoting.pop()
        elif character in marks and not quoting:
            end = index + 1
            while end < len(text) and (text[end] in marks or text[end] in _CLOSING):
                end += 1
            if character.isascii() and end < len(text) and not text[end].isspace():
                index += 1
                continue
            spans.append((start, end))
            start = index = end
            continue
        index += 1
    if start < len(text):
        spans.append((start, len(text)))
    return spans


def sentences(text: str, *, clipped: bool = False) -> list[Sentence]:
    """The sentences of the prose in `text`, in order, with spans into `text`.

    `clipped` says the text may begin in the middle of a sentence (a chunk cut out of a longer
    document by token count): then, unless it visibly begins at a line start, its first
    sentence is not complete.
    """
    lines = text.split("\n")
    line_starts = [0]
    for line in lines[:-1]:
        line_starts.append(line_starts[-1] + len(line) + 1)
    found = _prose_sentences(text, lines, line_starts, code_until=-1)
    fences = [number for number, line in enumerate(lines) if _FENCE_LINE.match(line)]
    if clipped and len(fences) % 2:
        # One fence without its pair: either the text ends inside a code block, or it begins
        # inside one opened before it. Whichever reading gives more prose is the right one.
        other = _prose_sentences(text, lines, line_starts, code_until=fences[0])
        if sum(s.complete for s in other) > sum(s.complete for s in found):
            found = other
    if found and clipped and "\n" not in text[: found[0].start] and not _begins_at_line_start(text):
        first = found[0]
        found[0] = Sentence(first.text, first.start, first.end, complete=False)
    return found


def _prose_sentences(text: str, lines: list[str], line_starts: list[int], *, code_until: int) -> list[Sentence]:
    units = [
        unit
        for segments in _paragraphs(lines, line_starts, code_until=code_until)
        for unit in _units(segments, text)
        if unit
    ]
    joined = ["\n".join(text[start:end] for start, end in unit) for unit in units]
    reader = language.of(text)
    if reader.spaces:
        with _lock:
            docs = list(_sentencizer(reader.code).pipe(joined))
        spans = [_spaced_spans(doc) for doc in docs]
    else:
        spans = [_unspaced_spans(unit) for unit in joined]
    return [
        sentence
        for unit, source, found in zip(units, joined, spans, strict=True)
        for sentence in _unit_sentences(unit, source, found, text, reader)
    ]


def _spaced_spans(doc) -> list[tuple[int, int]]:
    """The sentencizer's sentences, except that an opening bracket or quotation mark it left at
    the end of one ("... the last item in the list. (") begins the next, where it belongs. A
    quotation mark after a space opens; one right after the full stop closes ('... "stop."')."""
    spans = [[span.start_char, span.end_char, span] for span in doc.sents]
    for current, following in zip(spans, spans[1:], strict=False):
        sentence = current[2]
        if len(sentence) > 1 and sentence[-1].text in _OPENING and sentence[-2].whitespace_:
            current[1] = sentence[-2].idx + len(sentence[-2].text)
            following[0] = sentence[-1].idx
    return [(start, end) for start, end, _ in spans]


def _begins_at_line_start(text: str) -> bool:
    # Token chunks begin at a token boundary; a word in mid-line brings its leading space.
    head = text[:1]
    return head in ("", "\n") or head.isupper() or head.isdigit() or head in "#>|`*"


def _paragraphs(lines: list[str], line_starts: list[int], *, code_until: int):
    """Each paragraph as (start, end) segments of the text, one per line, markers left out.
    Lines up to `code_until` are the end of a code block that began before the text."""
    source = [""] * (code_until + 1) + lines[code_until + 1 :]
    tokens = _MARKDOWN.parse("\n".join(source))
    for previous, token in zip(tokens, tokens[1:], strict=False):
        if token.type != "inline" or previous.type != "paragraph_open" or token.map is None:
            continue
        first, _ = token.map
        segments = []
        for number, content in enumerate(token.content.split("\n"), start=first):
            content = content.strip()
            if not content or number >= len(lines):
                continue
            line = lines[number].rstrip()
            begin = len(line) - len(content) if line.endswith(content) else line.find(content)
            if begin >= 0:
                segments.append((line_starts[number] + begin, line_starts[number] + begin + len(content)))
        if segments:
            yield segments


def _units(segments: list[tuple[int, int]], text: str) -> list[list[tuple[int, int]]]:
    """A paragraph split where its lines show structure Markdown did not mark (PDF and plain text)."""
    lines = [text[start:end] for start, end in segments]
    numbered = [_NUMBERED_LINE.match(line) for line in lines]
    if len(lines) >= 3 and sum(map(bool, numbered)) >= 0.8 * len(lines):
        numbers = [int(match.group(1)) for match in numbered if match]
        if numbers == sorted(numbers):
            # A listing's line numbers, not part of what it says.
            segments = [
                (start + match.end(), end) if match else (start, end)
                for (start, end), match in zip(segments, numbered, strict=True)
            ]
            lines = [text[start:end] for start, end in segments]
    longest = max(len(line) for line in lines)
    units: list[list[tuple[int, int]]] = [[]]
    for index, ((start, end), line) in enumerate(zip(segments, lines, strict=True)):
        if not any(char.isalpha() for char in line):
            units.append([])  # a page number or a rule between two parts
            continue
        marker = _ITEM_MARKER.match(line) if index else None
        if marker:
            units.append([])
            start += marker.end()
        units[-1].append((start, end))
        following = lines[index + 1] if index + 1 < len(lines) else ""
        if (
            (following[:1].isupper() or following[:1].isdigit())
            and not line.endswith(_CLAUSE_END)
            and (len(line) < 0.6 * longest or len(line.split()) <= 8)
        ):
            units.append([])  # a line of its own: a heading, a caption, a table row
    return units


def _unit_sentences(
    unit: list[tuple[int, int]], joined: str, spans: list[tuple[int, int]], text: str, reader: Language
) -> list[Sentence]:
    """The sentences found in one unit (`spans` of its `joined` lines), mapped back to the text."""
    joined_starts, position = [], 0
    for start, end in unit:
        joined_starts.append(position)
        position += end - start + 1

    def source_offset(offset: int) -> int:
        index = bisect.bisect_right(joined_starts, offset) - 1
        return unit[index][0] + offset - joined_starts[index]

    found = []
    for span_start, span_end in spans:
        piece = joined[span_start:span_end]
        stripped = piece.strip()
        if not stripped:
            continue
        begin = span_start + len(piece) - len(piece.lstrip())
        finish = begin + len(stripped)
        readable = language.collapse_whitespace(_HYPHENATED_BREAK.sub(_joined_word, stripped))
        found.append(
            Sentence(
                text=readable,
                start=source_offset(begin),
                end=source_offset(finish - 1) + 1,
                complete=_reads_as_sentence(readable, reader),
            )
        )
    return found


def _joined_word(match: re.Match) -> str:
    word = match.group(1)
    # "state-of-the-\nart" keeps its hyphens; "retrie-\nval" was one word split by the layout.
    return f"{word}-" if "-" in word else word


def _title_case(words: list[str], reader: Language) -> bool:
    """A heading run into the text ("Graph-Enhanced Entity and Relationship Extraction.")
    capitalizes every content word; a sentence has a lowercase verb or noun somewhere."""
    content = [word for word in words if len(word) > 2 and word.casefold() not in reader.stop_words()]
    return len(content) >= 2 and all(word[0].isupper() for word in content)


def _reads_as_sentence(sentence: str, reader: Language) -> bool:
    visible = sentence.replace(" ", "")
    if not reader.spaces:
        return (
            len(visible) >= _UNSPACED_MIN_CHARACTERS
            and len(sentence) <= _MAX_CHARS
            and bool(_UNSPACED_START.match(sentence))
            and bool(_UNSPACED_END.search(sentence))
            and sum(char.isalpha() for char in visible) >= _MIN_LETTER_SHARE * len(visible)
            and sentence.count("|") < 2
        )
    start = _SENTENCE_START.match(sentence)
    return (
        len(sentence.split()) >= _MIN_WORDS
        and len(sentence) <= _MAX_CHARS
        and bool(start and (start[1].isupper() or start[1].isdigit()))
        and bool(_SENTENCE_END.search(sentence))
        and sum(char.isalpha() for char in visible) >= _MIN_LETTER_SHARE * len(visible)
        and sentence.count("|") < 2
        and not _CAPTION.match(sentence)
        and not _title_case(_WORD.findall(sentence), reader)
    )
