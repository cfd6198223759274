"""The context: token-budgeted CSV tables, the subgraph to draw and the citations."""

import csv
import io
from collections.abc import Sequence
from typing import NamedTuple

from knowledge.rag.graph.drawing import graph_edge, graph_node
from knowledge.rag.prompts import ANSWER_SYSTEM
from knowledge.rag.retrieval.results import RetrievalResult
from knowledge.rag.tokens import count_tokens

SUBGRAPH_MAX_NODES = 150
SUBGRAPH_MAX_EDGES = 400
EXCERPT_CHARS = 300


class GraphNode(NamedTuple):
    """What retrieval read of an entity it may draw: enough for its node and hover card, so
    nobody has to look the subgraph's descriptions up again."""

    name: str
    type: str
    degree: int
    description: str


def _csv_line(values: Sequence) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(values)
    return buffer.getvalue()


def _row_tokens(line: str, row: Sequence, last_cell_tokens: int | None) -> int:
    if last_cell_tokens is None:
        return count_tokens(line)
    # A chunk's tokens are known from ingestion; re-encoding 20 chunks of 1,200 tokens would
    # cost more than the whole search. The row costs at most its other cells, the text, one
    # token per quote CSV doubles and the two quotes around it (checked on real chunks).
    text = row[-1]
    return count_tokens(_csv_line([*row[:-1], ""])) + last_cell_tokens + text.count('"') + 2


def fit_table(
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
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    lines = []
    for index, row in enumerate(rows):
        buffer.seek(0)
        buffer.truncate()
        writer.writerow(row)
        line = buffer.getvalue()
        cost = _row_tokens(line, row, None if last_cell_tokens is None else last_cell_tokens[index])
        if used + cost > budget:
            break
        lines.append(line)
        used += cost
    if not lines:
        return 0, "", 0
    return len(lines), head + "".join(lines) + tail, used


def prompt_overhead(question: str, history: Sequence[dict]) -> int:
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


def subgraph_nodes(result: RetrievalResult, known: dict[int, GraphNode]) -> dict[int, str | None]:
    """The entities to draw, most important first: the retrieved ones in their order, then the
    endpoints of retrieved relations by degree. Maps each to its context row id (or None)."""
    nodes = {row.entity_id: row.id for row in result.entities}
    endpoints = {end for row in result.relations for end in (row.source_id, row.target_id)} - set(nodes)
    for pk in sorted(endpoints, key=lambda pk: (-known[pk].degree, known[pk].name)):
        nodes[pk] = None
    return dict(list(nodes.items())[:SUBGRAPH_MAX_NODES])


def build_subgraph(
    result: RetrievalResult, known: dict[int, GraphNode], nodes: dict[int, str | None], among: list[dict]
) -> dict:
    """The subgraph to draw, descriptions included: the nodes; the retrieved relations among
    them, then the other relations among them (`among`, from relations_among_entities)."""
    edges = [
        graph_edge(
            pk=row.relation_id,
            source_id=row.source_id,
            target_id=row.target_id,
            weight=row.weight,
            keywords=row.keywords,
            row=row.id,
            description=row.description,
        )
        for row in result.relations
        if row.source_id in nodes and row.target_id in nodes
    ][:SUBGRAPH_MAX_EDGES]
    drawn = {edge["id"] for edge in edges}
    for r in among:
        if f"r{r['id']}" not in drawn and len(edges) < SUBGRAPH_MAX_EDGES:
            edges.append(
                graph_edge(
                    pk=r["id"],
                    source_id=r["source_id"],
                    target_id=r["target_id"],
                    weight=r["weight"],
                    keywords=r["keywords"],
                    description=r["description"],
                )
            )
    return {
        "nodes": [
            graph_node(
                pk=pk,
                name=known[pk].name,
                type=known[pk].type,
                degree=known[pk].degree,
                row=row,
                description=known[pk].description,
            )
            for pk, row in nodes.items()
        ],
        "edges": edges,
    }


def _not_cited() -> dict:
    """What the answer cites a row for: knowledge.rag.answer.answer_citations fills it in once the
    answer is written."""
    return {"sentence": None, "sentence_start": None, "sentence_end": None, "sentences": []}


def build_citations(result: RetrievalResult, provenance: list[dict]) -> list[dict]:
    """One citation per context row. An entity or relation points at its best-supported chunk,
    preferring one that is itself in the Sources table, with what that chunk said about it.
    Each says where its chunk sits: `section` (heading path), `location` ("p. 4") and `anchor`
    (where the document page jumps: "page-4", "section-3")."""
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
            "section": chunk["section"] if chunk else "",
            "location": chunk["location"] if chunk else "",
            "anchor": chunk["anchor"] if chunk else "",
            "excerpt": _shorten(said or fallback),
            **_not_cited(),
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
            "section": row.section,
            "location": row.location,
            "anchor": row.anchor,
            "excerpt": _shorten(row.text),
            **_not_cited(),
        }
        for row in result.chunks
    ]
    return citations
