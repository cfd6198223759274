"""What a workspace archive holds, table by table, and where each table's ids are referenced.

Every row keeps the ids it had; a restore gives every id a new one from the target's sequences,
in the same order (the i-th smallest old id gets the i-th smallest new one). Order matters: a
relation stores its pair as source_id < target_id, `summary_through` compares provenance ids,
and retrieval breaks ties by id, so a restored workspace ranks exactly as the original.

`walk(row, ids)` rewrites every id a row holds, in columns and inside JSON (a merge log's
snapshot, a rebuild's lists, a message's citations and subgraph), through `ids`. The restore
walks each row twice: once with a recorder that collects the ids, once with the mapping.
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from django.db import models
from django.db.models import QuerySet

from chat.models import Conversation, Message
from knowledge.models import (
    AuditEvent,
    Chunk,
    ChunkExtraction,
    Document,
    Entity,
    EntityAlias,
    EntityLink,
    EntitySource,
    GraphRebuild,
    Membership,
    MergeLog,
    PendingVector,
    Relation,
    RelationSource,
    Source,
    Workspace,
)


class Ids(Protocol):
    def id(self, table: str, value: int | None) -> int | None:
        """The new id of the row `value` of `table` (None stays None)."""

    def floor(self, table: str, value: int) -> int:
        """The new id of the largest row of `table` whose old id is at most `value` (0 if none)."""


@dataclass(frozen=True)
class Table:
    name: str
    model: type[models.Model]
    rows: Callable[[Workspace], QuerySet]
    # Foreign key columns and the table whose ids they hold.
    refs: dict[str, str] = field(default_factory=dict)
    # User foreign keys, archived as usernames (users are not part of a workspace): column -> key.
    users: dict[str, str] = field(default_factory=dict)
    # Rows whose user is missing on the target cannot exist (the column is not nullable).
    user_required: bool = False
    walk: Callable[[dict, Ids], None] | None = None
    # A chat table: archived only when conversations are asked for.
    conversations: bool = False
    # Added after the first archive format: older archives lack it, and restore without it.
    added_later: bool = False

    @property
    def member(self) -> str:
        return f"tables/{self.name}.jsonl"


def _summary_floor(sources: str) -> Callable[[dict, Ids], None]:
    def walk(row: dict, ids: Ids) -> None:
        if "summary_through" in row:
            row["summary_through"] = ids.floor(sources, row["summary_through"])
        _fold_floor(row, ids, sources)

    return walk


def _fold_floor(row: dict, ids: Ids, sources: str) -> None:
    # A graph row's `folded` counts its sources up to an id (knowledge.rag.graph.rebuild).
    if row.get("folded"):
        row["folded"] = {**row["folded"], "through": ids.floor(sources, row["folded"]["through"])}


def _rows(rows: list[dict], ids: Ids, refs: dict[str, str], floor: tuple[str, str] | None = None) -> list[dict]:
    out = []
    for row in rows:
        row = dict(row)
        for column, table in refs.items():
            if column in row:
                row[column] = ids.id(table, row[column])
        if floor and floor[0] in row:
            row[floor[0]] = ids.floor(floor[1], row[floor[0]])
            _fold_floor(row, ids, floor[1])
        out.append(row)
    return out


def _merge_snapshot(row: dict, ids: Ids) -> None:
    """A merge log's snapshot holds the rows the merge changed, ids included, for undo."""
    snapshot = dict(row.get("snapshot") or {})
    snapshot["entities"] = _rows(
        snapshot.get("entities", []),
        ids,
        {"id": "entities", "workspace_id": "workspace"},
        ("summary_through", "entity_sources"),
    )
    snapshot["relations"] = _rows(
        snapshot.get("relations", []),
        ids,
        {"id": "relations", "workspace_id": "workspace", "source_id": "entities", "target_id": "entities"},
        ("summary_through", "relation_sources"),
    )
    snapshot["entity_sources"] = _rows(
        snapshot.get("entity_sources", []), ids, {"id": "entity_sources", "entity_id": "entities", "chunk_id": "chunks"}
    )
    snapshot["relation_sources"] = _rows(
        snapshot.get("relation_sources", []),
        ids,
        {"id": "relation_sources", "relation_id": "relations", "chunk_id": "chunks"},
    )
    snapshot["aliases"] = _rows(
        snapshot.get("aliases", []),
        ids,
        {"id": "entity_aliases", "workspace_id": "workspace", "entity_id": "entities"},
    )
    if "created_aliases" in snapshot:
        snapshot["created_aliases"] = [ids.id("entity_aliases", pk) for pk in snapshot["created_aliases"]]
    row["snapshot"] = snapshot


PENDING_KINDS = {"chunk": "chunks", "entity": "entities", "relation": "relations"}


def _pending_vector(row: dict, ids: Ids) -> None:
    row["row_id"] = ids.id(PENDING_KINDS[row["kind"]], row["row_id"])


def _graph_rebuild(row: dict, ids: Ids) -> None:
    row["entity_ids"] = [ids.id("entities", pk) for pk in row.get("entity_ids") or []]
    row["relation_ids"] = [ids.id("relations", pk) for pk in row.get("relation_ids") or []]


