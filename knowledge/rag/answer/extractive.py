"""The extractive answer, given when no chat model is configured: the sources' own sentences
that best answer the question, each with its citation marker."""

import logging
import math
import re
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from knowledge.rag import language, llm
from knowledge.rag.answer.reading import WORD, Read, chunk_sentences, content_terms
from knowledge.rag.retrieval import ChunkRow, Keywords, RetrievalResult
from knowledge.rag.sentences import Sentence

logger = logging.getLogger(__name__)

DEFAULT_RESPONSE_TYPE = "Multiple Paragraphs"
NO_CONTEXT_ANSWER = (
    "I could not find anything about this in the workspace's documents, so I cannot answer it from them. "
    "Try other words, another mode, or check that the documents you expect have been processed."
)
# An extractive answer keeps the sentences whose relevance reaches both this floor and this
# share of the best sentence's, at most EXTRACTIVE_MAX_SENTENCES of them (docs/asking.md, "Extractive
# answers", says how they were chosen).
EXTRACTIVE_MIN_RELEVANCE = 0.35
EXTRACTIVE_RELATIVE_RELEVANCE = 0.65
EXTRACTIVE_MAX_SENTENCES = 5
# How much of a sentence's relevance is covering the question's subjects (the rest is covering
# what it asks about them).
EXTRACTIVE_SUBJECT_SHARE = 0.6
# A subject the passage names counts this much for a sentence of it that does not.
EXTRACTIVE_PASSAGE_CREDIT = 0.5
# Two sentences sharing this share of their terms say the same thing; the answer keeps one.
EXTRACTIVE_DUPLICATE_OVERLAP = 0.8
# What a unit of the kind the question asks for (a number for "how many", a table or a list for
# "which ... exist") adds to its relevance; the terms a follow-up takes from the turn before count
# this much of their weight (the new question's own words say what is asked now).
EXTRACTIVE_ASK_BONUS = 0.2
EXTRACTIVE_REFERRED_WEIGHT = 0.5
# A sentence of a document the question does not name, when it names one by its title ("what
# does the functional programming HOWTO say about generators"), keeps this share of its relevance.
EXTRACTIVE_OTHER_DOCUMENT = 0.5
# Tables and lists longer than this are cut; the citation leads to the rest.
EXTRACTIVE_MAX_ROWS = 12
# A last candidate may complete the answer with what the question asks and no kept one says, when
# it says at least this many of those terms and this share of their weight.
EXTRACTIVE_COMPLETION_TERMS = 2
EXTRACTIVE_COMPLETION_SHARE = 0.34
# ... from one of the passages retrieved first: further down, a sentence saying two of the
# question's words is more often about something else ("real life" in a passage about another film).
EXTRACTIVE_COMPLETION_PASSAGES = 10
# A candidate in another language than the question's shares none of its words but names and
# numbers, so the multilingual embedding model judges it: this many of them, those sharing most
# of the question's terms first (then in retrieval order), beside this many of the question's own
# language, its best, to compare them with (docs/asking.md, "Answers across languages").
EXTRACTIVE_FOREIGN_CANDIDATES = 16
EXTRACTIVE_FOREIGN_REFERENCES = 3


# "Who founded Acme and where is it based?": a conjunction or a question mark followed by
# another question word starts a second question.
_QUESTION_PART = re.compile(
    r"(?:[,;]?\s+(?:and|or|but)\s+|[?;]\s*)(?=(?:who|whom|whose|what|which|where|when|why|how|is|are|was|were|"
    r"do|does|did|can|could|should|will|would|has|have|had)\b)",
    re.IGNORECASE,
)
_BACK_REFERENCE = re.compile(r"\b(?:it|its|they|them|their|he|him|his|she|her)\b", re.IGNORECASE)


