"""LightRAG retrieval: dual-level keywords, the six query modes, token-budgeted context, subgraph.

The ranking rules follow the paper and its reference implementation:
- local: entities nearest to the low-level keywords, ranked by degree; their one-hop relations
  ranked by (edge rank = sum of endpoint degrees, weight); chunks from the entities' provenance.
- global: relations nearest to the high-level keywords, ranked by (edge rank, weight); their
  endpoint entities; chunks from the relations' provenance.
- hybrid interleaves both; mix adds a chunk search with the whole question (its vector and its
  words, fused by reciprocal rank); naive is that chunk search alone; bypass retrieves nothing.
- local also looks the low-level keywords up by entity name, so an entity named exactly is found.
Which passages enter the context is where we part from LightRAG: in every graph mode the passages
are the question's nearest (mix) and those the entities its keywords found (the local side) or the
endpoints of the relations they found (the global side) lead to, and the entities of those first
passages lead on (in modes without a chunk search, the nearest passages the found entities reach
stand in for the searched ones). They are ranked by their nearness to the question plus the
strongest bridge to them from the most relevant passages: an entity both mention, weighted by how
few passages it leads to (walk.py). So a passage two hops away, reached only through the director
that the film's page names, can answer (decisions 0072, 0160, 0161).

Every stage costs a fixed number of SQL queries whatever top_k is (see tests), and every
queryset is filtered by the workspace.
"""

import logging
import math
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, replace

from django.conf import settings
from django.db import connection

from knowledge.models import Workspace
from knowledge.rag import language, llm
from knowledge.rag.chunking import embedding_text
from knowledge.rag.retrieval.concurrent import run_together
from knowledge.rag.retrieval.context import (
    SUBGRAPH_MAX_EDGES,
    GraphNode,
    build_citations,
    build_subgraph,
    fit_table,
    prompt_overhead,
    subgraph_nodes,
)
from knowledge.rag.retrieval.history import referred_turns
from knowledge.rag.retrieval.keywords import (
    Keywords,
    extract_keywords,
    nlp_keywords,
    parse_keywords,
    recent_turns,
)
from knowledge.rag.retrieval.rerank import RerankError, rerank, rerank_configured
from knowledge.rag.retrieval.results import (
    Budgets,
    ChunkRow,
    EntityRow,
    QueryVectors,
    RelationRow,
    RetrievalResult,
)
from knowledge.rag.retrieval.scope import Scope
from knowledge.rag.retrieval.searches import (
    chunks_nearest,
    chunks_supporting,
    entities_nearest,
    relations_among_entities,
    relations_around_entities,
    relations_nearest,
    walk_edges,
)
from knowledge.rag.retrieval.walk import rank_passages

__all__ = [
    "DEFAULT_CHUNK_TOP_K",
    "DEFAULT_MODE",
    "DEFAULT_TOP_K",
    "MODES",
    "Budgets",
    "ChunkRow",
    "EntityRow",
    "Keywords",
    "QueryVectors",
    "RelationRow",
    "RetrievalResult",
    "Scope",
    "extract_keywords",
    "nlp_keywords",
    "parse_keywords",
    "recent_turns",
    "retrieve",
]

logger = logging.getLogger(__name__)

MODES = ("mix", "hybrid", "local", "global", "naive", "bypass")
DEFAULT_MODE = "mix"
_LOCAL_MODES = {"local", "hybrid", "mix"}
_GLOBAL_MODES = {"global", "hybrid", "mix"}
_CHUNK_SEARCH_MODES = {"naive", "mix"}

