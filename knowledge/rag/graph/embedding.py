"""What a graph row's vector is made of, and how short texts are embedded once.

An entity's vector is its name: which thing it is, not the sentence it came from. Embedding the
first words of its description made the entities of one sentence near-duplicates (Canada and
Australia at cosine 0.998) while a question's "Enums" missed the node "Enum". A relation's vector
is the sum of its two endpoints' name vectors and of its keywords' vector, normalized: it points
between the two things it joins, towards what it says of them.

Names and keywords repeat across documents and relations, so each distinct text goes through the
embedding model once per process (an LRU cache keyed by the model), and a relation costs no model
call of its own. On short passages that is what keeps ingestion near its floor: the passages are
embedded once, and the graph rows add a few words each (decision 0071).
"""

import functools
import threading
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np

from knowledge.rag import llm

# The first keywords of a relation are the ones its first source gave; later ones drift with
# every new mention and would move the vector for little meaning.
RELATION_KEYWORDS = 5
CACHE_SIZE = 200_000


def entity_text(name: str) -> str:
    return " ".join(name.split())


def relation_keywords(keywords: str) -> str:
    return ", ".join([word.strip() for word in keywords.split(",") if word.strip()][:RELATION_KEYWORDS])


def relation_text(source: str, target: str, keywords: str) -> str:
    """The relation's vector input as one text: what a change check and a staging hash compare."""
    return "\n".join((entity_text(source), entity_text(target), relation_keywords(keywords)))


class _ShortTexts:
    """Vectors of short texts, each embedded once per process and model."""

    def __init__(self, size: int):
        self.size = size
        self.vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.lock = threading.Lock()

    def get(self, texts: Sequence[str]) -> list[np.ndarray]:
        # The model in use now (picked on the Models page, or the environment's): a switch without
        # a restart must not serve the old model's vectors.
        embedding = llm.current_config().embedding
        model = f"{embedding.base_url}|{embedding.model}|{embedding.dimensions}" if embedding else "embedded"
        with self.lock:
            missing = list(dict.fromkeys(text for text in texts if (model, text) not in self.vectors))
        if missing:
            fresh = llm.embed(missing, purpose="passage")
            with self.lock:
                for text, vector in zip(missing, fresh, strict=True):
                    self.vectors[(model, text)] = np.asarray(vector, dtype=np.float32)
        found = []
        with self.lock:
            for text in texts:
                vector = self.vectors.get((model, text))
                if vector is None:  # evicted between the two locks by another thread's texts
                    vector = np.asarray(llm.embed([text], purpose="passage")[0], dtype=np.float32)
                else:
                    self.vectors.move_to_end((model, text))
                found.append(vector)
            while len(self.vectors) > self.size:
                self.vectors.popitem(last=False)
        return found


@functools.cache
def _short_texts() -> _ShortTexts:
    return _ShortTexts(CACHE_SIZE)


def clear_cache() -> None:
    """Forget every cached vector (after the embedding model changed under a running process)."""
    _short_texts.cache_clear()


def _unit(vector: np.ndarray) -> list[float]:
    norm = float(np.linalg.norm(vector))
    return (vector / norm if norm else vector).tolist()


def entity_vectors(names: Sequence[str]) -> list[list[float]]:
    return [_unit(vector) for vector in _short_texts().get([entity_text(name) for name in names])]


def relation_vectors(relations: Sequence[tuple[str, str, str]]) -> list[list[float]]:
    """One vector per (source name, target name, keywords)."""
    if not relations:
        return []
    parts = [
        (entity_text(source), entity_text(target), relation_keywords(keywords))
        for source, target, keywords in relations
    ]
    wanted = list(dict.fromkeys(text for row in parts for text in row if text))
    vectors = dict(zip(wanted, _short_texts().get(wanted), strict=True))
    return [_unit(sum(vectors[text] for text in row if text)) for row in parts]
