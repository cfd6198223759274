"""A workspace's graph as files other tools read: GraphML (Gephi, networkx, yEd), CSV (spreadsheets,
pandas) and JSON (networkx's node-link form, notebooks).

Only what the workspace serves is exported: published entities and relations, and the provenance
of documents that finished processing. Rows of a document still being ingested never leave.

Each format is a generator of byte blocks that reads the database page by page (a server-side
cursor inside one read-only, repeatable-read transaction), so a graph of any size streams in
constant memory and every block of one export sees the same state of the graph.
"""

import asyncio
import csv
import io
import json
import re
import zipfile
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from xml.sax.saxutils import escape, quoteattr

from django.db import close_old_connections, connection, transaction
from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce
from django.utils import timezone

from knowledge.models import Document, Entity, EntitySource, Relation, RelationSource, Workspace

PAGE_ROWS = 2000
BLOCK_BYTES = 64 * 1024

# Characters XML 1.0 cannot hold at all, even escaped; text extracted from PDFs carries some.
_NOT_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ud800-\udfff\ufffe\uffff]")
# A spreadsheet runs a cell starting with one of these as a formula (OWASP "CSV injection").
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


@dataclass(frozen=True)
class ExportFormat:
    name: str
    label: str
    extension: str
    content_type: str
    write: Callable[[Workspace], Iterator[bytes]]


# --- What is exported --------------------------------------------------------------------


def _visible_sources(model, owner: str):
    return model.objects.filter(
        **{f"{owner}__published": True}, chunk__document__status=Document.Status.PROCESSED
    ).order_by()


def _source_count(model, owner: str) -> Coalesce:
    rows = (
        _visible_sources(model, owner)
        .filter(**{owner: OuterRef("pk")})
        .values(owner)
        .annotate(n=Count("*"))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), 0)


def _entities(workspace: Workspace) -> Iterator[dict]:
    rows = (
        Entity.objects.published()
        .filter(workspace=workspace)
        .annotate(degree=Coalesce("degree_row__degree", 0), source_count=_source_count(EntitySource, "entity"))
        .order_by("pk")
        .values("pk", "name", "key", "type", "description", "degree", "source_count")
    )
    return rows.iterator(chunk_size=PAGE_ROWS)


def _relations(workspace: Workspace) -> Iterator[dict]:
    rows = (
        Relation.objects.published()
        .filter(workspace=workspace, source__published=True, target__published=True)
        .annotate(source_count=_source_count(RelationSource, "relation"))
        .order_by("pk")
        .values(
            "pk",
            "source_id",
            "target_id",
            "source__name",
            "target__name",
            "keywords",
            "description",
            "weight",
            "source_count",
        )
    )
    return rows.iterator(chunk_size=PAGE_ROWS)


PROVENANCE_COLUMNS = (
    "kind",
    "row_id",
    "row_name",
    "document_id",
    "document_title",
    "chunk_id",
    "chunk_order",
    "section",
    "location",
    "name_in_chunk",
    "type",
    "description",
    "keywords",
    "strength",
)


def _provenance(workspace: Workspace) -> Iterator[dict]:
    chunk = ("chunk__document_id", "chunk__document__title", "chunk_id", "chunk__order", "chunk__section")
    entity_rows = (
        _visible_sources(EntitySource, "entity")
        .filter(entity__workspace=workspace)
        .order_by("entity_id", "chunk_id")
        .values("entity_id", "entity__name", *chunk, "chunk__location", "name", "type", "description")
    )
    for row in entity_rows.iterator(chunk_size=PAGE_ROWS):
        yield _provenance_row("entity", row["entity_id"], row["entity__name"], row, name=row["name"], type=row["type"])
    relation_rows = (
        _visible_sources(RelationSource, "relation")
        .filter(relation__workspace=workspace, relation__source__published=True, relation__target__published=True)
        .order_by("relation_id", "chunk_id")
        .values(
            "relation_id",
            "relation__source__name",
            "relation__target__name",
            *chunk,
            "chunk__location",
            "description",
            "keywords",
            "strength",
        )
    )
    for row in relation_rows.iterator(chunk_size=PAGE_ROWS):
        name = f"{row['relation__source__name']} – {row['relation__target__name']}"
        yield _provenance_row(
            "relation", row["relation_id"], name, row, keywords=row["keywords"], strength=row["strength"]
        )


