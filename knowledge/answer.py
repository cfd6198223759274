"""The answer: a cited Markdown answer streamed from the chat model, or, without one, an
extractive answer made of the source sentences that best match the question.

Both stream the same way (an async generator of text pieces), so the websocket, the HTTP API
and the command treat them alike.
"""

import asyncio
import math
import re
import threading
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from functools import cache, lru_cache

from knowledge import llm
from knowledge.query_prompts import ANSWER_SYSTEM, BYPASS_SYSTEM
from knowledge.retrieval import ChunkRow, Keywords, RetrievalResult, recent_turns
from knowledge.sentences import Sentence, sentences

DEFAULT_RESPONSE_TYPE = "Multiple Paragraphs"
NO_CONTEXT_ANSWER = (
    "I could not find anything about this in the workspace's documents, so I cannot answer it from them. "
    "Try other words, another mode, or check that the documents you expect have been processed."
)
EXTRACTIVE_LABEL = (
    "_Extractive answer: no language model is configured, so these are the sentences from the sources "
    "that best match your question._"
)
NO_MODEL_BYPASS_ANSWER = (
    "Bypass mode sends the question to the language model without retrieval, and no language model is "
    "configured. Choose another mode to get an extractive answer from the documents."
)
# An extractive answer keeps the sentences whose relevance reaches both this floor and this
# share of the best sentence's, at most EXTRACTIVE_MAX_SENTENCES of them (README, "Extractive
# answers", says how they were chosen).
EXTRACTIVE_MIN_RELEVANCE = 0.35
EXTRACTIVE_RELATIVE_RELEVANCE = 0.65
EXTRACTIVE_MAX_SENTENCES = 8
# How much of a sentence's relevance is covering the question's subjects (the rest is covering
# what it asks about them).
EXTRACTIVE_SUBJECT_SHARE = 0.6
# A subject the passage names counts this much for a sentence of it that does not.
EXTRACTIVE_PASSAGE_CREDIT = 0.5
# Two sentences sharing this share of their terms say the same thing; the answer keeps one.
EXTRACTIVE_DUPLICATE_OVERLAP = 0.8
_PIECE_WORDS = 3


def answer_is_extractive() -> bool:
    return not llm.chat_model_configured()


def answer_messages(
    *, question: str, result: RetrievalResult, history: Sequence[dict] = (), response_type: str = DEFAULT_RESPONSE_TYPE
) -> list[dict]:
    """The chat messages of the answer call: instructions with the context, recent turns, the question."""
    if result.mode == "bypass":
        system = BYPASS_SYSTEM.format(response_type=response_type)
    else:
        system = ANSWER_SYSTEM.format(response_type=response_type, context=_as_data(result.context))
    return [{"role": "system", "content": system}, *recent_turns(history), {"role": "user", "content": question}]


_CONTEXT_TAG = re.compile(r"<\s*/?\s*context\s*>", re.IGNORECASE)


def _as_data(context: str) -> str:
    """The context with its delimiters defused: a document that writes "</context>" cannot end
    the data early and have what follows read as instructions."""
    return _CONTEXT_TAG.sub(lambda tag: tag.group(0).replace("<", "‹").replace(">", "›"), context)


async def astream_answer(
    *,
    question: str,
    result: RetrievalResult,
    history: Sequence[dict] = (),
    response_type: str = DEFAULT_RESPONSE_TYPE,
    usage: llm.Usage | None = None,
) -> AsyncIterator[str]:
    """Stream the answer in pieces. Raises llm.LLMError when the chat model fails."""
    if result.mode != "bypass" and not result.context:
        text = NO_CONTEXT_ANSWER
    elif answer_is_extractive() and result.mode == "bypass":
        text = NO_MODEL_BYPASS_ANSWER
    elif answer_is_extractive():
        # Off the event loop: segmenting twenty chunks takes a noticeable moment.
        text = await asyncio.to_thread(extractive_answer, question, result, response_type)
    else:
        messages = answer_messages(question=question, result=result, history=history, response_type=response_type)
        async for piece in llm.astream(messages, usage=usage):
            yield piece
        return
    for piece in _pieces(text):
        yield piece
        # Lets the consumer send each piece (and notice a cancel) as with a model's stream.
        await asyncio.sleep(0)