_ASKS = (
    # "Which gzip option keeps ...?", "どのオプションで...": a manual's option with its description.
    ("option", r"\b(?:which|what) (?:[\w-]+ )?(?:option|flag|switch)\b|どの(?:\S{0,8})?オプション"),
    # "How do I create ...?", "How should a logger be named?", not "How do they differ?".
    ("code", r"^\s*how (?:(?:do|can|should|would) (?:i|you|we|one|a|an|the)|to)\b|\b(?:example|syntax|command)\b"),
    ("number", r"\b(?:how (?:many|much|long|large|big|fast|often|old)|(?:what|which) (?:percentage|number|size))\b"),
    # "When was ...?", "... first developed when?", not "What does pop() do when no index is given?".
    ("date", r"^\s*(?:since |until )?when\b|\bwhen\s*\?\s*$|\b(?:what|which) (?:year|date|day|time)\b"),
    ("author", r"^\s*who (?:wrote|authored|created|maintains)\b|^\s*who is the (?:author|creator|maintainer)\b"),
    ("name", r"^\s*(?:who|whom|whose)\b"),
    ("list", r"\b(?:which|what) (?:\w+ ){0,3}(?:exist|are there|are available)|\b(?:list|name) (?:all|the)\b|"
             r"^\s*what are the\b"),
)  # fmt: skip
# The words that only say what kind of answer is asked for, no word for the answer to repeat:
# "Which logging levels exist?" is not answered by "the existing levels have been chosen ...",
# and a page says who wrote it in its "Author:" field, not with "wrote".
_ASK_WORDS = {
    "list": re.compile(r"\b(?:exists?|available)\b", re.IGNORECASE),
    "author": re.compile(r"\b(?:wrote|authored|created|maintains|author|creator|maintainer)\b", re.IGNORECASE),
    "option": re.compile(r"\b(?:options?|flags?|switch(?:es)?)\b|オプション", re.IGNORECASE),
}
# "What makes a function a generator function?": "makes" asks what does; "This often makes it
# difficult ..." says nothing of it.
_WHAT_MAKES = re.compile(r"^(\s*what) makes\b", re.IGNORECASE)
# What gives an author: a field "Author: ..." or a sentence naming someone with such a word.
_AUTHORSHIP = re.compile(r"\b(?:wrote|written by|authored|authors?|created by|creators?|maintainers?)\b", re.IGNORECASE)
# A field of a document as HTML parsers leave a field list ("Author:", then "- A. M. Kuchling"),
# read as one unit "Author: A. M. Kuchling".
_FIELD_LABEL = re.compile(r"^[A-Za-z][\w -]{0,30}:$")
# "What is an iterator?", "What does the HOWTO say about generators?": the subject a sentence
# that defines it opens with.
_DEFINITION = re.compile(
    r"^\s*what (?:is|are) (?:an? |the )?(?P<what>[^?]{1,40})\?\s*$|\bsay about (?P<about>[^?]{1,40})\?", re.IGNORECASE
)
_DEFINES = re.compile(r"^(?:(?:an?|the)\s+)?(?P<subject>.{1,60}?)\s+(?:is|are|refers to|means)\b", re.IGNORECASE)
_NUMBER = re.compile(r"\d")
# Years are not words in Japanese ("1927年に"), so digits around them, not word boundaries, end them.
_DATE = re.compile(
    r"(?<!\d)(?:1[5-9]\d\d|20\d\d)(?!\d)|\b(?:January|February|March|April|May|June|July|August|September|October|"
    r"November|December)\b"
)
_NAME = re.compile(r"(?<!^)(?<![.!?] )\b[A-Z][\w'-]+(?: (?:[A-Z][\w'-]+|de|van|von|of))* [A-Z][\w'-]+")
_TABLE_LINE = re.compile(r"^[^|\n]+(?: \| [^|\n]*)+$|^\|.*\|$")
_TABLE_RULE = re.compile(r"^\|?\s*:?-{3,}")
_LIST_LINE = re.compile(r"^(?:[-*•] |\d{1,2}[.)] )\S")
# A line of code or a command, as HTML and Markdown parsers leave a <pre> block: a prompt or a
# coding line, or a line that does not end like a sentence and holds a call, an assignment, an
# option or brackets. Sentences that name set() or -m end like sentences.
_CODE_LINE = re.compile(
    r"^(?:>>>|\.\.\.|\$) |^#!|^# -\*-|"
    r"^(?!.*[.!?:]$)\S.*(?:\w\(.*\)|\s=\s|\s--?\w|[{}\[\];])"
)
# A sentence that names a call or an option inline gives code too ("use set(), not {}").
_INLINE_CODE = re.compile(r"\w\(\S*\)|\s--?[a-z]\w*\b")


def _ask(question: str) -> str | None:
    """The kind of answer a question asks for: a manual's option, code, a number, a date, a
    name, a list, a definition, or None."""
    kind = next((kind for kind, pattern in _ASKS if re.search(pattern, question, re.IGNORECASE)), None)
    return kind or ("definition" if _DEFINITION.search(question) else None)


