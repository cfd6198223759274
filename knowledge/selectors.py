"""Reads. Every function that reaches user data starts from a workspace the caller may see."""

from collections.abc import Iterable, Sequence

from django.conf import settings
from django.db.models import Count, F, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404
from pgvector.django import CosineDistance

from knowledge.models import ROLE_RANK, Chunk, Entity, EntitySource, Relation, Role, Workspace


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


def _document_count() -> Coalesce:
    rows = (
        EntitySource.objects.filter(entity=OuterRef("pk"))
        .order_by()
        .values("entity")
        .annotate(n=Count("chunk__document", distinct=True))
        .values("n")
    )
    return Coalesce(Subquery(rows, output_field=IntegerField()), 0)


ENTITY_ORDERINGS = {
    "degree": ("-degree", "name", "pk"),
    "name": ("name", "pk"),
    "documents": ("-document_count", "name", "pk"),
}


def entities_browse(
    *, workspace: Workspace, query: str = "", type: str = "", order: str = "degree"
) -> QuerySet[Entity]:
    """The workspace's entities for the graph browser, each with `degree` and `document_count`."""
    entities = Entity.objects.filter(workspace=workspace)
    if query:
        entities = entities.filter(Q(name__icontains=query) | Q(aliases__name__icontains=query)).distinct()
    if type:
        entities = entities.filter(type=type)
    entities = entities.annotate(degree=_degree_of("pk"), document_count=_document_count())
    return entities.order_by(*ENTITY_ORDERINGS.get(order, ENTITY_ORDERINGS["degree"])).defer("embedding")


def entity_types_in(*, workspace: Workspace) -> list[str]:
    rows = Entity.objects.filter(workspace=workspace).exclude(type="").order_by().values("type").annotate(n=Count("*"))
    return [row["type"] for row in rows.order_by("-n", "type")]


def relations_of_entity(*, entity: Entity) -> list[Relation]:
    """The entity's relations, strongest first, each with `other` (the entity at the far end)."""
    relations = list(
        Relation.objects.filter(Q(source=entity) | Q(target=entity))
        .select_related("source", "target")
        .defer("embedding", "source__embedding", "target__embedding")
        .order_by("-weight", "pk")
    )
    for relation in relations:
        relation.other = relation.target if relation.source_id == entity.pk else relation.source
    return relations


def entity_provenance(*, entity: Entity) -> QuerySet[EntitySource]:
    return (
        EntitySource.objects.filter(entity=entity)
        .select_related("chunk__document")
        .defer("chunk__embedding", "chunk__document__text")
        .order_by("chunk__document__title", "chunk__document_id", "chunk__order")
    )


def graph_top(*, workspace: Workspace, limit: int) -> dict:
    """The `limit` best-connected entities and the relations among them, shaped for Cytoscape."""
    top = list(
        Entity.objects.filter(workspace=workspace)
        .annotate(degree=_degree_of("pk"))
        .order_by("-degree", "name", "pk")
        .values("pk", "name", "type", "degree")[:limit]
    )
    ids = [row["pk"] for row in top]
    edges = Relation.objects.filter(workspace=workspace, source__in=ids, target__in=ids).values(
        "pk", "source_id", "target_id", "weight", "keywords"
    )
    return {
        "nodes": [
            {"id": str(row["pk"]), "label": row["name"], "type": row["type"], "degree": row["degree"]} for row in top
        ],
        "edges": [
            {
                "id": f"r{row['pk']}",
                "source": str(row["source_id"]),
                "target": str(row["target_id"]),
                "weight": row["weight"],
                "keywords": row["keywords"],
            }
            for row in edges
        ],
    }
