"""Which provenance a graph row's values come from.

A served row says only what published documents say; a document's build adds its own sources
(knowledge.rag.graph.staging) and, for a new version, leaves out the sources of the version it
replaces, which its publishing transaction retires (knowledge.services.ingestion.versions).
Rebuilds and publishing compare these fingerprints to know whether what they computed still holds.

A row whose values are folded (knowledge.rag.graph.rebuild: what they count of its provenance,
up to a source id) has for fingerprint what it says it folds and the workspace's provenance
epoch, read from the row and one index entry: no source of a hub is read to know that it still
holds. The epoch is the last entry of `knowledge_provenance_epoch` for the workspace, which
triggers add whenever provenance changes other than by a build's new rows: a source deleted or
updated, a processed document no longer processed (migration 0017). A publication adds sources
too, but it writes the new folds of every row they support.
"""

import contextlib
import contextvars
from collections.abc import Iterator

from django.db import connection
from django.db.models import Count, Max, Min, Q
from django.db.models.expressions import RawSQL

from knowledge.models import Document
from knowledge.rag import llm

FOLDED = "folded"

# (id, workspace id, id of the version it replaces) of the document being built, as the caller
# already read it: a build asks for them at every fingerprint and every read of sources.
_known: contextvars.ContextVar[tuple[int, int, int | None] | None] = contextvars.ContextVar(
    "document_known", default=None
)

# The documents of a group run (knowledge.services.ingestion.runs) built and published together:
# each one's build sees the sources of all of them, as their one publication will.
_together: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("built_together", default=frozenset())


@contextlib.contextmanager
def document_known(document_id: int, workspace_id: int, replaces_id: int | None) -> Iterator[None]:
    """Inside the block, builds of this document take its workspace and the version it replaces
    from here instead of reading them. A version deleted meanwhile (`replaces` set to null) only
    makes them exclude sources that are gone and start from everything, as for any new version."""
    token = _known.set((document_id, workspace_id, replaces_id))
    try:
        yield
    finally:
        _known.reset(token)


def _document(document_id: int) -> dict | None:
    """The document's workspace_id and replaces_id (None once it is deleted)."""
    known = _known.get()
    if known is not None and known[0] == document_id:
        return {"workspace_id": known[1], "replaces_id": known[2]}
    return Document.objects.filter(pk=document_id).values("workspace_id", "replaces_id").first()


@contextlib.contextmanager
def built_together(document_ids: list[int]) -> Iterator[None]:
    """Inside the block, a build of any of these documents sees the sources of all of them, and
    what it stages says so (`together_marker`)."""
    token = _together.set(frozenset(document_ids) if len(document_ids) > 1 else frozenset())
    try:
        yield
    finally:
        _together.reset(token)


def _building(document_id: int) -> frozenset[int]:
    """The in-flight documents whose sources a build of this document sees."""
    together = _together.get()
    return together if document_id in together else frozenset((document_id,))


def together_marker() -> list:
    """What a staged row adds to its fingerprint when it was built with other documents' sources:
    their ids. Only the same group's publication finds it unchanged; a member published alone
    (its group run died) builds such a row again. A folded row's fingerprint would not tell,
    since it counts published sources only."""
    together = _together.get()
    return ["together", *sorted(together)] if together else []


_EPOCH_SQL = "SELECT coalesce(max(id), 0) FROM knowledge_provenance_epoch WHERE workspace_id = %s"


def provenance_epoch(workspace_id: int) -> int:
    with connection.cursor() as cursor:
        cursor.execute(_EPOCH_SQL, [workspace_id])
        return cursor.fetchone()[0]


def _folding_workspace(document_id: int | None) -> int | None:
    """The workspace whose epoch a build of this document may start from folded values at, or
    None when it may not: outside a build (deletions, merges, edits rebuild from everything) and
    for a new version (its build leaves out the sources of the version it replaces, which the
    folds count)."""
    if document_id is None:
        return None
    document = _document(document_id)
    if document is None or document["replaces_id"] is not None:
        return None
    return document["workspace_id"]


def folding_epoch(document_id: int | None) -> int | None:
    """The epoch a build of this document may start from folded values at (_folding_workspace)."""
    workspace_id = _folding_workspace(document_id)
    return None if workspace_id is None else provenance_epoch(workspace_id)


def fold_fingerprint(folded: dict | None, published: bool, epoch: int | None, summarizes: bool) -> tuple | None:
    """A row's fingerprint from its folded values, if a build may start from them: a published
    row folded at the current epoch; not a description cut to the budget while a chat model could
    now summarize what it left out (`summarizes`: llm.chat_model_configured(), asked once per
    batch by the caller, since each asking reads Redis)."""
    if epoch is None or not published or not folded or folded.get("epoch") != epoch:
        return None
    if folded["cut"] and summarizes:
        return None
    return (FOLDED, epoch, folded["through"], folded["count"])


