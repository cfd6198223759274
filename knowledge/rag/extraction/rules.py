"""The deterministic extractor used when no chat model is configured (spaCy, offline).

Each text is read by the spaCy pipeline of its language (knowledge/rag/language.py: English,
GiNZA for Japanese, French), whose named-entity labels are mapped to OntoNotes' below.

It fills the same records as the LLM extractor, so everything downstream is shared. Tuned for
real documents (documentation, papers, reports), where an LLM extractor keeps about 6 entities
per 1,000 tokens and a naive NLP one 50 to 70, most of them noise:

- Only prose is read: sentences that are mostly symbols (code, markup, formulas, command
  lines, tables flattened to text) are skipped.
- Named entities (spaCy's NER) are kept when they look like names: no markup or code
  characters, letters, balanced brackets, at most five words.
- Noun phrases are kept only where they recur in the chunk (in two sentences, three for a
  single word), with generic heads ("example", "way", "option") left out: a phrase a chunk
  mentions once is rarely a topic of the document.
- Numbers, money, times and dates are not entities (a date in a sentence would link
  everything in it).
- Relations join neighbours: each mention with the next one in its sentence (a chain, at most
  MAX_MENTIONS_PER_SENTENCE - 1 per sentence), whose description is the sentence; consolidation
  sums one strength per sentence, so a pair's strength is how often it co-occurs.
"""

import re
from collections import Counter

from knowledge.rag import language
from knowledge.rag.extraction import types
from knowledge.rag.language import Language
from knowledge.rag.names import entity_key

MAX_MENTIONS_PER_SENTENCE = 5
MAX_SENTENCES_PER_DESCRIPTION = 3
MAX_NAME_WORDS = 5
MAX_SENTENCE_TOKENS = 80
# A sentence is prose when at least this share of its tokens are words.
MIN_WORD_SHARE = 0.6
# Sentences of the chunk that must mention a noun phrase for it to be kept.
PHRASE_RECURRENCE = 2
WORD_RECURRENCE = 3
# Single-word noun phrases with these lemmas say nothing about what a document is about.
GENERIC_HEADS = frozenset(
    {
        "example",
        "way",
        "thing",
        "case",
        "use",
        "number",
        "part",
        "lot",
        "kind",
        "sort",
        "type",
        "set",
        "list",
        "problem",
        "issue",
        "feature",
        "function",
        "content",
        "overview",
        "detail",
        "information",
        "time",
        "point",
        "result",
        "value",
        "option",
        "default",
        "section",
        "chapter",
        "page",
        "note",
        "following",
        "other",
        "one",
        "people",
        "end",
        "start",
        "beginning",
        "middle",
        "line",
        "word",
        "name",
        "reason",
        "fact",
        "idea",
        "question",
        "answer",
        "step",
        "item",
        "form",
        "place",
        "level",
        "order",
        "effect",
        "purpose",
        "side",
        "area",
        "term",
        "mode",
        "method",
        "approach",
    }
)
_CODE_CHARACTERS = frozenset("<>{}[]=\\|$^~#@`*_;")
_ABBREVIATION = re.compile(r"^(?:e\.g|i\.e|etc|cf|vs)\b\.?", re.IGNORECASE)
# "Chapter 3", "section 4.7.4": pointers within the document, not things it is about.
_CROSS_REFERENCE = re.compile(
    r"^(?:chapter|section|figure|fig|table|page|appendix|step|part|example|listing)\.?\s+[\dIVXivx.]+$", re.IGNORECASE
)


def _trimmed(span):
    """The span without leading determiners, pronouns, punctuation and line breaks ("the
    University of Paris"; GiNZA keeps a line break at the start of a sentence)."""
    start, end = span.start, span.end
    doc = span.doc
    while start < end and (doc[start].pos_ in ("DET", "PRON", "PUNCT") or doc[start].is_stop or doc[start].is_space):
        start += 1
    while end > start and doc[end - 1].pos_ in ("PUNCT", "PART"):
        end -= 1
    return doc[start:end]


def clean_name(text: str) -> str | None:
    """The text as an entity name, or None when it is markup, code, a number or a fragment."""
    name = " ".join(text.split())
    if not 2 <= len(name) <= 80 or len(name.split()) > MAX_NAME_WORDS:
        return None
    if _CODE_CHARACTERS.intersection(name) or "://" in name or _ABBREVIATION.match(name):
        return None
    if _CROSS_REFERENCE.match(name):
        return None
    if name.count("(") != name.count(")") or name[0] in "-./(" or name[-1] in "-/(":
        return None
    letters = sum(char.isalpha() for char in name)
    if letters < 2 or letters < 0.5 * len(name.replace(" ", "")):
        return None
    return name


def _is_prose(sentence) -> bool:
    tokens = [token for token in sentence if not token.is_space]
    if not 3 <= len(tokens) <= MAX_SENTENCE_TOKENS:
        return False
    words = sum(1 for token in tokens if token.is_alpha)
    return words >= MIN_WORD_SHARE * len(tokens) and not _CODE_CHARACTERS.intersection(sentence.text)