def _defined(question: str) -> str:
    """What a definition question asks about, as it says it ("iterator", "generators")."""
    match = _DEFINITION.search(question)
    return " ".join((match.group("what") or match.group("about")).casefold().split()) if match else ""


def _gives(kind: str, text: str, defined: str = "") -> bool:
    if kind == "definition":
        # The sentence opens with the very words asked about: "An iterator is ..." defines an
        # iterator; "Iterators are an important foundation ..." only says something of them.
        match = _DEFINES.match(text)
        return bool(defined) and match is not None and " ".join(match.group("subject").casefold().split()) == defined
    if kind == "code":
        return bool(_INLINE_CODE.search(text))
    if kind == "number":
        return bool(_NUMBER.search(re.sub(r"\[S\d+\]", "", text)))
    if kind == "date":
        return bool(_DATE.search(text))
    if kind == "name":
        return bool(_NAME.search(text))
    if kind == "author":
        return bool(_AUTHORSHIP.search(text)) and bool(_NAME.search(text) or text.casefold().startswith("author:"))
    return False


@dataclass(eq=False)
class _Candidate:
    read: Read
    row: ChunkRow
    # The terms of its chunk and document title: a sentence of a passage about a subject is
    # about it too, even when it does not name it ("2 GB of free disk space.").
    passage: set[str]
    relevance: float = 0.0
    # "sentence", "table", "list" and "code" for a block of rows, items or lines read as one unit,
    # "field" for a field list's label with its values, "option" for a manual's option with its description.
    kind: str = "sentence"
    title: frozenset[str] = frozenset()
    # The ISO 639-1 code of its chunk's language (knowledge.rag.language).
    language: str = "en"

    @property
    def sentence(self) -> Sentence:
        return self.read.sentence


def _question_parts(question: str, keywords: Keywords, earlier: Sequence[str] = ()) -> list[set[str]]:
    """The terms of each question a compound question asks. A part that refers back ("where
    is it based?") also gets the names asked about before it, and every part gets the keyword
    terms the question itself lacks (what a follow-up's "it" stands for), or without keywords
    the terms of the `earlier` questions a follow-up was retrieved with."""
    asked = content_terms(question)
    # Without keywords (naive mode) a follow-up's referent is in the questions it was retrieved with.
    given = [*keywords.low_level, *keywords.high_level] or earlier
    referred = {term for keyword in given for term in content_terms(keyword)} - asked
    parts, names = [], set()
    for text in _QUESTION_PART.split(question):
        terms = content_terms(text)
        if _BACK_REFERENCE.search(text):
            terms |= names
        names |= {
            term
            for keyword in keywords.low_level
            if keyword.casefold() in text.casefold()
            for term in content_terms(keyword)
        }
        if terms:
            parts.append(terms | referred)
    compared = _compared(question, keywords)
    if len(parts) == 1 and len(compared) >= 2:
        # "Which band was formed first, The Exies or Circus Diablo?": what is asked, of each.
        named = set().union(*compared)
        parts = [(parts[0] - named) | terms for terms in compared]
    return parts or ([referred] if referred else [])


# "Are both A and B ...?", "Which ..., A or B?", "Were A and B of the same ...?"
_COMPARES = re.compile(r"\b(?:both|or|either|same|different)\b", re.IGNORECASE)
_JOINED = re.compile(r",\s*|\s+(?:and|or)\s+")


def _compared(question: str, keywords: Keywords) -> list[set[str]]:
    """The terms of each thing a comparison question names (the names among its low-level
    keywords, as written in the question), or nothing when it compares nothing."""
    if not _COMPARES.search(question):
        return []
    # A keyword may join two names ("Exies or Circus Diablo"): each is a thing of its own.
    names = {name.strip() for keyword in keywords.low_level for name in _JOINED.split(keyword)}
    named = [
        content_terms(name) for name in sorted(names) if name[:1].isupper() and name in question and content_terms(name)
    ]
    # A name inside another ("Diablo" in "Circus Diablo") is not a thing of its own.
    return [terms for terms in named if not any(terms < other for other in named)]