DEFAULT_TOP_K = 40
DEFAULT_CHUNK_TOP_K = 20
# The walk: how many entities lead it on (those found first), how many passages each walked
# entity leads to (the nearest to the question), and how sharply a passage's nearness falls with
# its distance to the question (exp(-SHARPNESS * distance gap to the nearest)). Chosen on the
# tuning half of HotpotQA (benchmarks/multihop.py); the plateau is wide (docs/decisions/0072, 0160).
WALK_SEED_ENTITIES = 10
WALK_FANOUT = 30
WALK_SHARPNESS = 20.0
# Without a chunk search (local, global, hybrid), the WALK_LEAD passages nearest to the question
# that the seed entities lead to lead on as the searched passages do in mix: their entities walk
# too, so a passage two hops from the question's entities is reached. From 10 to 30 the same on
# HotpotQA's tuning half; 5 a point or two lower (decision 0161).
WALK_LEAD = 10
# No relation row renders in fewer tokens than this (id, two names, separators, two numbers),
# so fetching budget // this many one-hop relations can never cut a row the budget would keep.
_MIN_RELATION_ROW_TOKENS = 8


class _Stats:
    def __init__(self):
        self.sql_queries = 0
        self.timings: dict[str, float] = {}
        self._mark = time.perf_counter()
        self._lock = threading.Lock()

    def count_query(self, execute, sql, params, many, context):
        with self._lock:  # queries also run on pool threads
            self.sql_queries += 1
        return execute(sql, params, many, context)

    def lap(self, stage: str) -> None:
        now = time.perf_counter()
        self.timings[stage] = round(self.timings.get(stage, 0.0) + (now - self._mark) * 1000, 2)
        self._mark = now


def _interleave(*lists: Sequence, key) -> list:
    """Round-robin merge that keeps the first occurrence of each key."""
    merged, seen = [], set()
    for position in range(max((len(items) for items in lists), default=0)):
        for items in lists:
            if position < len(items) and key(items[position]) not in seen:
                seen.add(key(items[position]))
                merged.append(items[position])
    return merged


def _embed_queries(*, mode, keywords, question, history, vectors, usage) -> QueryVectors:
    wanted = {}
    if mode in _LOCAL_MODES and vectors.low_level is None:
        wanted["low_level"] = ", ".join(keywords.low_level) or question
    if mode in _GLOBAL_MODES and vectors.high_level is None:
        wanted["high_level"] = ", ".join(keywords.high_level) or question
    # Every mode but bypass reads the question's vector: naive and mix search with it, and the walk
    # picks the passages it leads to by it.
    if vectors.question is None:
        asked = [turn["content"] for turn in history if turn["role"] == "user"]
        wanted["question"] = "\n".join([*asked, question])
    if not wanted:
        return vectors
    embedded = llm.embed(list(wanted.values()), purpose="query", usage=usage)
    return replace(vectors, **dict(zip(wanted, embedded, strict=True)))


def retrieve(
    *,
    workspace: Workspace,
    question: str,
    mode: str = DEFAULT_MODE,
    top_k: int = DEFAULT_TOP_K,
    chunk_top_k: int | None = None,
    keywords: Keywords | dict | None = None,
    history: Iterable[dict] = (),
    budgets: Budgets | dict | None = None,
    vectors: QueryVectors | None = None,
    usage: llm.Usage | None = None,
    scope: Scope | None = None,
) -> RetrievalResult:
    """Build the context for a question. Raises ValueError on an unknown mode, llm.LLMError when
    a model call (keywords, embeddings) fails. What people may ask for (the limits of top_k and
    the rest) is the ask service's to check (knowledge/services/asking.py), before it calls this."""
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}: use one of {', '.join(MODES)}.")
    budgets = Budgets.coerce(budgets)
    history = recent_turns(history)
    stats = _Stats()
    result = RetrievalResult(mode=mode, question=question)
    with connection.execute_wrapper(stats.count_query):
        if mode != "bypass":
            _build(
                result,
                workspace=workspace,
                top_k=top_k,
                chunk_top_k=chunk_top_k or DEFAULT_CHUNK_TOP_K,
                keywords=keywords,
                history=history,
                budgets=budgets,
                vectors=vectors or QueryVectors(),
                usage=usage,
                stats=stats,
                scope=scope,
            )
    result.stats["sql_queries"] = stats.sql_queries
    result.stats["timings"] = stats.timings
    return result