def _pieces(text: str) -> list[str]:
    words = re.findall(r"\s*\S+\s*", text)
    return ["".join(words[i : i + _PIECE_WORDS]) for i in range(0, len(words), _PIECE_WORDS)]


# ---------------------------------------------------------------------------------------
# Extractive answers

_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# "Who founded Acme and where is it based?": a conjunction or a question mark followed by
# another question word starts a second question.
_QUESTION_PART = re.compile(
    r"(?:[,;]?\s+(?:and|or|but)\s+|[?;]\s*)(?=(?:who|whom|whose|what|which|where|when|why|how|is|are|was|were|"
    r"do|does|did|can|could|should|will|would|has|have|had)\b)",
    re.IGNORECASE,
)
_ANAPHORIC_START = re.compile(r"^(?:It|Its|They|Their|Them|He|His|She|Her|This|These|That|Those)\b")
_BACK_REFERENCE = re.compile(r"\b(?:it|its|they|them|their|he|him|his|she|her)\b", re.IGNORECASE)


_per_thread = threading.local()


def _stemmer():
    # A snowball stemmer keeps the word it is working on in itself, so two threads sharing one
    # (answers' citations are found on pool threads) corrupt each other's words: one per thread.
    stemmer = getattr(_per_thread, "stemmer", None)
    if stemmer is None:
        import snowballstemmer

        stemmer = _per_thread.stemmer = snowballstemmer.stemmer("english")
    return stemmer


@cache
def _stop_words() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(STOP_WORDS)


def _terms(text: str) -> set[str]:
    """Content words, stemmed ("uses" and "use" are one term), stop words and short words out."""
    stop_words = _stop_words()
    words = [word.casefold() for word in _WORD.findall(text) if len(word) > 2]
    return set(_stemmer().stemWords([word for word in words if word not in stop_words]))


@dataclass(frozen=True)
class _Read:
    """A sentence of a chunk as the answer reads it."""

    sentence: Sentence
    terms: frozenset[str]
    # Its terms plus those of the sentence before it in the paragraph (its `lead`) when it
    # begins with a pronoun: "She wrote the first algorithm" is about the Ada Lovelace of the
    # sentence before, and an extractive answer shows the two together.
    about: frozenset[str]
    lead: Sentence | None


@lru_cache(maxsize=256)
def _chunk_sentences(text: str, char_start: int) -> tuple[_Read, ...]:
    """A chunk's sentences with spans into its document (a chunk is document.text[char_start:char_end])."""
    read: list[_Read] = []
    for found in sentences(text, clipped=char_start > 0):
        sentence = replace(found, start=found.start + char_start, end=found.end + char_start)
        terms = frozenset(_terms(sentence.text))
        previous = read[-1].sentence if read else None
        same_paragraph = previous and "\n\n" not in text[previous.end - char_start : sentence.start - char_start]
        lead = previous if same_paragraph and previous.complete and _ANAPHORIC_START.match(sentence.text) else None
        read.append(_Read(sentence, terms, terms | read[-1].terms if lead else terms, lead))
    return tuple(read)


@dataclass(eq=False)
class _Candidate:
    read: _Read
    row: ChunkRow
    # The terms of its chunk and document title: a sentence of a passage about a subject is
    # about it too, even when it does not name it ("2 GB of free disk space.").
    passage: set[str]
    relevance: float = 0.0

    @property
    def sentence(self) -> Sentence:
        return self.read.sentence