def _candidates(result: RetrievalResult) -> list[_Candidate]:
    """Every complete sentence of the sources, once, and every table and list as one unit each:
    a sentence in two overlapping chunks, or the same words in two documents, is kept where its
    chunk ranks first."""
    found, seen = [], set()
    for row in result.chunks:
        # A page's title is its heading as well as its file name ("Functional Programming HOWTO",
        # the root of the section path, for howto-functional.html), and a sentence under the
        # heading "Generators" is about generators.
        heading = row.section.split(" > ", 1)[0]
        passage = content_terms(f"{row.document_title}\n{row.section}\n{row.text}")
        code = language.of(row.text).code
        title = frozenset(content_terms(f"{row.document_title}\n{heading}"))
        reads = chunk_sentences(row.text, row.char_start)
        for read in reads:
            key = " ".join(WORD.findall(read.sentence.text.casefold()))
            if not read.sentence.complete or key in seen:
                continue
            seen.add(key)
            found.append(_Candidate(read, row, passage, title=title, language=code))
        options = _option_entries(row.text)
        for kind, block in _blocks(row.text):
            key = " ".join(WORD.findall(block.text.casefold()))
            # An option's line is read with its description, not as code of its own.
            if key in seen or any(block.start < option.end and option.start < block.end for option in options):
                continue
            seen.add(key)
            start, end = row.char_start + block.start, row.char_start + block.end
            lead = _introduction(reads, row, block)
            terms = frozenset(content_terms(block.text))
            read = Read(
                Sentence(block.text, start, end, True),
                terms,
                terms | (content_terms(lead.text) if lead else set()),
                lead,
            )
            found.append(_Candidate(read, row, passage, kind=kind, title=title, language=code))
        for kind, field in [("field", field) for field in _fields(row.text)] + [
            ("option", option) for option in options
        ]:
            key = " ".join(WORD.findall(field.text.casefold()))
            if key in seen:
                continue
            seen.add(key)
            terms = frozenset(content_terms(field.text))
            sentence = Sentence(field.text, row.char_start + field.start, row.char_start + field.end, True)
            found.append(
                _Candidate(Read(sentence, terms, terms, None), row, passage, kind=kind, title=title, language=code)
            )
    return found


def _fields(text: str) -> list["_Block"]:
    """The fields of a chunk ("Author:" with its "- value" lines below), each as "Label: value";
    a label repeated right below ("author:" twice) joins its values."""
    fields, label, values, start, end = [], None, [], 0, 0
    position = 0

    def close():
        if label and values:
            if fields and fields[-1][0].casefold() == label.casefold():
                previous = fields.pop()
                fields.append((label, previous[1] + values, previous[2], end))
            else:
                fields.append((label, list(values), start, end))

    for line in text.split("\n"):
        stripped = line.strip()
        if _FIELD_LABEL.match(stripped):
            close()
            label, values, start = stripped[:-1], [], position
        elif label and _LIST_LINE.match(stripped):
            values.append(stripped[2:].strip())
            end = position + len(line)
        else:
            close()
            label, values = None, []
        position += len(line) + 1
    close()
    return [_Block(f"{name}: {', '.join(found)}", begin, finish) for name, found, begin, finish in fields]


# A manual's entry for an option ("-H, --si", "-#", "--output[=FIELD_LIST]") or a format ("%s"):
# the option on a line of its own, its description on the lines below it in the same paragraph.
# Wider than the options that are terms (knowledge.rag.language): "-#" and "-9" begin entries.
_OPTION_TERM = re.compile(r"^(?:--?[\w#]|%\S)[^\n]{0,58}$")
_SENTENCE_END = re.compile(r"[.!?:。．！？：]$")


def _option_entries(text: str) -> list["_Block"]:
    """The options a manual page describes, each with its description as one unit
    ("-H, --si: 1000 の累乗でサイズを表示する"): the description alone does not say which option
    it describes, and often does not end like a sentence."""
    found, position = [], 0
    for paragraph in text.split("\n\n"):
        lines = paragraph.strip().split("\n")
        if len(lines) >= 2 and _OPTION_TERM.match(lines[0].strip()) and not _SENTENCE_END.search(lines[0].strip()):
            description = " ".join(line.strip() for line in lines[1:])
            start = position + paragraph.index(lines[0])
            found.append(_Block(f"{lines[0].strip()}: {description}", start, position + len(paragraph.rstrip())))
        position += len(paragraph) + 2
    return found


_INTRODUCES = re.compile(r"\b(?:following|below|table|list)\b|:$", re.IGNORECASE)