def _build(result, *, workspace, top_k, chunk_top_k, keywords, history, budgets, vectors, usage, stats, scope) -> None:
    mode, question = result.mode, result.question
    # The language the question is read in: its keywords, follow-up rules and answer terms.
    result.stats["language"] = language.of(question).code
    # Earlier turns shape the search only when the question points back to them.
    referred = referred_turns(question, history)
    result.referred = tuple(turn["content"] for turn in referred if turn["role"] == "user")
    if mode != "naive":
        if keywords is None:
            result.keywords = extract_keywords(question=question, history=referred, usage=usage)
        else:
            result.keywords = Keywords.coerce(keywords)
    stats.lap("keywords")
    vectors = _embed_queries(
        mode=mode, keywords=result.keywords, question=question, history=referred, vectors=vectors, usage=usage
    )
    stats.lap("embedding")

    floor = settings.RETRIEVAL_MIN_SIMILARITY
    searches = {}
    if mode in _LOCAL_MODES:
        searches["local"] = lambda: _local_search(
            workspace=workspace,
            vector=vectors.low_level,
            names=result.keywords.low_level,
            k=top_k,
            floor=floor,
            budgets=budgets,
            scope=scope,
        )
    if mode in _GLOBAL_MODES:
        searches["global"] = lambda: relations_nearest(
            workspace=workspace, vector=vectors.high_level, k=top_k, min_similarity=floor, scope=scope
        )
    if mode in _CHUNK_SEARCH_MODES:
        searches["chunks"] = lambda: chunks_nearest(
            workspace=workspace,
            vector=vectors.question,
            text=question,
            k=chunk_top_k,
            min_similarity=floor,
            scope=scope,
        )
    found = run_together(searches, wrapper=stats.count_query)
    stats.lap("search")

    found_entities, one_hop = found.get("local", ([], []))
    entity_candidates, relation_candidates, known = _graph_candidates(
        found_entities=found_entities, one_hop=one_hop, found_relations=found.get("global", []), mode=mode
    )
    found_chunks = found.get("chunks", [])
    stats.lap("graph")

    overhead = prompt_overhead(question, history)
    available = max(budgets.total - overhead, 0)
    kept, entity_table, entity_tokens = fit_table(
        "Entities",
        ["id", "entity", "type", "description", "rank"],
        [[f"E{i}", e.name, e.type, e.description, e.rank] for i, e in enumerate(entity_candidates, 1)],
        min(budgets.entities, available),
    )
    result.entities = entity_candidates[:kept]
    for i, row in enumerate(result.entities, 1):
        row.id = f"E{i}"
    kept, relation_table, relation_tokens = fit_table(
        "Relationships",
        ["id", "source", "target", "keywords", "description", "weight", "rank"],
        [
            [f"R{i}", r.source, r.target, r.keywords, r.description, r.weight, r.rank]
            for i, r in enumerate(relation_candidates, 1)
        ],
        min(budgets.relations, available - entity_tokens),
    )
    result.relations = relation_candidates[:kept]
    for i, row in enumerate(result.relations, 1):
        row.id = f"R{i}"

    walked = []
    if mode != "naive":
        walked = _walk(
            workspace=workspace,
            found_chunks=found_chunks,
            seed_entities=_seed_entities(
                found_entities,
                found.get("global", []),
                mode,
                # The searched passages lead mix; without them every entity found leads.
                limit=WALK_SEED_ENTITIES if found_chunks else top_k,
            ),
            vector=vectors.question,
            scope=scope,
        )[:chunk_top_k]
    stats.lap("walk")

    node_ids = subgraph_nodes(result, known)
    lookups = {}
    if mode != "naive":
        lookups["provenance"] = lambda: chunks_supporting(
            workspace=workspace,
            chunk_ids=walked,
            entity_ids=[row.entity_id for row in result.entities],
            relation_ids=[row.relation_id for row in result.relations],
            scope=scope,
        )
    if len(node_ids) > 1:
        lookups["edges"] = lambda: relations_among_entities(
            workspace=workspace, entity_ids=node_ids, limit=SUBGRAPH_MAX_EDGES, scope=scope
        )
    looked_up = run_together(lookups, wrapper=stats.count_query)
    provenance = looked_up.get("provenance", [])
    result.subgraph = build_subgraph(result, known, node_ids, looked_up.get("edges", []))
    stats.lap("lookups")

    searched = {c.pk for c in found_chunks}
    if mode == "naive":
        chunk_candidates = [
            ChunkRow(
                id="",
                chunk_id=c.pk,
                document_id=c.document_id,
                document_title=c.document_title,
                text=c.text,
                token_count=c.token_count,
                char_start=c.char_start,
                char_end=c.char_end,
                support=0,
                found_by="search",
                section=c.section,
                location=c.location,
                page_start=c.page_start,
                page_end=c.page_end,
                anchor=c.anchor,
            )
            for c in found_chunks
        ]
    else:
        chunk_candidates = [
            ChunkRow(
                id="",
                text=c["text"],
                found_by="search" if c["chunk_id"] in searched else "graph",
                **{name: c[name] for name in _CHUNK_FIELDS},
            )
            for c in provenance
            if c["in_top"]
        ]
    if rerank_configured() and chunk_candidates:
        chunk_candidates = _reranked(result, chunk_candidates)
        stats.lap("rerank")
    kept, chunk_table, chunk_tokens = fit_table(
        "Sources",
        ["id", "document", "location", "section", "text"],
        [[f"S{i}", c.document_title, c.location, c.section, c.text] for i, c in enumerate(chunk_candidates, 1)],
        available - entity_tokens - relation_tokens,
        last_cell_tokens=[c.token_count for c in chunk_candidates],
    )
    result.chunks = chunk_candidates[:kept]
    for i, row in enumerate(result.chunks, 1):
        row.id = f"S{i}"

    result.context = "\n".join(table for table in (entity_table, relation_table, chunk_table) if table)
    result.citations = build_citations(result, provenance)
    result.stats["tokens"] = {
        "entities": entity_tokens,
        "relations": relation_tokens,
        "chunks": chunk_tokens,
        "context": entity_tokens + relation_tokens + chunk_tokens,
        "prompt_overhead": overhead,
        "budgets": asdict(budgets),
    }
    stats.lap("context")


