"""Reads. Every function that reaches user data starts from a workspace the caller may see."""

import uuid

from django.contrib.postgres.expressions import ArraySubquery
from django.db.models import Count, F, Func, IntegerField, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Coalesce
from django.http import Http404
from django.utils import timezone

from knowledge.models import (
    ROLE_RANK,
    Answer,
    Document,
    Entity,
    EntitySource,
    GraphRebuild,
    ModelChoice,
    ModelEndpoint,
    Reembedding,
    Relation,
    Role,
    Source,
    Workspace,
)
from knowledge.rag.graph.drawing import graph_edge, graph_node
from knowledge.rag.retrieval.searches import degree_of


def roles_at_least(min_role: str) -> list[str]:
    return [role for role, rank in ROLE_RANK.items() if rank >= ROLE_RANK[min_role]]


def workspaces_for_user(user) -> QuerySet[Workspace]:
    """The workspaces a user belongs to, each annotated with the user's `role`."""
    if not user.is_authenticated:
        return Workspace.objects.none()
    return Workspace.objects.filter(memberships__user=user).annotate(role=F("memberships__role"))


def _tags_of(workspace) -> ArraySubquery:
    """The tags of a workspace's current documents, sorted: what its questions can be scoped to."""
    tags = (
        Document.objects.current()
        .filter(workspace=workspace)
        .annotate(tag=Func(F("tags"), function="unnest"))
        .order_by("tag")
        .values("tag")
        .distinct()
    )
    return ArraySubquery(tags)


def workspaces_with_tags(user) -> QuerySet[Workspace]:
    """workspaces_for_user, each with `tags`, the tags its questions can be scoped to (one query)."""
    return workspaces_for_user(user).annotate(tags=_tags_of(OuterRef("pk")))


def document_tags(*, workspace: Workspace) -> list[str]:
    """The tags of the workspace's current documents, sorted."""
    return (
        Workspace.objects.filter(pk=workspace.pk)
        .annotate(tags=_tags_of(OuterRef("pk")))
        .values_list("tags", flat=True)
        .get()
    )


def documents_for_picking(*, workspace: Workspace) -> QuerySet[Document]:
    """The workspace's current documents as a scope picker lists them: id, title, tags, enabled."""
    return workspace.documents.current().order_by("title", "pk").only("pk", "title", "tags", "enabled")


def sources_of(*, workspace: Workspace) -> QuerySet[Source]:
    """The workspace's sources, each with `document_count` (its current documents)."""
    current = Q(documents__superseded_by__isnull=True, documents__isnull=False)
    return workspace.sources.annotate(document_count=Count("documents", filter=current)).order_by("name")


def source_documents(*, source: Source) -> QuerySet[Document]:
    """The documents a source brought, missing ones first (they are about to go), then by key."""
    return (
        source.documents.current()
        .defer("text", "structure")
        .order_by(F("source_missing_since").desc(nulls_last=True), "source_key", "version")
    )


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
    entities = Entity.objects.published().filter(workspace=workspace)
    if query:
        entities = entities.filter(Q(name__icontains=query) | Q(aliases__name__icontains=query)).distinct()
    if type:
        entities = entities.filter(type=type)
    entities = entities.annotate(degree=degree_of(), document_count=_document_count())
    return entities.order_by(*ENTITY_ORDERINGS.get(order, ENTITY_ORDERINGS["degree"])).defer("embedding")


def documents_browse(*, workspace: Workspace, status: str = "", query: str = "") -> QuerySet[Document]:
    """The workspace's documents for the document list, newest first, optionally of one status
    and with a title or file name containing `query`."""
    documents = workspace.documents.current().defer("text")
    if status:
        documents = documents.filter(status=status)
    if query:
        documents = documents.filter(Q(title__icontains=query) | Q(original_filename__icontains=query))
    return documents


def document_status_counts(*, workspace: Workspace) -> dict[str, int]:
    return dict(workspace.documents.current().order_by().values_list("status").annotate(n=Count("*")))


