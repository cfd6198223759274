"""Writes. Each service does one user-visible thing in one transaction."""

from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce

from knowledge.models import Chunk, Entity, Relation, Workspace


def _rows_of(model) -> Coalesce:
    rows = model.objects.filter(workspace=OuterRef("pk")).order_by().values("workspace").annotate(n=Count("*"))
    return Coalesce(Subquery(rows.values("n"), output_field=IntegerField()), 0)


def workspace_refresh_counts(*, workspace_id: int) -> None:
    Workspace.objects.filter(pk=workspace_id).update(
        chunk_count=_rows_of(Chunk),
        entity_count=_rows_of(Entity),
        relation_count=_rows_of(Relation),
    )