_CHUNK_FIELDS = (
    "chunk_id",
    "document_id",
    "document_title",
    "token_count",
    "char_start",
    "char_end",
    "support",
    "section",
    "location",
    "page_start",
    "page_end",
    "anchor",
)


def _seed_entities(found_entities, found_relations, mode, limit: int) -> list[int]:
    """The entities a walk starts from, best first: those the low-level keywords found (named
    exactly first), then the endpoints of the relations the high-level keywords found."""
    local = [entity.pk for entity in found_entities] if mode in _LOCAL_MODES else []
    ends = [pk for r in found_relations for pk in (r.source_id, r.target_id)] if mode in _GLOBAL_MODES else []
    return list(dict.fromkeys(_interleave(local, ends, key=lambda pk: pk)))[:limit]


def _walk(*, workspace, found_chunks, seed_entities, vector, scope) -> list[int]:
    """Passage ids ranked by their nearness to the question and the bridges that lead to them
    (walk.py), over the searched passages and those the seed entities lead to."""
    if not found_chunks and not seed_entities:
        return []
    edges = walk_edges(
        workspace=workspace,
        chunk_ids=[chunk.pk for chunk in found_chunks],
        entity_ids=seed_entities,
        vector=vector,
        fanout=WALK_FANOUT,
        lead=0 if found_chunks else WALK_LEAD,
        scope=scope,
    )
    distances = {**edges.distances, **{c.pk: c.distance for c in found_chunks if c.distance is not None}}
    nearest = min(distances.values(), default=0.0)
    nearness = {pk: math.exp(-WALK_SHARPNESS * (distance - nearest)) for pk, distance in distances.items()}
    for chunk in found_chunks:
        if chunk.distance is None:  # found by its words alone: down its word ranking
            nearness[chunk.pk] = 1.0 / chunk.lexical_rank
    rank = rank_passages(nearness, edges.mentions, edges.synonyms, seed_entities)
    # Ties keep the search's order, then the question's distance.
    order = {chunk.pk: place for place, chunk in enumerate(found_chunks)}
    return sorted(rank, key=lambda pk: (-rank[pk], order.get(pk, len(order)), distances.get(pk, 2.0), pk))