def _question_parts(question: str, keywords: Keywords, earlier: Sequence[str] = ()) -> list[set[str]]:
    """The terms of each question a compound question asks. A part that refers back ("where
    is it based?") also gets the names asked about before it, and every part gets the keyword
    terms the question itself lacks (what a follow-up's "it" stands for), or without keywords
    the terms of the `earlier` questions a follow-up was retrieved with."""
    asked = _terms(question)
    # Without keywords (naive mode) a follow-up's referent is in the questions it was retrieved with.
    given = [*keywords.low_level, *keywords.high_level] or earlier
    referred = {term for keyword in given for term in _terms(keyword)} - asked
    parts, names = [], set()
    for text in _QUESTION_PART.split(question):
        terms = _terms(text)
        if _BACK_REFERENCE.search(text):
            terms |= names
        names |= {
            term for keyword in keywords.low_level if keyword.casefold() in text.casefold() for term in _terms(keyword)
        }
        if terms:
            parts.append(terms | referred)
    return parts or ([referred] if referred else [])


def _candidates(result: RetrievalResult) -> list[_Candidate]:
    """Every complete sentence of the sources, once: a sentence in two overlapping chunks, or
    the same words in two documents, is kept where its chunk ranks first."""
    found, seen = [], set()
    for row in result.chunks:
        passage = _terms(f"{row.document_title}\n{row.text}")
        for read in _chunk_sentences(row.text, row.char_start):
            key = " ".join(_WORD.findall(read.sentence.text.casefold()))
            if not read.sentence.complete or key in seen:
                continue
            seen.add(key)
            found.append(_Candidate(read, row, passage))
    return found


def _near_duplicate(candidate: _Candidate, chosen: Sequence[_Candidate]) -> bool:
    return any(
        len(candidate.read.terms & other.read.terms)
        >= EXTRACTIVE_DUPLICATE_OVERLAP * len(candidate.read.terms | other.read.terms)
        for other in chosen
    )


def extractive_answer(question: str, result: RetrievalResult, response_type: str = DEFAULT_RESPONSE_TYPE) -> str:
    """The sources' sentences that answer the question, best first, each with its [S#].

    A term weighs its inverse document frequency over the candidate sentences (the words that
    tell sentences apart count most). A sentence's relevance to a part of the question mixes
    the shares it covers of the part's subjects (low-level keyword terms, weighing
    EXTRACTIVE_SUBJECT_SHARE; one its passage names counts EXTRACTIVE_PASSAGE_CREDIT) and of
    the rest. Kept: for a compound
    question first the best sentence of each part, then every sentence above the floor, best
    first, each once, at most EXTRACTIVE_MAX_SENTENCES."""
    candidates = _candidates(result)
    parts = _question_parts(question, result.keywords, result.referred)
    wanted = set().union(*parts)
    frequency = Counter(term for candidate in candidates for term in candidate.read.about & wanted)
    weight = {term: math.log(1 + len(candidates) / count) for term, count in frequency.items()}
    subjects = {term for keyword in result.keywords.low_level for term in _terms(keyword)}

    def coverage(candidate: _Candidate, terms: set[str]) -> float:
        covered = sum(weight.get(term, 0.0) for term in candidate.read.about & terms)
        implied = sum(weight.get(term, 0.0) for term in (candidate.passage - candidate.read.about) & terms & subjects)
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
        return sum(share * coverage(candidate, group) for share, group in groups) / total if groups else 0.0

    for candidate in candidates:
        candidate.relevance = max((relevance(candidate, part) for part in parts), default=0.0)
    best = max((candidate.relevance for candidate in candidates), default=0.0)
    floor = max(EXTRACTIVE_MIN_RELEVANCE, EXTRACTIVE_RELATIVE_RELEVANCE * best)
    ranked = sorted((c for c in candidates if c.relevance >= floor), key=lambda c: -c.relevance)
    if not ranked:
        return NO_CONTEXT_ANSWER
    chosen: list[_Candidate] = []

    def choose(candidate: _Candidate) -> None:
        full = len(chosen) == EXTRACTIVE_MAX_SENTENCES
        if not full and candidate not in chosen and not _near_duplicate(candidate, chosen):
            chosen.append(candidate)

    if len(parts) > 1:
        for part in parts:
            scored = [(relevance(candidate, part), candidate) for candidate in candidates]
            part_best = max(score for score, _ in scored)
            if part_best >= EXTRACTIVE_MIN_RELEVANCE:
                choose(next(candidate for score, candidate in scored if score == part_best))
    for candidate in ranked:
        choose(candidate)
    lines, shown = [], set()
    for candidate in chosen:
        if candidate.sentence in shown:
            continue
        lead = candidate.read.lead if candidate.read.lead not in shown else None
        shown |= {candidate.sentence, lead} - {None}
        # The citation marks the sentence that answers; the one before it is there to be read with it.
        lines.append(" ".join(filter(None, [lead and lead.text, candidate.sentence.text, f"[{candidate.row.id}]"])))
    if "paragraph" in response_type.casefold() and "single" in response_type.casefold():
        body = " ".join(lines)
    else:
        body = "\n".join(f"- {line}" for line in lines)
    return f"{EXTRACTIVE_LABEL}\n\n{body}"