def entity_type_counts(*, workspace: Workspace) -> list[tuple[str, int]]:
    """The workspace's entity types with how many entities have each, most frequent first."""
    rows = (
        Entity.objects.published()
        .filter(workspace=workspace)
        .exclude(type="")
        .order_by()
        .values("type")
        .annotate(n=Count("*"))
    )
    return [(row["type"], row["n"]) for row in rows.order_by("-n", "type")]


def relations_of_entity(*, entity: Entity) -> list[Relation]:
    """The entity's relations, strongest first, each with `other` (the entity at the far end)."""
    relations = list(
        Relation.objects.published()
        .filter(Q(source=entity) | Q(target=entity))
        .select_related("source", "target")
        .defer("embedding", "source__embedding", "target__embedding")
        .order_by("-weight", "pk")
    )
    for relation in relations:
        relation.other = relation.target if relation.source_id == entity.pk else relation.source
    return relations


def entity_provenance(*, entity: Entity) -> QuerySet[EntitySource]:
    return (
        EntitySource.objects.filter(entity=entity, chunk__document__status=Document.Status.PROCESSED)
        .select_related("chunk__document")
        .defer("chunk__embedding", "chunk__document__text")
        .order_by("chunk__document__title", "chunk__document_id", "chunk__order")
    )


def graph_top(*, workspace: Workspace, limit: int) -> dict:
    """The `limit` best-connected entities and the relations among them, shaped for Cytoscape."""
    top = list(
        Entity.objects.published()
        .filter(workspace=workspace)
        .annotate(degree=degree_of())
        .order_by("-degree", "name", "pk")
        .values("pk", "name", "type", "degree")[:limit]
    )
    ids = [row["pk"] for row in top]
    edges = (
        Relation.objects.published()
        .filter(workspace=workspace, source__in=ids, target__in=ids)
        .values("pk", "source_id", "target_id", "weight", "keywords")
    )
    return {
        "nodes": [graph_node(pk=row["pk"], name=row["name"], type=row["type"], degree=row["degree"]) for row in top],
        "edges": [
            graph_edge(
                pk=row["pk"],
                source_id=row["source_id"],
                target_id=row["target_id"],
                weight=row["weight"],
                keywords=row["keywords"],
            )
            for row in edges
        ],
    }


def answer_for_user(user, answer_id: object, *, slug: str | None = None) -> Answer | None:
    """An answer this user asked (through an API), in a workspace they still belong to; None for
    anything else, so an id of someone else's answer tells nothing."""
    try:
        key = uuid.UUID(str(answer_id))
    except ValueError:
        return None
    answers = Answer.objects.filter(uuid=key, user=user, workspace__in=workspaces_for_user(user).values("pk"))
    if slug is not None:
        answers = answers.filter(workspace__slug=slug)
    return answers.select_related("workspace").first()


def model_endpoints() -> list[ModelEndpoint]:
    """The model endpoints connected on the Models page (installation-wide; only staff see them)."""
    return list(ModelEndpoint.objects.all())


def model_choices() -> dict[str, ModelChoice]:
    """The models picked on the Models page, by purpose (chat, embedding); missing means the environment's."""
    return {choice.purpose: choice for choice in ModelChoice.objects.select_related("endpoint")}


def latest_reembedding() -> Reembedding | None:
    return Reembedding.objects.first()


def documents_by_status_and_stage() -> list[tuple[str, str, int]]:
    """Installation-wide, for the operators' metrics: how many documents in each status and stage."""
    rows = Document.objects.order_by().values_list("status", "stage").annotate(count=Count("id"))
    return sorted(rows)


def ingestion_backlog() -> dict[str, int]:
    """Installation-wide, for the operators' metrics: documents not yet processed that no live run
    holds (waiting for a worker, or for their backoff to end), and graph rebuilds still to do."""
    now = timezone.now()
    waiting = (
        Document.objects.filter(status__in=[Document.Status.PENDING, Document.Status.PROCESSING])
        .exclude(stage=Document.Stage.DONE)
        .filter(Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        .count()
    )
    return {"documents": waiting, "graph_rebuilds": GraphRebuild.objects.count()}
