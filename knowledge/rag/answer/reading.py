"""A chunk read as the answer reads it: its sentences, with spans into the document, and the
content terms of each (stemmed, stop words out, by the rules of the text's language). The
extractive answer picks sentences by their terms; the citations find the sentence an answer
quotes by them."""

import re
from dataclasses import dataclass, replace
from functools import lru_cache

from knowledge.rag import language
from knowledge.rag.language import Language
from knowledge.rag.sentences import Sentence, sentences

WORD = re.compile(r"[^\W_]+", re.UNICODE)
_ANAPHORIC_START = re.compile(r"^(?:It|Its|They|Their|Them|He|His|She|Her|This|These|That|Those)\b")


def content_terms(text: str, reader: Language | None = None) -> set[str]:
    """Content words, stemmed ("uses" and "use" are one term), stop words and short words out;
    Japanese cut into words first. `reader` is the text's language when the caller knows it
    (the sentences of one chunk share their chunk's), else it is detected."""
    return (reader or language.of(text)).terms(text)


@dataclass(frozen=True)
class Read:
    """A sentence of a chunk as the answer reads it."""

    sentence: Sentence
    terms: frozenset[str]
    # Its terms plus those of the sentence before it in the paragraph (its `lead`) when it
    # begins with a pronoun: "She wrote the first algorithm" is about the Ada Lovelace of the
    # sentence before, and an extractive answer shows the two together.
    about: frozenset[str]
    lead: Sentence | None


@lru_cache(maxsize=256)
def chunk_sentences(text: str, char_start: int) -> tuple[Read, ...]:
    """A chunk's sentences with spans into its document (a chunk is document.text[char_start:char_end])."""
    read: list[Read] = []
    reader = language.of(text)
    for found in sentences(text, clipped=char_start > 0):
        sentence = replace(found, start=found.start + char_start, end=found.end + char_start)
        terms = frozenset(content_terms(sentence.text, reader))
        previous = read[-1].sentence if read else None
        same_paragraph = previous and "\n\n" not in text[previous.end - char_start : sentence.start - char_start]
        lead = previous if same_paragraph and previous.complete and _ANAPHORIC_START.match(sentence.text) else None
        read.append(Read(sentence, terms, terms | read[-1].terms if lead else terms, lead))
    return tuple(read)
