"""Entity names and the key that identical entities share, across every engine and document.

Its own module because the extractors, the merge, curation and retrieval all need it, and each of
them importing it from another would close an import circle.
"""

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