def _provenance_row(kind: str, row_id: int, row_name: str, row: dict, **extra) -> dict:
    return {
        "kind": kind,
        "row_id": row_id,
        "row_name": row_name,
        "document_id": row["chunk__document_id"],
        "document_title": row["chunk__document__title"],
        "chunk_id": row["chunk_id"],
        "chunk_order": row["chunk__order"],
        "section": row["chunk__section"],
        "location": row["chunk__location"],
        "name_in_chunk": extra.get("name", ""),
        "type": extra.get("type", ""),
        "description": row["description"],
        "keywords": extra.get("keywords", ""),
        "strength": extra.get("strength"),
    }


@contextmanager
def read_snapshot():
    """One consistent view of the graph for the whole export (a request's first query starts it)."""
    if connection.in_atomic_block:
        # Already inside a transaction (a caller's, or a test's): its view is the snapshot.
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        yield


def _blocks(pieces: Iterable[str]) -> Iterator[bytes]:
    """Text pieces as UTF-8 blocks of about BLOCK_BYTES, so a stream is not one write per row."""
    buffer, size = [], 0
    for piece in pieces:
        data = piece.encode()
        buffer.append(data)
        size += len(data)
        if size >= BLOCK_BYTES:
            yield b"".join(buffer)
            buffer, size = [], 0
    if buffer:
        yield b"".join(buffer)


# --- GraphML -----------------------------------------------------------------------------

# (key id, for, attr.name, attr.type): typed, so Gephi and networkx read numbers as numbers.
GRAPHML_KEYS = (
    ("n_label", "node", "label", "string"),
    ("n_key", "node", "key", "string"),
    ("n_type", "node", "type", "string"),
    ("n_description", "node", "description", "string"),
    ("n_degree", "node", "degree", "int"),
    ("n_sources", "node", "sources", "int"),
    ("e_label", "edge", "label", "string"),
    ("e_keywords", "edge", "keywords", "string"),
    ("e_description", "edge", "description", "string"),
    ("e_weight", "edge", "weight", "double"),
    ("e_sources", "edge", "sources", "int"),
)


def _xml_text(value) -> str:
    return escape(_NOT_XML.sub("", str(value)))


def _data(key: str, value) -> str:
    return f'<data key="{key}">{_xml_text(value)}</data>'


def _graphml_pieces(workspace: Workspace) -> Iterator[str]:
    yield '<?xml version="1.0" encoding="UTF-8"?>\n'
    yield (
        '<graphml xmlns="http://graphml.graphdrawing.org/xmlns" '
        'xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" '
        'xsi:schemaLocation="http://graphml.graphdrawing.org/xmlns '
        'http://graphml.graphdrawing.org/xmlns/1.0/graphml.xsd">\n'
    )
    for key, domain, name, kind in GRAPHML_KEYS:
        yield f'  <key id="{key}" for="{domain}" attr.name="{name}" attr.type="{kind}"/>\n'
    yield f'  <graph id={quoteattr(_NOT_XML.sub("", workspace.slug))} edgedefault="undirected">\n'
    with read_snapshot():
        for row in _entities(workspace):
            fields = (
                _data("n_label", row["name"]),
                _data("n_key", row["key"]),
                _data("n_type", row["type"]),
                _data("n_description", row["description"]),
                _data("n_degree", row["degree"]),
                _data("n_sources", row["source_count"]),
            )
            yield f'    <node id="n{row["pk"]}">{"".join(fields)}</node>\n'
        for row in _relations(workspace):
            fields = (
                _data("e_label", row["keywords"]),
                _data("e_keywords", row["keywords"]),
                _data("e_description", row["description"]),
                _data("e_weight", repr(float(row["weight"]))),
                _data("e_sources", row["source_count"]),
            )
            yield (
                f'    <edge id="r{row["pk"]}" source="n{row["source_id"]}" target="n{row["target_id"]}">'
                f"{''.join(fields)}</edge>\n"
            )
    yield "  </graph>\n</graphml>\n"


def graph_graphml(workspace: Workspace) -> Iterator[bytes]:
    return _blocks(_graphml_pieces(workspace))


# --- JSON --------------------------------------------------------------------------------


def _json_pieces(workspace: Workspace) -> Iterator[str]:
    header = {
        "directed": False,
        "multigraph": False,
        "graph": {
            "workspace": workspace.slug,
            "name": workspace.name,
            "exported_at": timezone.now().isoformat(),
        },
    }
    yield json.dumps(header)[:-1]
    with read_snapshot():
        yield ', "nodes": ['
        for index, row in enumerate(_entities(workspace)):
            node = {
                "id": f"n{row['pk']}",
                "entity_id": row["pk"],
                "label": row["name"],
                "key": row["key"],
                "type": row["type"],
                "description": row["description"],
                "degree": row["degree"],
                "sources": row["source_count"],
            }
            yield ("," if index else "") + json.dumps(node)
        yield '], "edges": ['
        for index, row in enumerate(_relations(workspace)):
            edge = {
                "id": f"r{row['pk']}",
                "relation_id": row["pk"],
                "source": f"n{row['source_id']}",
                "target": f"n{row['target_id']}",
                "source_name": row["source__name"],
                "target_name": row["target__name"],
                "keywords": row["keywords"],
                "description": row["description"],
                "weight": row["weight"],
                "sources": row["source_count"],
            }
            yield ("," if index else "") + json.dumps(edge)
        yield '], "provenance": ['
        for index, row in enumerate(_provenance(workspace)):
            yield ("," if index else "") + json.dumps(row)
    yield "]}\n"