def _reranked(result: RetrievalResult, candidates: list[ChunkRow]) -> list[ChunkRow]:
    """The candidates in the reranker's order. A failing reranker costs its ordering, never the
    answer: the fused order stays and the failure is logged and reported in the stats."""
    try:
        order = rerank(result.question, [embedding_text(row.section, row.text) for row in candidates])
    except RerankError as err:
        logger.warning("%s", err)
        result.stats["rerank"] = f"failed: {err}"
        return candidates
    result.stats["rerank"] = "applied"
    return [candidates[index] for index, _ in order]


def _local_search(*, workspace, vector, names, k, floor, budgets, scope) -> tuple[list, list[dict]]:
    """The entities nearest to the low-level keywords or named by them, and their one-hop relations."""
    found = entities_nearest(workspace=workspace, vector=vector, names=names, k=k, min_similarity=floor, scope=scope)
    if not found:
        return [], []
    one_hop = relations_around_entities(
        workspace=workspace,
        entity_ids=[entity.pk for entity in found],
        limit=budgets.relations // _MIN_RELATION_ROW_TOKENS + 1,
        scope=scope,
    )
    return found, one_hop


def _graph_candidates(*, found_entities, one_hop, found_relations, mode):
    """Entity and relation rows in LightRAG's order, before budgets; plus what is known of
    every entity seen (name, type, degree, description), for the subgraph."""
    known: dict[int, GraphNode] = {}

    def entity_row(entity, degree: int) -> EntityRow:
        known[entity.pk] = GraphNode(entity.name, entity.type, degree, entity.description)
        return EntityRow(
            id="", entity_id=entity.pk, name=entity.name, type=entity.type, description=entity.description, rank=degree
        )

    local_entities = [
        entity_row(entity, entity.degree)
        for entity in sorted(found_entities, key=lambda entity: (-entity.degree, entity.distance))
    ]
    # The found entities are known already; one-hop rows describe only the entities at their far ends.
    for row in one_hop:
        for end in ("source", "target"):
            known.setdefault(
                row[f"{end}_id"],
                GraphNode(row[f"{end}_name"], row[f"{end}_type"], row[f"{end}_degree"], row[f"{end}_description"]),
            )
    local_relations = [
        RelationRow(
            id="",
            relation_id=row["id"],
            source_id=row["source_id"],
            target_id=row["target_id"],
            source=row["source_name"],
            target=row["target_name"],
            keywords=row["keywords"],
            description=row["description"],
            weight=row["weight"],
            rank=row["source_degree"] + row["target_degree"],
        )
        for row in one_hop
    ]
    global_relations = [
        RelationRow(
            id="",
            relation_id=r.pk,
            source_id=r.source_id,
            target_id=r.target_id,
            source=r.source.name,
            target=r.target.name,
            keywords=r.keywords,
            description=r.description,
            weight=r.weight,
            rank=r.source_degree + r.target_degree,
        )
        for r in found_relations
    ]
    global_relations.sort(key=lambda row: (-row.rank, -row.weight))
    ends = {}
    for r in found_relations:
        ends[r.source_id], ends[r.target_id] = (r.source, r.source_degree), (r.target, r.target_degree)
    endpoints_in_order = dict.fromkeys(end for row in global_relations for end in (row.source_id, row.target_id))
    global_entities = [entity_row(*ends[pk]) for pk in endpoints_in_order]

    if mode == "local":
        return local_entities, local_relations, known
    if mode == "global":
        return global_entities, global_relations, known
    return (
        _interleave(local_entities, global_entities, key=lambda row: row.entity_id),
        _interleave(local_relations, global_relations, key=lambda row: row.relation_id),
        known,
    )