def _introduction(reads: Sequence[Read], row: ChunkRow, block) -> Sentence | None:
    """The sentence that introduces a table or a list: of the paragraph right above it, the one
    that says so ("... given in the following table."), else its last."""
    above = []
    for read in reads:
        if read.sentence.end - row.char_start > block.start:
            break
        gap = row.text[read.sentence.end - row.char_start : block.start]
        if (
            gap.count("\n") > 2
            and above
            and "\n\n" in row.text[above[-1].end - row.char_start : read.sentence.start - row.char_start]
        ):
            above = []
        above.append(read.sentence)
    if not above or row.text[above[-1].end - row.char_start : block.start].count("\n") > 2:
        return None
    return next((sentence for sentence in above if _INTRODUCES.search(sentence.text)), above[-1])


@dataclass(frozen=True)
class _Block:
    text: str
    start: int
    end: int


def _blocks(text: str) -> list[tuple[str, _Block]]:
    """The tables (runs of "a | b" rows, the first its header), lists (runs of "- item" lines) and
    code (runs of code lines, one is enough) of a chunk, as Markdown the answer can show: a
    table keeps its header above its rows, code is fenced."""
    blocks, run, kind = [], [], None
    position = 0
    lines = []
    for line in text.split("\n"):
        lines.append((line, position))
        position += len(line) + 1

    def close():
        if len(run) >= (1 if kind == "code" else 2):
            start, end = run[0][1], run[-1][1] + len(run[-1][0])
            if kind == "table":
                rows = [[cell.strip() for cell in line.strip().strip("|").split("|")] for line, _ in run]
                rows = [row for row in rows if not _TABLE_RULE.match(" | ".join(row))]
                header, body = rows[0], rows[1 : EXTRACTIVE_MAX_ROWS + 1]
                shown = [f"| {' | '.join(header)} |", "|" + "---|" * len(header)]
                shown += [f"| {' | '.join(row)} |" for row in body]
            elif kind == "code":
                shown = ["```", *(line.rstrip() for line, _ in run[:EXTRACTIVE_MAX_ROWS]), "```"]
            else:
                shown = [line.strip() for line, _ in run[:EXTRACTIVE_MAX_ROWS]]
            blocks.append((kind, _Block("\n".join(shown), start, end)))

    for line, start in lines:
        stripped = line.strip()
        line_kind = (
            "table"
            if _TABLE_LINE.match(stripped)
            else "list"
            if _LIST_LINE.match(stripped)
            else "code"
            if _CODE_LINE.match(stripped)
            else None
        )
        if line_kind != kind:
            close()
            run, kind = [], line_kind
        if line_kind:
            run.append((line, start))
    close()
    return blocks


def _near_duplicate(candidate: _Candidate, chosen: Sequence[_Candidate]) -> bool:
    return any(
        len(candidate.read.terms & other.read.terms)
        >= EXTRACTIVE_DUPLICATE_OVERLAP * len(candidate.read.terms | other.read.terms)
        for other in chosen
    )