def _visible(sources: list[tuple], document_id: int | None) -> list[tuple]:
    """The sources a row's values may come from: those of published documents, and of the document
    being built. A row only in-flight documents support (it is unpublished, or every published
    document behind it was deleted) is computed from all of them: nothing else describes it."""
    building = _building(document_id) if document_id is not None else frozenset()
    seen = [row for row in sources if row[-2] == Document.Status.PROCESSED or row[-1] in building]
    return seen or sources


def _sources(model, field: str, ids: list[int], document_id: int | None):
    rows = model.objects.filter(**{f"{field}__in": ids})
    document = _document(document_id) if document_id else None
    replaced = document["replaces_id"] if document else None
    if replaced is not None:
        # Rows only the retiring version supports keep their values until it goes with them.
        rows = rows.exclude(chunk__document_id=replaced)
    return rows


def source_rows(model, field: str, ids: list[int], columns: tuple[str, ...], document_id: int | None) -> dict:
    """row id -> its visible sources as (id, *columns), in id order."""
    rows = _sources(model, field, ids, document_id)
    everything: dict[int, list[tuple]] = {}
    for row in rows.order_by("id").values_list(field, "id", *columns, "chunk__document__status", "chunk__document_id"):
        everything.setdefault(row[0], []).append(row[1:])
    return {pk: [row[:-2] for row in _visible(rows, document_id)] for pk, rows in everything.items()}


def _newer(field: str, throughs: dict[int, int]) -> Q:
    found = Q()
    for pk, through in throughs.items():
        found |= Q(**{field: pk, "id__gt": through})
    return found


def unfolded_rows(
    model, field: str, throughs: dict[int, int], columns: tuple[str, ...], document_id: int | None
) -> dict[int, list[tuple]]:
    """row id -> its visible sources its folded values do not count yet, as (id, *columns) in id
    order: those of published documents after its `through` id, and all of the document being
    built (a build that started before the last publication has sources below it)."""
    if not throughs:
        return {}
    sources = _sources(model, field, list(throughs), document_id)
    selected = (field, "id", *columns)
    newer = sources.filter(_newer(field, throughs), chunk__document__status=Document.Status.PROCESSED)
    newer = newer.values_list(*selected)
    if document_id is not None:
        # A second branch, not an OR in one WHERE: the OR let no index serve either side, and
        # Postgres read every source of every hub to test it (91 ms against 9 for eight hubs of
        # the 10M-token graph, benchmarks/results/2026-11-29-scale-10m-folded.md).
        newer = newer.union(
            sources.filter(chunk__document_id__in=_building(document_id)).values_list(*selected), all=True
        )
    found: dict[int, dict[int, tuple]] = {}
    for row in newer.order_by("id"):
        found.setdefault(row[0], {})[row[1]] = row[1:]  # by id: a source in both branches once
    return {pk: list(rows.values()) for pk, rows in found.items()}


def fingerprints_of(rows: dict[int, list[tuple]]) -> dict[int, tuple]:
    """row id -> (count, lowest id, highest id) of its sources."""
    return {pk: (len(found), found[0][0], found[-1][0]) for pk, found in rows.items()}


def fingerprints(model, field: str, ids: list[int], document_id: int | None = None) -> dict[int, tuple]:
    """row id -> the fingerprint of the sources its values come from: for a document's build, the
    folded one of a row whose folds it may start from (fold_fingerprint); else
    fingerprints_of(source_rows(...)), counted in the database."""
    if not ids:
        return {}
    result = {}
    workspace_id = _folding_workspace(document_id)
    if workspace_id is not None:
        owner = model._meta.get_field(field.removesuffix("_id")).related_model
        summarizes = llm.chat_model_configured()
        # The epoch in the statement that reads the folds: one statement, one snapshot.
        rows = (
            owner.objects.filter(pk__in=ids)
            .annotate(epoch=RawSQL(f"({_EPOCH_SQL})", [workspace_id]))  # noqa: S611 - a fixed query
            .values_list("pk", "published", "folded", "epoch")
        )
        for pk, published, folded, epoch in rows:
            fingerprint = fold_fingerprint(folded, published, epoch, summarizes)
            if fingerprint is not None:
                result[pk] = fingerprint
    rest = [pk for pk in ids if pk not in result]
    if not rest:
        return result
    visible = Q(chunk__document__status=Document.Status.PROCESSED)
    if document_id is not None:
        visible |= Q(chunk__document_id__in=_building(document_id))
    found = (
        _sources(model, field, rest, document_id)
        .order_by()
        .values(field)
        .annotate(
            seen=Count("id", filter=visible),
            seen_low=Min("id", filter=visible),
            seen_high=Max("id", filter=visible),
            all=Count("id"),
            low=Min("id"),
            high=Max("id"),
        )
    )
    for row in found:
        result[row[field]] = (
            (row["seen"], row["seen_low"], row["seen_high"]) if row["seen"] else (row["all"], row["low"], row["high"])
        )
    return result
