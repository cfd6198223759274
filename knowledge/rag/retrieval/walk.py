"""Passages ranked by their nearness to the question and by the bridges that lead to them.

A two-hop question ("What nationality is the director of the film X?") needs X's page, which the
question's vector finds, and then the director's page, which shares no word with the question and
sits far down a vector ranking. What the two pages share is an entity (the director), and a
specific one: it is mentioned by those two pages and few others. So a passage's relevance is

    max(nearness(p), max over bridges s -e- p of min(bridged, nearness(s) × BELOW))
        + ENTITY_WEIGHT × sum over the question's entities e in p of 1 / (place of e × passages of e)
    where bridged = nearness(p) + BRIDGE_WEIGHT × nearness(s) / (passages e leads to - 1)

where s is one of the BRIDGE_FROM most relevant passages and e an entity both mention (an entity
and its synonyms count as one); the question's entities are those its keywords found, best
first. The specificity term is what makes this work where a random walk did not: Personalized
PageRank (decision 0072) splits a passage's relevance evenly among all its entities, "American"
as much as the director, and returns half of it to the seeds at every step, so a bridged page
never outranked the seeds' own (docs/decisions/0160). A bridge lifts a passage at most to just
below the passage it comes from: the second hop belongs beside the first, and a question that
needs one page keeps that page first (without the cap, the known-answer benchmark's hit@1 fell
from 0.90 to 0.82 in mix).

The graph read is small (the neighbourhood searches.walk_edges fetches in one query), so the
ranking runs here in Python.
"""

from collections.abc import Hashable, Iterable, Sequence

# How many of the most relevant passages lead on, and how much a bridge from one of them adds
# to the passage it reaches, against the passages' own nearness. Chosen on the tuning half of
# HotpotQA (benchmarks/multihop.py): all@5 holds within two points from 0.2 to 0.4 and from 3 to 20.
# The question's own entities count for little next to the passages' nearness (from 0.05 to 0.3
# the same within two points); they rank the passages of a graph mode whose vectors say nothing.
BRIDGE_FROM = 10
BRIDGE_WEIGHT = 0.3
ENTITY_WEIGHT = 0.1
# A bridged passage ranks at best right after the passage it comes from.
BELOW = 0.999


def rank_passages(
    nearness: dict[Hashable, float],
    mentions: Iterable[tuple[Hashable, Hashable]],
    synonyms: Iterable[tuple[Hashable, Hashable]] = (),
    entities: Sequence[Hashable] = (),
    *,
    bridge_from: int = BRIDGE_FROM,
    bridge_weight: float = BRIDGE_WEIGHT,
    entity_weight: float = ENTITY_WEIGHT,
) -> dict[Hashable, float]:
    """Every passage's relevance: its nearness or, if higher, its strongest bridge from the most
    relevant, plus the question's entities it mentions.

    `nearness` maps the passages the question found or the graph reached to their relevance on
    their own; `mentions` are (entity, passage) pairs, `synonyms` (entity, entity) pairs and
    `entities` the question's, best first. A passage known only from `mentions` starts from
    nothing and rises by a bridge or by naming the question's entities.
    """
    same = _synonym_groups(synonyms)
    passages_of: dict[Hashable, set] = {}
    for entity, passage in mentions:
        passages_of.setdefault(same.get(entity, entity), set()).add(passage)
    entities_of: dict[Hashable, list] = {}
    for entity, passages in passages_of.items():
        if len(passages) > 1:  # an entity of one passage leads nowhere
            for passage in passages:
                entities_of.setdefault(passage, []).append(entity)
    bridged: dict[Hashable, float] = {}
    for source in sorted(nearness, key=lambda passage: -nearness[passage])[:bridge_from]:
        for entity in entities_of.get(source, ()):
            passages = passages_of[entity]
            lift = bridge_weight * nearness[source] / (len(passages) - 1)
            for passage in passages:
                if passage != source:
                    reached = min(nearness.get(passage, 0.0) + lift, nearness[source] * BELOW)
                    bridged[passage] = max(bridged.get(passage, 0.0), reached)
    named: dict[Hashable, float] = {}
    for place, entity in enumerate(dict.fromkeys(same.get(entity, entity) for entity in entities), 1):
        passages = passages_of.get(entity, ())
        for passage in passages:
            named[passage] = named.get(passage, 0.0) + 1.0 / (place * len(passages))
    return {
        passage: max(nearness.get(passage, 0.0), bridged.get(passage, 0.0)) + entity_weight * named.get(passage, 0.0)
        for passage in nearness.keys() | bridged.keys() | named.keys()
    }


def _synonym_groups(pairs: Iterable[tuple[Hashable, Hashable]]) -> dict[Hashable, Hashable]:
    """Each linked entity's group, named by one of its members (union-find over the pairs)."""
    parent: dict[Hashable, Hashable] = {}

    def root(node):
        while parent.get(node, node) != node:
            parent[node] = parent.get(parent[node], parent[node])
            node = parent[node]
        return node

    for a, b in pairs:
        ra, rb = root(a), root(b)
        if ra != rb:
            parent[ra] = rb
    return {node: root(node) for node in parent}