def extractive_answer(question: str, result: RetrievalResult, response_type: str = DEFAULT_RESPONSE_TYPE) -> str:
    """The sources' sentences, tables and lists that answer the question, best first, each with its [S#].

    A term weighs its inverse document frequency over the candidates (the words that tell them
    apart count most); the terms a follow-up takes from the turn before weigh
    EXTRACTIVE_REFERRED_WEIGHT of theirs. A candidate's relevance to a part of the question mixes
    the shares it covers of the part's subjects (low-level keyword terms, weighing
    EXTRACTIVE_SUBJECT_SHARE; one its passage names counts EXTRACTIVE_PASSAGE_CREDIT) and of the
    rest, plus EXTRACTIVE_ASK_BONUS when it gives what the question asks for (a number, a date, a
    name, a table or a list, code, a definition, a manual's option); an option the question names
    ("-i") is one of its subjects; when the question names a document by its title, candidates of
    other documents keep EXTRACTIVE_OTHER_DOCUMENT of it; ties go to the candidate
    repeating more of the question's own words. Kept: for a compound question, or one comparing
    things it names, first the best candidate of each part; then, best first, those above the floor
    that cover a term of the question no kept one covers (no padding), at most
    EXTRACTIVE_MAX_SENTENCES; then, for a question whose answer is one hop further, the best
    candidate of another passage that names what the answer so far named and the question did not
    (its bridge); last, one that says what the question asks and nothing kept says (_completion)."""
    candidates = _candidates(result)
    if not candidates:
        return NO_CONTEXT_ANSWER
    ask = _ask(question)
    topic = _WHAT_MAKES.sub(r"\1", _ASK_WORDS[ask].sub(" ", question) if ask in _ASK_WORDS else question)
    # "What does df's -i option show?": the option it names is its subject, "option" no word to cover.
    named_options = {term for term in content_terms(question) if term.startswith("-")}
    if named_options:
        topic = _ASK_WORDS["option"].sub(" ", topic)
    parts = _question_parts(topic, result.keywords, result.referred)
    asked = content_terms(topic)
    wanted = set().union(*parts)
    frequency = Counter(term for candidate in candidates for term in candidate.read.about & wanted)
    asked_in = language.of(question).code
    across = any(candidate.language != asked_in for candidate in candidates)
    if across:
        # A term no candidate says may be said by one in another language, in other words: it is
        # still asked, as the rarest term ("Who writes about ...?" is not answered by "The root
        # logger writes to standard error" for sharing "writes" alone).
        frequency.update({term: 1 for term in wanted if term not in frequency})
    weight = {
        term: math.log(1 + len(candidates) / count) * (1.0 if term in asked else EXTRACTIVE_REFERRED_WEIGHT)
        for term, count in frequency.items()
    }
    subjects = {term for keyword in result.keywords.low_level for term in content_terms(keyword)} | named_options
    defined = _defined(question) if ask == "definition" else ""
    # Question words that name a retrieved document ("the functional programming HOWTO").
    titled = {term for candidate in candidates for term in candidate.title & asked}
    scope = max((candidate.title & titled for candidate in candidates), key=len, default=frozenset())
    # A comparison names two things, often two documents: neither is the question's scope.
    scoped = len(scope) >= 2 and len(_compared(question, result.keywords)) < 2

    def coverage(candidate: _Candidate, terms: set[str]) -> float:
        about = candidate.read.about | (candidate.title & terms)
        covered = sum(weight.get(term, 0.0) for term in about & terms)
        implied = sum(weight.get(term, 0.0) for term in (candidate.passage - about) & terms & subjects)
        return (covered + EXTRACTIVE_PASSAGE_CREDIT * implied) / sum(weight.get(term, 0.0) for term in terms)

    def relevance(candidate: _Candidate, part: set[str]) -> float:
        groups = [
            (share, group)
            for share, group in (
                (EXTRACTIVE_SUBJECT_SHARE, part & subjects),
                (1 - EXTRACTIVE_SUBJECT_SHARE, part - subjects),
            )
            if any(weight.get(term) for term in group)
        ]
        total = sum(share for share, _ in groups)
        score = sum(share * coverage(candidate, group) for share, group in groups) / total if groups else 0.0
        if score and ask and _answers_ask(ask, candidate, defined):
            score += EXTRACTIVE_ASK_BONUS
        if scoped and not scope <= candidate.title:
            score *= EXTRACTIVE_OTHER_DOCUMENT
        return score

    for candidate in candidates:
        candidate.relevance = max((relevance(candidate, part) for part in parts), default=0.0)
    if across:
        for candidate, coverage_estimate in _across_languages(question, candidates, asked_in, ask).items():
            bonus = EXTRACTIVE_ASK_BONUS if coverage_estimate and ask and _answers_ask(ask, candidate, defined) else 0.0
            scale = EXTRACTIVE_OTHER_DOCUMENT if scoped and not scope <= candidate.title else 1.0
            candidate.relevance = (coverage_estimate + bonus) * scale
    # Among equals, the one that repeats more of the question's own words, stop words included
    # ("to create an empty set").
    said = set(WORD.findall(question.casefold()))
    # For "Which logging levels exist?", of equally relevant tables and lists the table headed
    # "Level" is the one whose rows are levels.
    ranked = sorted(
        candidates,
        key=lambda c: (
            -c.relevance,
            not (ask == "list" and _headed_by(c, subjects)),
            -len(said & set(WORD.findall(c.sentence.text.casefold()))),
        ),
    )
    best = ranked[0].relevance
    floor = max(EXTRACTIVE_MIN_RELEVANCE, EXTRACTIVE_RELATIVE_RELEVANCE * best)
    chosen: list[_Candidate] = []
    covered: set[str] = set()

    def choose(candidate: _Candidate, *, new_terms_only: bool) -> None:
        # Only the question's own words count as new: what a follow-up borrows from the turn
        # before chose the topic, and would otherwise keep sentences of the earlier topic too.
        adds = (candidate.read.about & asked) - covered
        if (
            len(chosen) < EXTRACTIVE_MAX_SENTENCES
            and candidate not in chosen
            and not _near_duplicate(candidate, chosen)
            and (adds or not new_terms_only or not chosen)
        ):
            chosen.append(candidate)
            covered.update(candidate.read.about & asked)

    if len(parts) > 1:
        for part in parts:
            scored = [(relevance(candidate, part), candidate) for candidate in candidates]
            part_best = max(score for score, _ in scored)
            if part_best >= EXTRACTIVE_MIN_RELEVANCE:
                choose(next(candidate for score, candidate in scored if score == part_best), new_terms_only=False)
    for candidate in ranked:
        if candidate.relevance < floor:
            break
        choose(candidate, new_terms_only=True)
    if not chosen:
        # Retrieval found passages but none shares the question's words (another language, a
        # paraphrase): the first of the best passage is still closer than "nothing found".
        chosen.append(ranked[0] if best > 0 else candidates[0])
    bridge = _second_hop(question, chosen, candidates, weight, asked)
    if bridge is not None and len(chosen) < EXTRACTIVE_MAX_SENTENCES:
        chosen.insert(1, bridge)
    rest = _completion(chosen, candidates, weight, asked)
    if rest is not None and len(chosen) < EXTRACTIVE_MAX_SENTENCES:
        chosen.append(rest)
    lines, shown = [], set()
    for candidate in chosen:
        if candidate.sentence in shown:
            continue
        lead = candidate.read.lead if candidate.read.lead not in shown else None
        shown |= {candidate.sentence, lead} - {None}
        marker = f"[{candidate.row.id}]"
        if candidate.kind in ("sentence", "field", "option"):
            # The citation marks the sentence that answers; the one before it is there to be read with it.
            lines.append(" ".join(filter(None, [lead and lead.text, candidate.sentence.text, marker])))
        else:
            lines.append("\n\n".join(filter(None, [lead and f"{lead.text} {marker}", candidate.sentence.text])))
            if not lead:
                lines[-1] += f"\n\n{marker}"
    if "paragraph" in response_type.casefold() and "single" in response_type.casefold():
        return " ".join(lines)
    return "\n".join(line if "\n" in line else f"- {line}" for line in lines)