def _named(
    sentence, allowed: dict[str, str], reader: Language, surnames: frozenset[str]
) -> tuple[list[tuple[int, str, str, str]], set[int]]:
    """(position, key, name, type, strength) of the named entities that look like names, and the token
    positions every named entity covers (noun phrases there are the same thing). A label that
    names nothing in the language (GiNZA's vocations and theories) covers nothing either."""
    found, covered = [], set()
    for entity in sentence.ents:
        label = reader.entity_label(entity.label_)
        if label is None:
            continue
        covered.update(range(entity.start, entity.end))
        for part in _lines(entity) if label in types.LABEL_TYPES else ():
            span = _trimmed(part)
            name = clean_name(span.text) if span else None
            if name:
                kind, strength = types.named_type(span, label, reader, surnames)
                found.append((span.start, entity_key(name), name, types.workspace_type(kind, allowed), strength))
    return found, covered


def _lines(span):
    """The span cut at line breaks: the tagger joins a title to the sentence below it ("Marcus
    Ellery" heading a page that begins "Marcus Ellery (born 1961)" is one PERSON to it)."""
    start = span.start
    for token in span:
        if token.is_space and "\n" in token.text:
            if token.i > start:
                yield span.doc[start : token.i]
            start = token.i + 1
    if span.end > start:
        yield span.doc[start : span.end]


def _number(token, span, reader: Language) -> bool:
    # "two approaches" is no entity; in a language without spaces a numeral inside a compound
    # is part of its name (二段階検索, "two-stage retrieval"), only a trailing one is a number.
    return token.pos_ == "NUM" and (reader.spaces or token.i == span.end - 1)


def _phrases(
    sentence, taken: set[int], allowed: dict[str, str], reader: Language
) -> list[tuple[int, str, str, str, bool]]:
    """(position, key, name, type, single word) of the noun phrases that do not overlap a named entity."""
    found = []
    for chunk in sentence.noun_chunks:
        span = _trimmed(chunk)
        if (
            not span
            or taken.intersection(range(chunk.start, chunk.end))
            or span.root.pos_ not in ("NOUN", "PROPN")
            or any(token.pos_ in ("VERB", "AUX") or _number(token, span, reader) for token in span)
            or (len(span) == 1 and span.root.lemma_.lower() in GENERIC_HEADS | reader.generic_heads)
        ):
            continue
        name = clean_name(span.text)
        if name:
            kind = types.workspace_type(types.phrase_type(span, reader), allowed)
            found.append((span.start, entity_key(name), name, kind, len(span) == 1))
    return found


def _keywords(sentence) -> str:
    verbs = [token.lemma_.lower() for token in sentence if token.pos_ == "VERB"]
    return ", ".join(dict.fromkeys(verbs[:3]))


def _records(doc, allowed: dict[str, str], reader: Language) -> dict:
    surnames = types.surnames(doc)
    read = []
    recurrence: Counter = Counter()
    for sentence in doc.sents:
        if not _is_prose(sentence):
            continue
        named, covered = _named(sentence, allowed, reader, surnames)
        phrases = _phrases(sentence, covered, allowed, reader)
        recurrence.update({key for _, key, _, _, _ in phrases})
        read.append((sentence, named, phrases))

    entities: dict[str, dict] = {}
    strength_of: dict[str, int] = {}
    sentences_of: dict[str, list[str]] = {}
    relations = []
    content: dict[str, None] = {}
    for sentence, named, phrases in read:
        kept = [
            (position, key, name, kind, types.LABEL)
            for position, key, name, kind, single in phrases
            if recurrence[key] >= (WORD_RECURRENCE if single else PHRASE_RECURRENCE)
        ]
        found = sorted(named + kept)
        mentions: dict[str, str] = {}
        for _, key, name, _, _ in found:
            mentions.setdefault(key, name)
        mentions = dict(list(mentions.items())[:MAX_MENTIONS_PER_SENTENCE])
        if not mentions:
            continue
        for _, key, name, kind, strength in found:
            # The type of an entity in the chunk is the one its strongest evidence gives.
            if key in mentions and strength > strength_of.get(key, -1):
                strength_of[key] = strength
                entities.setdefault(key, {"name": name})["type"] = kind
        text = language.collapse_whitespace(sentence.text)
        for key in mentions:
            described = sentences_of.setdefault(key, [])
            if text not in described:
                described.append(text)
        for _, _, name, _, _ in named:
            content.setdefault(name, None)
        keywords = _keywords(sentence)
        names = list(mentions.values())
        for first, second in zip(names, names[1:], strict=False):
            relations.append(
                {"source": first, "target": second, "keywords": keywords, "description": text, "strength": 1.0}
            )
    return {
        "entities": [
            {**entity, "description": " ".join(sentences_of[key][:MAX_SENTENCES_PER_DESCRIPTION])}
            for key, entity in entities.items()
        ],
        "relations": relations,
        "keywords": list(content)[:10],
    }


def nlp_extract(texts: list[str], *, entity_types: list[str]) -> list[dict]:
    """Records for each text, in order, each read by the pipeline of its language."""
    allowed = {kind.casefold(): kind for kind in entity_types}
    by_language: dict[Language, list[int]] = {}
    for index, text in enumerate(texts):
        by_language.setdefault(language.of(text), []).append(index)
    records: list[dict] = [{}] * len(texts)
    for reader, indexes in by_language.items():
        docs = reader.parse([texts[index] for index in indexes])
        for index, doc in zip(indexes, docs, strict=True):
            records[index] = _records(doc, allowed, reader)
    return records
