"""Entity names and the key that identical entities share, across every engine and document.

Its own module because the extractors, the merge, curation and retrieval all need it, and each of
them importing it from another would close an import circle.
"""

import re
import unicodedata

# The type of an entity whose type is unknown (or not one of the workspace's types).
OTHER_TYPE = "other"
QUOTES = "\"'`*“”‘’«»„"


def normalize_name(raw: str) -> str:
    """The display name: whitespace collapsed, wrapping quotes and Markdown emphasis removed."""
    name = " ".join(unicodedata.normalize("NFKC", raw).split())
    return name.strip(QUOTES + " ").strip()


def entity_key(name: str) -> str:
    """The key identical entities share: the display name case-folded."""
    return normalize_name(name).casefold()[:300]


_SEPARATORS = re.compile(r"[\W_]+")


def _singular(word: str) -> str:
    # Plural endings of English nouns, cut only where the rest is still a word; "ss", "us" and
    # "is" end singulars (class, status, analysis). Anything this misses the vectors may catch.
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def surface_form(name: str) -> str:
    """What two spellings of one thing share: the key without punctuation, spaces or plural
    endings ("Enums" and "enum", "Graph-RAG" and "GraphRAG", "handlers" and "handler")."""
    return "".join(_singular(word) for word in _SEPARATORS.split(entity_key(name)) if word)[:300]