def graph_json(workspace: Workspace) -> Iterator[bytes]:
    return _blocks(_json_pieces(workspace))


# --- CSV (a zip of three tables) ---------------------------------------------------------

ENTITY_COLUMNS = ("id", "name", "key", "type", "description", "degree", "sources")
RELATION_COLUMNS = (
    "id",
    "source_id",
    "source",
    "target_id",
    "target",
    "keywords",
    "description",
    "weight",
    "sources",
)


def _cell(value):
    if isinstance(value, str) and value.startswith(_FORMULA_START):
        return "'" + value
    return value


class _Drain(io.RawIOBase):
    """A write-only stream whose bytes are taken out as they come, for a zip built on the fly."""

    def __init__(self):
        self.pending = bytearray()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.pending += data
        return len(data)

    def take(self) -> bytes:
        data = bytes(self.pending)
        self.pending.clear()
        return data


def _csv_tables(workspace: Workspace) -> Iterator[tuple[str, tuple[str, ...], Iterator[tuple]]]:
    yield (
        "entities.csv",
        ENTITY_COLUMNS,
        (
            (row["pk"], row["name"], row["key"], row["type"], row["description"], row["degree"], row["source_count"])
            for row in _entities(workspace)
        ),
    )
    yield (
        "relations.csv",
        RELATION_COLUMNS,
        (
            (
                row["pk"],
                row["source_id"],
                row["source__name"],
                row["target_id"],
                row["target__name"],
                row["keywords"],
                row["description"],
                row["weight"],
                row["source_count"],
            )
            for row in _relations(workspace)
        ),
    )
    yield (
        "provenance.csv",
        PROVENANCE_COLUMNS,
        (tuple(row[column] for column in PROVENANCE_COLUMNS) for row in _provenance(workspace)),
    )


def graph_csv_zip(workspace: Workspace) -> Iterator[bytes]:
    """entities.csv, relations.csv and provenance.csv in one zip, written as it streams (no seeking)."""
    drain = _Drain()
    with zipfile.ZipFile(drain, "w", compression=zipfile.ZIP_DEFLATED) as archive, read_snapshot():
        for name, columns, rows in _csv_tables(workspace):
            # force_zip64: the size is unknown when the entry starts, and may pass 2 GiB.
            with archive.open(name, "w", force_zip64=True) as member:
                text = io.TextIOWrapper(member, encoding="utf-8", newline="")
                writer = csv.writer(text)
                writer.writerow(columns)
                for row in rows:
                    writer.writerow([_cell(value) for value in row])
                    if len(drain.pending) >= BLOCK_BYTES:
                        text.flush()
                        yield drain.take()
                text.flush()
                text.detach()
            yield drain.take()
    yield drain.take()


FORMATS = {
    export.name: export
    for export in (
        ExportFormat("graphml", "GraphML (Gephi, networkx, yEd)", "graphml", "application/graphml+xml", graph_graphml),
        ExportFormat("csv", "CSV: entities, relations, provenance (zip)", "zip", "application/zip", graph_csv_zip),
        ExportFormat("json", "JSON (networkx node-link)", "json", "application/json", graph_json),
    )
}


def export_filename(workspace: Workspace, export: ExportFormat) -> str:
    return f"{workspace.slug}-graph.{export.extension}"


async def on_own_thread(blocks: Generator[bytes, None, None]) -> AsyncIterator[bytes]:
    """The blocks of a sync export for an ASGI response, read on a thread of its own.

    Every block comes from the same thread, so the export's transaction and server-side cursor
    stay on one connection; neither the event loop nor asgiref's shared thread waits for the
    database meanwhile. A client that goes away closes the export (and its transaction).
    """
    loop = asyncio.get_running_loop()
    thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="export")
    done = object()

    def step():
        return next(blocks, done)

    def finish():
        blocks.close()
        connection.close()

    try:
        await loop.run_in_executor(thread, close_old_connections)
        while (block := await loop.run_in_executor(thread, step)) is not done:
            yield block
    finally:
        await loop.run_in_executor(thread, finish)
        thread.shutdown(wait=False)
