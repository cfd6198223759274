"""Which provenance a graph row's values come from.

A served row says only what published documents say; a document's build adds its own sources
(knowledge.rag.graph.staging) and, for a new version, leaves out the sources of the version it
replaces, which its publishing transaction retires (knowledge.services.ingestion.versions).
Rebuilds and publishing compare these fingerprints to know whether what they computed still holds.
"""

from functools import reduce
from operator import or_

from django.db.models import Count, Max, Min, Q

from knowledge.models import Document


def _visible(sources: list[tuple], document_id: int | None) -> list[tuple]:
    """The sources a row's values may come from: those of published documents, and of the document
    being built. A row only in-flight documents support (it is unpublished, or every published
    document behind it was deleted) is computed from all of them: nothing else describes it."""
    seen = [row for row in sources if row[-2] == Document.Status.PROCESSED or row[-1] == document_id]
    return seen or sources


def _sources(model, field: str, ids: list[int], document_id: int | None):
    rows = model.objects.filter(**{f"{field}__in": ids})
    replaced = (
        Document.objects.filter(pk=document_id).values_list("replaces_id", flat=True).first() if document_id else None
    )
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


def _up_to(field: str, throughs: dict[int, int], newer: bool) -> Q:
    return reduce(
        or_, (Q(**{field: pk, "id__gt" if newer else "id__lte": through}) for pk, through in throughs.items())
    )


def unfolded_rows(
    model, field: str, throughs: dict[int, int], columns: tuple[str, ...], document_id: int | None
) -> dict[int, list[tuple]]:
    """row id -> its visible sources its folded values do not count yet, as (id, *columns) in id
    order: those of published documents after its `through` id, and all of the document being
    built (a build that started before the last publication has sources below it)."""
    if not throughs:
        return {}
    newer = Q(_up_to(field, throughs, newer=True), chunk__document__status=Document.Status.PROCESSED)
    if document_id is not None:
        newer |= Q(**{f"{field}__in": list(throughs)}, chunk__document_id=document_id)
    found: dict[int, list[tuple]] = {}
    for row in (
        _sources(model, field, list(throughs), document_id)
        .filter(newer)
        .order_by("id")
        .values_list(field, "id", *columns)
    ):
        found.setdefault(row[0], []).append(row[1:])
    return found


def fingerprints_of(rows: dict[int, list[tuple]]) -> dict[int, tuple]:
    """row id -> (count, lowest id, highest id) of its sources."""
    return {pk: (len(found), found[0][0], found[-1][0]) for pk, found in rows.items()}


def fingerprints(
    model, field: str, ids: list[int], document_id: int | None = None, throughs: dict[int, int] | None = None
) -> dict[int, tuple]:
    """row id -> the fingerprint of the sources its values come from: fingerprints_of(source_rows(...)),
    counted in the database (a hub's thousands of sources are not sent over to be counted).

    With `throughs` (row id -> a source id), each of those rows' fingerprint is followed by the
    count of its published sources up to that id, not counting the document being built: what a
    row's folded values (knowledge.rag.graph.rebuild) say they count, for them to still hold.
    """
    visible = Q(chunk__document__status=Document.Status.PROCESSED)
    if document_id is not None:
        visible |= Q(chunk__document_id=document_id)
    folded = {}
    if throughs:
        published = Q(_up_to(field, throughs, newer=False), chunk__document__status=Document.Status.PROCESSED)
        if document_id is not None:
            published &= ~Q(chunk__document_id=document_id)
        folded = {"folded": Count("id", filter=published)}
    found = (
        _sources(model, field, ids, document_id)
        .order_by()
        .values(field)
        .annotate(
            seen=Count("id", filter=visible),
            seen_low=Min("id", filter=visible),
            seen_high=Max("id", filter=visible),
            all=Count("id"),
            low=Min("id"),
            high=Max("id"),
            **folded,
        )
    )
    result = {}
    for row in found:
        fingerprint = (
            (row["seen"], row["seen_low"], row["seen_high"]) if row["seen"] else (row["all"], row["low"], row["high"])
        )
        if throughs and row[field] in throughs:
            fingerprint += (row["folded"],)
        result[row[field]] = fingerprint
    return result
