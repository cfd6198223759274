"""Relevance spread over the graph of passages and entities: Personalized PageRank, as HippoRAG does.

A question seeds some passages (those its vector and words found) and some entities (those its
keywords named); relevance then flows from a passage to the entities it mentions, from an entity
to the passages that mention it and to its synonyms, and back to the seeds with probability
1 - DAMPING at every step. A passage two hops away that shares no word with the question ("the
director of the film X" needs the film's page, then the director's) is reached through the entity
both mention, and ranks by how much of the seeds' relevance arrives there.

The graph walked is small (the seeds' neighbourhood, fetched in one query by
searches.walk_edges), so the iteration runs here, a few milliseconds for a few thousand nodes.
"""

from collections.abc import Hashable, Iterable

import numpy as np

# The probability of following an edge rather than jumping back to a seed. HippoRAG uses 0.5;
# so do we: past two hops relevance has faded to a quarter, which is what a two-hop question needs.
DAMPING = 0.5
ITERATIONS = 30


def spread(
    seeds: dict[Hashable, float],
    edges: Iterable[tuple[Hashable, Hashable, float]],
    *,
    damping: float = DAMPING,
    iterations: int = ITERATIONS,
) -> dict[Hashable, float]:
    """The Personalized PageRank of every node reachable from the seeds, over undirected weighted edges.

    `seeds` maps nodes to their (unnormalized) restart weight; relevance that stands on a node
    without edges returns to the seeds. Each step is one pass over the edges in numpy: a walk over
    a question's few thousand passages took 60 ms as a loop in Python.
    """
    total = sum(weight for weight in seeds.values() if weight > 0)
    if not total:
        return {}
    index: dict[Hashable, int] = {}
    for node, weight in seeds.items():
        if weight > 0:
            index.setdefault(node, len(index))
    ends, weights = [], []
    for a, b, weight in edges:
        if a != b and weight > 0:
            ends.append((index.setdefault(a, len(index)), index.setdefault(b, len(index))))
            weights.append(weight)
    size = len(index)
    restart = np.zeros(size)
    for node, weight in seeds.items():
        if weight > 0:
            restart[index[node]] = weight / total
    pairs = np.array(ends, dtype=np.int64).reshape(-1, 2)
    # Both directions of every edge: relevance flows from `source` to `target`.
    source = np.concatenate([pairs[:, 0], pairs[:, 1]])
    target = np.concatenate([pairs[:, 1], pairs[:, 0]])
    weight = np.concatenate([weights, weights]).astype(float)
    out_weight = np.bincount(source, weights=weight, minlength=size)
    linked = out_weight > 0
    share = np.divide(weight, out_weight[source], out=np.zeros_like(weight), where=out_weight[source] > 0)
    rank = restart.copy()
    for _ in range(iterations):
        stranded = rank[~linked].sum()
        following = damping * np.bincount(target, weights=rank[source] * share, minlength=size)
        following += (1.0 - damping + damping * stranded) * restart
        rank = following
    # The seeds are relevant at every step, so whatever a path reaches from them holds some.
    nodes = list(index)
    return {nodes[i]: float(rank[i]) for i in np.flatnonzero(rank > 0)}
