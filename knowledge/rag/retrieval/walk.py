"""Relevance spread over the graph of passages and entities: Personalized PageRank, as HippoRAG does.

A question seeds some passages (those its vector and words found) and some entities (those its
keywords named); relevance then flows from a passage to the entities it mentions, from an entity
to the passages that mention it and to its synonyms, and back to the seeds with probability
1 - DAMPING at every step. A passage two hops away that shares no word with the question ("the
director of the film X" needs the film's page, then the director's) is reached through the entity
both mention, and ranks by how much of the seeds' relevance arrives there.

The graph walked is small (the seeds' neighbourhood, fetched in one query by
searches.walk_edges), so the iteration runs here in Python in well under a millisecond per
hundred nodes.
"""

from collections.abc import Hashable, Iterable

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
    without edges returns to the seeds.
    """
    total = sum(weight for weight in seeds.values() if weight > 0)
    if not total:
        return {}
    restart = {node: weight / total for node, weight in seeds.items() if weight > 0}
    neighbours: dict[Hashable, dict[Hashable, float]] = {}
    for a, b, weight in edges:
        if a == b or weight <= 0:
            continue
        neighbours.setdefault(a, {})[b] = neighbours.get(a, {}).get(b, 0.0) + weight
        neighbours.setdefault(b, {})[a] = neighbours.get(b, {}).get(a, 0.0) + weight
    out_weight = {node: sum(links.values()) for node, links in neighbours.items()}
    rank = dict(restart)
    for _ in range(iterations):
        following: dict[Hashable, float] = {}
        stranded = 0.0
        for node, value in rank.items():
            links = neighbours.get(node)
            if not links:
                stranded += value
                continue
            share = damping * value / out_weight[node]
            for other, weight in links.items():
                following[other] = following.get(other, 0.0) + share * weight
        back = 1.0 - damping + damping * stranded
        for node, weight in restart.items():
            following[node] = following.get(node, 0.0) + back * weight
        rank = following
    return rank