# ---------------------------------------------------------------------------------------
# What the answer cites

# [S2], [E1], [R3] and lists such as [S2, E1] or [S2; S3], as the answer prompt asks.
CITATION_RE = re.compile(r"\[((?:[SER]\d+)(?:\s*[,;]\s*[SER]\d+)*)\]")
CITATION_ID_RE = re.compile(r"[SER]\d+")


def answer_citations(answer: str, result: RetrievalResult) -> list[dict]:
    """The retrieval's citations, each with the source sentences the answer cites it for.

    For each marker ([S2], or [E1] and [R3] when their chunk is among the sources), the cited
    sentence is the one of that chunk which the answer quotes right before the marker (an
    extractive answer always does, so there it is exact); otherwise the one sharing the most
    content terms with the answer sentence that carries the marker. `sentences` lists every
    sentence a row is cited for, in the answer's order; `sentence`, `sentence_start` and
    `sentence_end` are the first of them, with spans into the document's text.
    """
    chunks = {row.chunk_id: row for row in result.chunks}
    rows = {citation["id"]: chunks.get(citation["chunk_id"]) for citation in result.citations}
    claims = sentences(answer)
    cited: dict[str, list[Sentence]] = {}
    for match in CITATION_RE.finditer(answer):
        quoted = " ".join(answer[: match.start()].split())
        claim = _claim(answer, claims, match.start())
        for row_id in CITATION_ID_RE.findall(match.group(1)):
            row = rows.get(row_id)
            found = _supporting_sentence(row, quoted, claim) if row is not None else None
            if found is not None and found not in cited.setdefault(row_id, []):
                cited[row_id].append(found)
    return [{**citation, **_sentence_fields(cited.get(citation["id"], []))} for citation in result.citations]


def _claim(answer: str, claims: Sequence[Sentence], position: int) -> str:
    """The answer's words a marker at `position` vouches for: its sentence, or the sentence
    before when the marker opens one (a marker after the full stop, "... Erin. [S3]")."""
    before = [claim for claim in claims if claim.start < position]
    for claim in reversed(before):
        if CITATION_RE.sub("", answer[claim.start : position]).strip():
            return CITATION_RE.sub("", answer[claim.start : max(position, claim.end)])
    return CITATION_RE.sub("", answer[:position].rsplit("\n", 1)[-1])


def _supporting_sentence(row: ChunkRow, quoted: str, claim: str) -> Sentence | None:
    options = _chunk_sentences(row.text, row.char_start)
    exact = [read.sentence for read in options if quoted.endswith(read.sentence.text)]
    if exact:
        return max(exact, key=lambda sentence: len(sentence.text))
    wanted = _terms(claim)
    best, best_key = None, (0, 0, False)
    for read in options:
        key = (len(wanted & read.about), len(wanted & read.terms), read.sentence.complete)
        if key[0] and key > best_key:
            best, best_key = read.sentence, key
    return best


def _sentence_fields(found: Sequence[Sentence]) -> dict:
    first = found[0] if found else None
    return {
        "sentence": first.text if first else None,
        "sentence_start": first.start if first else None,
        "sentence_end": first.end if first else None,
        "sentences": [{"text": s.text, "start": s.start, "end": s.end} for s in found],
    }
