"""A document's values for the graph rows it shares, kept until the transaction that publishes it.

A build computes each row it touched from the provenance of published documents and its own. On
a row that is already served, writing the result would serve the document before it is
published (and after it failed); so the values wait in PendingRow, the changed vectors in
PendingVector, and `apply_staged` writes them in the publishing transaction, only where the
provenance they were computed from is still what is there.
"""

from django.db import connection

from knowledge.models import Entity, EntitySource, PendingRow, PendingVector, Relation, RelationSource
from knowledge.rag.graph.locks import lock_entity_keys, lock_relations
from knowledge.rag.graph.provenance import fingerprints, together_marker
from knowledge.rag.graph.vectors import stage_vectors, update_rows

_KIND = {Entity: PendingVector.Kind.ENTITY, Relation: PendingVector.Kind.RELATION}
_SOURCES = {Entity: (EntitySource, "entity_id"), Relation: (RelationSource, "relation_id")}


def stage_rows(*, document_id: int, model, rows: dict[int, tuple[dict, tuple]], vectors: dict[int, list]) -> None:
    """Keep (values, provenance fingerprint) per row, and the new vectors of served rows; a row
    staged again whose vector no longer changes loses the one staged before."""
    if not rows:
        return
    kind = _KIND[model]
    marker = together_marker()
    PendingRow.objects.bulk_create(
        [
            PendingRow(document_id=document_id, kind=kind, row_id=pk, values=values, sources=[*fingerprint, *marker])
            for pk, (values, fingerprint) in rows.items()
        ],
        update_conflicts=True,
        unique_fields=["document", "kind", "row_id"],
        update_fields=["values", "sources"],
    )
    published = set(model.objects.filter(pk__in=list(rows), published=True).values_list("pk", flat=True))
    PendingVector.objects.filter(
        document_id=document_id, kind=kind, row_id__in=[pk for pk in published if pk not in vectors]
    ).delete()
    stage_vectors(document_id=document_id, kind=kind, rows=[(pk, "", vector) for pk, vector in vectors.items()])


def unstaged(*, document_id: int, entity_ids: list[int], relation_ids: list[int]) -> tuple[list[int], list[int]]:
    """The rows among these whose staged values are missing (a curation merge renumbered them) or
    were computed from provenance that has changed since (another document published, one was
    deleted, a merge moved sources), or by another group of documents built together."""
    result, marker = [], together_marker()
    for model, ids in ((Entity, entity_ids), (Relation, relation_ids)):
        staged = dict(
            PendingRow.objects.filter(document_id=document_id, kind=_KIND[model], row_id__in=ids).values_list(
                "row_id", "sources"
            )
        )
        source_model, field = _SOURCES[model]
        current = fingerprints(source_model, field, ids, document_id)
        result.append(sorted(pk for pk in ids if pk in current and [*current[pk], *marker] != staged.get(pk)))
    return result[0], result[1]


def lock_staged(*, workspace_id: int, entity_ids: list[int], relation_ids: list[int]) -> None:
    """Inside the publishing transaction: hold the rows as every writer of their provenance does
    (advisory locks, then the rows in id order), so what `unstaged` finds stays true until commit."""
    keys = Entity.objects.filter(pk__in=entity_ids).values_list("key", flat=True)
    lock_entity_keys(workspace_id=workspace_id, keys=keys)
    lock_relations(relation_ids=relation_ids)
    with connection.cursor() as cursor:
        for table, ids in (("knowledge_entity", entity_ids), ("knowledge_relation", relation_ids)):
            cursor.execute(
                f"SELECT id FROM {table} WHERE id = ANY(%s) ORDER BY id FOR NO KEY UPDATE",  # noqa: S608 - fixed names
                [sorted(ids)],
            )


def apply_staged(*, document_id: int, entity_ids: list[int], relation_ids: list[int]) -> None:
    """Write the document's staged values for these rows onto them (its vectors move with
    publish_vectors). Others it staged are dropped: a group run that died may have left values
    for rows only another of its documents touched."""
    for (model, kind), ids in zip(_KIND.items(), (entity_ids, relation_ids), strict=True):
        values = dict(
            PendingRow.objects.filter(document_id=document_id, kind=kind, row_id__in=ids).values_list(
                "row_id", "values"
            )
        )
        update_rows(model, values)
    PendingRow.objects.filter(document_id=document_id).delete()