def _across_languages(
    question: str, candidates: Sequence[_Candidate], asked_in: str, ask: str | None
) -> dict[_Candidate, float]:
    """How much of the question each candidate in another language says, on the scale of the
    shares of its terms a candidate covers, as the multilingual embedding model judges it: the
    question's similarity to the candidate, from the median of the candidates judged (0) to the
    best of them (1). Judged are EXTRACTIVE_FOREIGN_CANDIDATES of the other languages, those
    covering most of the question's terms first (names, numbers and identifiers are written
    alike in both), then in retrieval order, and the
    EXTRACTIVE_FOREIGN_REFERENCES best of the question's language, so that a sentence in another
    language leads only where the model finds it closer to the question than the best sentence
    in the question's own. Those of other languages it does not judge get 0, and without an
    embedding model at hand all of them do; code is judged only when code is asked for (to the
    model, a command's synopsis is close to any question about the command)."""
    order = {chunk_id: rank for rank, chunk_id in enumerate(dict.fromkeys(c.row.chunk_id for c in candidates))}
    foreign = sorted(
        (candidate for candidate in candidates if candidate.language != asked_in),
        key=lambda candidate: (-candidate.relevance, order[candidate.row.chunk_id]),
    )
    judged = [candidate for candidate in foreign if candidate.kind != "code" or ask == "code"]
    judged = judged[:EXTRACTIVE_FOREIGN_CANDIDATES]
    own = sorted((candidate for candidate in candidates if candidate.language == asked_in), key=lambda c: -c.relevance)[
        :EXTRACTIVE_FOREIGN_REFERENCES
    ]
    estimates = dict.fromkeys(foreign, 0.0)
    try:
        (asked,) = llm.embed([question], purpose="query")
        vectors = llm.embed([candidate.sentence.text for candidate in judged + own], purpose="passage")
    except llm.LLMError as exc:
        logger.warning("Answer sentences in other languages than the question's were not judged: %s", exc)
        return estimates
    similarity = [sum(a * b for a, b in zip(asked, vector, strict=True)) for vector in vectors]
    low, high = statistics.median(similarity), max(similarity)
    for candidate, value in zip(judged, similarity, strict=False):
        estimates[candidate] = max(0.0, (value - low) / (high - low)) if high > low else 1.0
    return estimates


