"""Writes. Each service does one user-visible thing in one transaction."""

from django.db.models import Count, IntegerField, OuterRef, Subquery
from django.db.models.functions import Coalesce

from knowledge.models import AuditEvent, Chunk, Entity, Relation, Workspace


def _rows_of(model) -> Coalesce:
    rows = model.objects.filter(workspace=OuterRef("pk")).order_by().values("workspace").annotate(n=Count("*"))
    return Coalesce(Subquery(rows.values("n"), output_field=IntegerField()), 0)


def workspace_refresh_counts(*, workspace_id: int) -> None:
    Workspace.objects.filter(pk=workspace_id).update(
        chunk_count=_rows_of(Chunk),
        entity_count=_rows_of(Entity),
        relation_count=_rows_of(Relation),
    )


def audit_record(*, workspace: Workspace, actor, action: str, summary: str, detail: dict | None = None) -> AuditEvent:
    """Write one line of the workspace's audit log (merges, undos, deletions, membership changes).

    Call it inside the transaction of the change it records, so both happen or neither does.
    """
    return AuditEvent.objects.create(
        workspace=workspace,
        actor=actor if actor is not None and actor.is_authenticated else None,
        action=action,
        summary=summary[:500],
        detail=detail or {},
    )
