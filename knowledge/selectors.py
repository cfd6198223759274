"""Reads. Every function that reaches user data starts from a workspace the caller may see."""

from collections.abc import Iterable, Sequence

from django.conf import settings
from django.db.models import Count, F, IntegerField, OuterRef, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404
from pgvector.django import CosineDistance

from knowledge.models import ROLE_RANK, Chunk, Entity, Relation, Role, Workspace


def roles_at_least(min_role: str) -> list[str]:
    return [role for role, rank in ROLE_RANK.items() if rank >= ROLE_RANK[min_role]]


def workspaces_for_user(user) -> QuerySet[Workspace]:
    """The workspaces a user belongs to, each annotated with the user's `role`."""
    if not user.is_authenticated:
        return Workspace.objects.none()
    return Workspace.objects.filter(memberships__user=user).annotate(role=F("memberships__role"))


def workspace_for_user(user, slug: str, min_role: str = Role.VIEWER) -> Workspace:
    """The access check of this project: the workspace if the user holds at least `min_role`.

    Anything else is a 404, so a workspace's existence never leaks to non-members.
    """
    if not user.is_authenticated:
        raise Http404("No such workspace.")
    # One filter() call, so the membership conditions apply to the same membership row.
    workspace = (
        Workspace.objects.filter(slug=slug, memberships__user=user, memberships__role__in=roles_at_least(min_role))
        .annotate(role=F("memberships__role"))
        .first()
    )
    if workspace is None:
        raise Http404("No such workspace.")
    return workspace


def _count_where(field: str, outer: str) -> Coalesce:
    rows = (
        Relation.objects.filter(**{field: OuterRef(outer)}).order_by().values(field).annotate(n=Count("*")).values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), 0)


def _degree_of(outer: str):
    return _count_where("source", outer) + _count_where("target", outer)


def entity_degrees(*, entity_ids: Iterable[int]) -> dict[int, int]:
    """Degree (number of relations) of each entity, in one query."""
    rows = Entity.objects.filter(pk__in=list(entity_ids)).annotate(degree=_degree_of("pk"))
    return dict(rows.values_list("pk", "degree"))


def relation_ranks(*, relation_ids: Iterable[int]) -> dict[int, int]:
    """Edge rank (sum of both endpoints' degrees) of each relation, in one query."""
    rows = Relation.objects.filter(pk__in=list(relation_ids)).annotate(rank=_degree_of("source") + _degree_of("target"))
    return dict(rows.values_list("pk", "rank"))


def _nearest(
    queryset: QuerySet,
    *,
    size: int,
    vector: Sequence[float],
    k: int,
    min_similarity: float | None,
):
    queryset = queryset.exclude(embedding=None).annotate(distance=CosineDistance("embedding", vector))
    if min_similarity is not None:
        queryset = queryset.filter(distance__lte=1.0 - min_similarity)
    # pgvector < 0.8 filters HNSW results after the scan, so a small workspace in a big
    # table can come back short. Below the threshold an exact scan over the workspace's
    # rows is both correct and fast; ordering by an expression the index cannot serve
    # (distance + 0) is what makes the planner choose it.
    if size <= settings.VECTOR_EXACT_SCAN_MAX:
        return list(queryset.order_by(F("distance") + 0.0, "pk")[:k])
    return list(queryset.order_by("distance")[:k])


def entities_nearest(
    *,
    workspace: Workspace,
    vector: Sequence[float],
    k: int,
    min_similarity: float | None = None,
) -> list[Entity]:
    """The k entities of the workspace closest to `vector` by cosine, each with `.distance`."""
    return _nearest(
        Entity.objects.filter(workspace=workspace),
        size=workspace.entity_count,
        vector=vector,
        k=k,
        min_similarity=min_similarity,
    )


def relations_nearest(
    *,
    workspace: Workspace,
    vector: Sequence[float],
    k: int,
    min_similarity: float | None = None,
) -> list[Relation]:
    return _nearest(
        Relation.objects.filter(workspace=workspace),
        size=workspace.relation_count,
        vector=vector,
        k=k,
        min_similarity=min_similarity,
    )


def chunks_nearest(
    *,
    workspace: Workspace,
    vector: Sequence[float],
    k: int,
    min_similarity: float | None = None,
) -> list[Chunk]:
    return _nearest(
        Chunk.objects.filter(workspace=workspace),
        size=workspace.chunk_count,
        vector=vector,
        k=k,
        min_similarity=min_similarity,
    )