def _headed_by(candidate: _Candidate, subjects: set[str]) -> bool:
    """Is the candidate a table with a column named by one of the question's subjects?"""
    if candidate.kind != "table":
        return False
    header = candidate.sentence.text.split("\n", 1)[0].strip("| ").split(" | ")
    return any(content_terms(cell) & subjects for cell in header)


def _answers_ask(ask: str, candidate: _Candidate, defined: str) -> bool:
    """Does the candidate give the kind of answer asked for? A list is asked of tables and lists,
    code of code blocks or a sentence naming a call, the rest of the text of any candidate."""
    if ask == "list":
        return candidate.kind in ("table", "list")
    if ask == "option":
        return candidate.kind == "option"
    if ask == "code" and candidate.kind == "code":
        return True
    return _gives(ask, candidate.sentence.text, defined)


def _completion(chosen, candidates, weight, asked) -> _Candidate | None:
    """The candidate that best says what the question asks and the answer so far does not ("was
    awarded what medal?" when the chosen sentences only name the film): at least
    EXTRACTIVE_COMPLETION_TERMS of the uncovered terms and EXTRACTIVE_COMPLETION_SHARE of their
    weight, in one of the first EXTRACTIVE_COMPLETION_PASSAGES passages retrieved."""
    said = set().union(*(candidate.read.about | candidate.title for candidate in chosen))
    missing = asked - said
    total = sum(weight.get(term, 0.0) for term in missing)
    if len(missing) < EXTRACTIVE_COMPLETION_TERMS or not total:
        return None
    best, best_share = None, EXTRACTIVE_COMPLETION_SHARE
    first = list(dict.fromkeys(candidate.row.chunk_id for candidate in candidates))[:EXTRACTIVE_COMPLETION_PASSAGES]
    for candidate in candidates:
        if candidate.row.chunk_id not in first:
            continue
        gives = candidate.read.about & missing
        share = sum(weight.get(term, 0.0) for term in gives) / total
        if len(gives) >= EXTRACTIVE_COMPLETION_TERMS and share > best_share and not _near_duplicate(candidate, chosen):
            best, best_share = candidate, share
    return best


# A name in the answer that the question did not name: a capitalized run of words, or a single
# capitalized word not at the start of its sentence; initials belong to it ("M. Ward"), a
# possessive does not ("Ezer Weizman's resignation").
_BRIDGE = re.compile(r"(?<![.!?]\s)(?<!^)\b(?:[A-Z]\.\s*)*[A-Z][\w'-]*(?:\s+(?:[A-Z][\w'-]*|of|de|von|van|the))*")
_POSSESSIVE = re.compile(r"['’]s$")


def _second_hop(question, chosen, candidates, weight, asked) -> _Candidate | None:
    """The best candidate of another passage that names a bridge of the answer so far (a name
    it gives and the question does not) and covers what it left uncovered:
    "the director of film X" is named on X's page, and the director's nationality on another."""
    names = {
        _POSSESSIVE.sub("", match.group().strip())
        for kept in chosen
        for match in _BRIDGE.finditer(kept.sentence.text)
        if not content_terms(match.group()) <= asked and content_terms(match.group())
    }
    if not names:
        return None
    missing = asked - set().union(*(kept.read.about | kept.title for kept in chosen))
    read = {kept.row.chunk_id for kept in chosen}
    best, best_score = None, 0.0
    for candidate in candidates:
        if candidate.row.chunk_id in read:
            continue
        text = candidate.sentence.text
        # The bridge is what the other passage is about: its title, or the subject its sentence opens with.
        named = [name for name in names if text.startswith(name) or name in candidate.row.document_title]
        if not named:
            continue
        still = sum(weight.get(term, 0.0) for term in missing & candidate.read.about)
        total = sum(weight.get(term, 0.0) for term in missing) or 1.0
        # Naming the bridge is half of it; the other half is what the question still asks.
        score = 0.5 + 0.5 * still / total
        if candidate.sentence == _first_sentence(candidate.row):
            score += 0.05  # the passage's first sentence says what its subject is
        if score > best_score:
            best, best_score = candidate, score
    return best if best_score >= EXTRACTIVE_MIN_RELEVANCE + 0.2 else None


def _first_sentence(row: ChunkRow) -> Sentence | None:
    """The chunk's first complete sentence: after a title line ("Dale Brown"), the one that says
    what the passage is about ("Dale Brown (born 1956) is an American writer ...")."""
    return next((read.sentence for read in chunk_sentences(row.text, row.char_start) if read.sentence.complete), None)