def _numeric(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _string_id(ids: Ids, table: str, value, prefix: str = ""):
    """A subgraph's ids are strings ("12", "r7"); anything else is left as it is."""
    if isinstance(value, str) and value.startswith(prefix) and value[len(prefix) :].isdigit():
        return f"{prefix}{ids.id(table, int(value[len(prefix) :]))}"
    return value


def _message(row: dict, ids: Ids) -> None:
    """An answer keeps its citations (links to chunks and documents) and the subgraph it drew."""
    citations = []
    for citation in row.get("citations") or []:
        if isinstance(citation, dict):
            citation = dict(citation)
            for key, table in (("chunk_id", "chunks"), ("document_id", "documents")):
                if _numeric(citation.get(key)):
                    citation[key] = ids.id(table, citation[key])
        citations.append(citation)
    row["citations"] = citations
    subgraph = row.get("subgraph")
    if isinstance(subgraph, dict) and subgraph:
        subgraph = dict(subgraph)
        subgraph["nodes"] = [
            {**node, "id": _string_id(ids, "entities", node.get("id"))} if isinstance(node, dict) else node
            for node in subgraph.get("nodes") or []
        ]
        subgraph["edges"] = [
            {
                **edge,
                "id": _string_id(ids, "relations", edge.get("id"), "r"),
                "source": _string_id(ids, "entities", edge.get("source")),
                "target": _string_id(ids, "entities", edge.get("target")),
            }
            if isinstance(edge, dict)
            else edge
            for edge in subgraph.get("edges") or []
        ]
        row["subgraph"] = subgraph


def _source(row: dict, ids: Ids) -> None:
    # A sync of the old installation held it; here the next one may start at once.
    row["sync_until"] = None


def _in(model, path: str) -> Callable[[Workspace], QuerySet]:
    return lambda workspace: model.objects.filter(**{path: workspace})


WORKSPACE = "workspace"
_WS = {"workspace_id": WORKSPACE}

# In the order a restore inserts them (foreign keys are checked at commit, but this order
# reads naturally and lets every statement see the rows it refers to).
TABLES = (
    Table(WORKSPACE, Workspace, lambda workspace: Workspace.objects.filter(pk=workspace.pk)),
    Table(
        "memberships",
        Membership,
        _in(Membership, "workspace"),
        refs=_WS,
        users={"user_id": "user"},
        user_required=True,
    ),
    # Archives written before sources have none.
    Table(
        "sources",
        Source,
        _in(Source, "workspace"),
        refs=_WS,
        users={"created_by_id": "created_by"},
        walk=_source,
        added_later=True,
    ),
    Table(
        "documents",
        Document,
        _in(Document, "workspace"),
        refs={**_WS, "source_id": "sources", "replaces_id": "documents", "superseded_by_id": "documents"},
        users={"created_by_id": "created_by"},
    ),
    Table("chunks", Chunk, _in(Chunk, "workspace"), refs={**_WS, "document_id": "documents"}),
    Table("chunk_extractions", ChunkExtraction, _in(ChunkExtraction, "chunk__workspace"), refs={"chunk_id": "chunks"}),
    Table(
        "pending_vectors",
        PendingVector,
        _in(PendingVector, "document__workspace"),
        refs={"document_id": "documents"},
        walk=_pending_vector,
    ),
    Table("entities", Entity, _in(Entity, "workspace"), refs=_WS, walk=_summary_floor("entity_sources")),
    Table(
        "relations",
        Relation,
        _in(Relation, "workspace"),
        refs={**_WS, "source_id": "entities", "target_id": "entities"},
        walk=_summary_floor("relation_sources"),
    ),
    Table(
        "entity_sources",
        EntitySource,
        _in(EntitySource, "entity__workspace"),
        refs={"entity_id": "entities", "chunk_id": "chunks"},
    ),
    Table(
        "relation_sources",
        RelationSource,
        _in(RelationSource, "relation__workspace"),
        refs={"relation_id": "relations", "chunk_id": "chunks"},
    ),
    Table("entity_aliases", EntityAlias, _in(EntityAlias, "workspace"), refs={**_WS, "entity_id": "entities"}),
    # Archives written before synonym links have none; the next publish links what it touches.
    Table(
        "entity_links",
        EntityLink,
        _in(EntityLink, "workspace"),
        refs={**_WS, "source_id": "entities", "target_id": "entities"},
        added_later=True,
    ),
    Table(
        "merge_logs",
        MergeLog,
        _in(MergeLog, "workspace"),
        refs={**_WS, "survivor_id": "entities"},
        users={"user_id": "user"},
        walk=_merge_snapshot,
    ),
    Table("graph_rebuilds", GraphRebuild, _in(GraphRebuild, "workspace"), refs=_WS, walk=_graph_rebuild),
    Table("audit_events", AuditEvent, _in(AuditEvent, "workspace"), refs=_WS, users={"actor_id": "actor"}),
    Table(
        "conversations",
        Conversation,
        _in(Conversation, "workspace"),
        refs=_WS,
        users={"user_id": "user"},
        user_required=True,
        conversations=True,
    ),
    Table(
        "messages",
        Message,
        _in(Message, "conversation__workspace"),
        refs={"conversation_id": "conversations"},
        walk=_message,
        conversations=True,
    ),
)
TABLES_BY_NAME = {table.name: table for table in TABLES}


def walk_row(table: Table, row: dict, ids: Ids) -> dict:
    """The row with every id it holds rewritten through `ids` (its own included)."""
    row = dict(row)
    row["id"] = ids.id(table.name, row["id"])
    for column, target in table.refs.items():
        if column in row:
            row[column] = ids.id(target, row[column])
    if table.walk is not None:
        table.walk(row, ids)
    return row
