"""The extractive answer, given when no chat model is configured: the sources' own sentences
that best answer the question, each with its citation marker."""

import math
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from knowledge.rag.answer.reading import WORD, Read, chunk_sentences, content_terms
from knowledge.rag.retrieval import ChunkRow, Keywords, RetrievalResult
from knowledge.rag.sentences import Sentence

DEFAULT_RESPONSE_TYPE = "Multiple Paragraphs"
NO_CONTEXT_ANSWER = (
    "I could not find anything about this in the workspace's documents, so I cannot answer it from them. "
    "Try other words, another mode, or check that the documents you expect have been processed."
)
EXTRACTIVE_LABEL = (
    "_Extractive answer: no language model is configured, so these are the sentences from the sources "
    "that best match your question._"
)
# An extractive answer keeps the sentences whose relevance reaches both this floor and this
# share of the best sentence's, at most EXTRACTIVE_MAX_SENTENCES of them (docs/asking.md, "Extractive
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


# "Who founded Acme and where is it based?": a conjunction or a question mark followed by
# another question word starts a second question.
_QUESTION_PART = re.compile(
    r"(?:[,;]?\s+(?:and|or|but)\s+|[?;]\s*)(?=(?:who|whom|whose|what|which|where|when|why|how|is|are|was|were|"
    r"do|does|did|can|could|should|will|would|has|have|had)\b)",
    re.IGNORECASE,
)
_BACK_REFERENCE = re.compile(r"\b(?:it|its|they|them|their|he|him|his|she|her)\b", re.IGNORECASE)


@dataclass(eq=False)
class _Candidate:
    read: Read
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
    return parts or ([referred] if referred else [])


def _candidates(result: RetrievalResult) -> list[_Candidate]:
    """Every complete sentence of the sources, once: a sentence in two overlapping chunks, or
    the same words in two documents, is kept where its chunk ranks first."""
    found, seen = [], set()
    for row in result.chunks:
        passage = content_terms(f"{row.document_title}\n{row.text}")
        for read in chunk_sentences(row.text, row.char_start):
            key = " ".join(WORD.findall(read.sentence.text.casefold()))
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
    subjects = {term for keyword in result.keywords.low_level for term in content_terms(keyword)}

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
