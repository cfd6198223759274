"""Entities and relations recomputed from their provenance, written only if nobody changed it meanwhile."""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import OperationalError, transaction
from django.db.models import Count, Max, Min
from psycopg.errors import DeadlockDetected

from knowledge.models import Entity, EntitySource, Relation, RelationSource
from knowledge.rag import llm
from knowledge.rag.extraction.records import keyword_union
from knowledge.rag.graph.describe import (
    Described,
    Summarized,
    describe,
    embed_changed,
    entity_embedding_text,
    relation_embedding_text,
)
from knowledge.rag.graph.locks import lock_entity_keys, lock_relations
from knowledge.rag.graph.vectors import update_rows

REBUILD_BATCH = 100
REBUILD_ATTEMPTS = 3


@dataclass
class RebuildResult:
    updated: int = 0
    deleted: int = 0
    embedded: int = 0


def _batches(ids: Iterable[int]) -> list[list[int]]:
    ordered = sorted(set(ids))
    return [ordered[i : i + REBUILD_BATCH] for i in range(0, len(ordered), REBUILD_BATCH)]


def _sources(model, field: str, ids: list[int], without_document: int | None):
    rows = model.objects.filter(**{f"{field}__in": ids})
    return rows if without_document is None else rows.exclude(chunk__document_id=without_document)


def _fingerprints(model, field: str, ids: list[int], without_document: int | None = None) -> dict[int, tuple]:
    rows = (
        _sources(model, field, ids, without_document)
        .values(field)
        .annotate(n=Count("id"), low=Min("id"), high=Max("id"))
        .values_list(field, "n", "low", "high")
    )
    return {row[0]: row[1:] for row in rows}


def rebuild_entities(
    *,
    entity_ids: Iterable[int],
    usage: llm.Usage | None = None,
    fallback: bool = False,
    without_document: int | None = None,
) -> RebuildResult:
    """Recompute type (majority vote), display name and description of each entity from its provenance.

    Entities left without provenance are deleted (their relations with them). A published entity
    whose display name changed is embedded again. `fallback` keeps budgeted fragments when a
    summary call fails instead of raising. `without_document` leaves that document's provenance
    out (a version about to be retired): rows only it supports are left as they are.
    """
    result, usage = RebuildResult(), usage if usage is not None else llm.Usage()
    for batch in _batches(entity_ids):
        _rebuild_batch(_EntityRebuild(batch, usage, fallback, without_document), result)
    return result


def rebuild_relations(
    *,
    relation_ids: Iterable[int],
    usage: llm.Usage | None = None,
    fallback: bool = False,
    without_document: int | None = None,
) -> RebuildResult:
    """Recompute weight (sum of strengths), keywords (union) and description of each relation."""
    result, usage = RebuildResult(), usage if usage is not None else llm.Usage()
    for batch in _batches(relation_ids):
        _rebuild_batch(_RelationRebuild(batch, usage, fallback, without_document), result)
    return result


def _rebuild_batch(job, result: RebuildResult) -> None:
    ids = job.ids
    for attempt in range(REBUILD_ATTEMPTS):
        plan = job.plan(ids)
        if not plan.found:
            return
        last = attempt + 1 == REBUILD_ATTEMPTS
        try:
            with transaction.atomic():
                job.lock(plan)
                current = _fingerprints(job.source_model, job.source_field, ids, job.without_document)
                stale = [pk for pk in ids if current.get(pk) != plan.fingerprints.get(pk)]
                if stale and last:
                    # Still racing after several tries: compute once more while holding the locks.
                    plan = job.plan(ids)
                    stale = []
                fresh = [pk for pk in ids if pk not in stale]
                job.write(plan, fresh, result)
        except OperationalError as err:
            # Deleting orphans writes degree rows that a concurrent deletion may hold; Postgres
            # breaks the cycle by failing one side, which computes again.
            if last or not isinstance(err.__cause__, DeadlockDetected):
                raise
            continue
        if not stale:
            return
        ids = stale


SUMMARY_FIELDS = ("summary", "summary_through", "summary_sources")


def _states(rows: dict[int, dict]) -> dict[int, Summarized]:
    return {pk: Summarized(row["summary"], row["summary_through"], row["summary_sources"]) for pk, row in rows.items()}


def _described_fields(described: Described) -> dict:
    return {
        "description": described.description,
        "summary": described.summarized.summary,
        "summary_through": described.summarized.through,
        "summary_sources": described.summarized.sources,
    }


@dataclass
class _Plan:
    fingerprints: dict[int, tuple]
    found: list[int]
    updates: dict[int, dict]
    orphans: list[int]
    workspace_keys: dict[int, set[str]] = field(default_factory=dict)


class _EntityRebuild:
    source_model, source_field = EntitySource, "entity_id"

    def __init__(self, ids, usage, fallback, without_document):
        self.ids, self.usage, self.fallback, self.without_document = ids, usage, fallback, without_document

    def plan(self, ids: list[int]) -> _Plan:
        rows = {
            row["pk"]: row
            for row in Entity.objects.filter(pk__in=ids).values(
                "pk", "workspace_id", "key", "name", "type", "description", "published", *SUMMARY_FIELDS
            )
        }
        types: dict[int, Counter] = {}
        spellings: dict[int, Counter] = {}
        descriptions: dict[int, list[tuple[int, str]]] = {}
        for source_id, entity_id, name, kind, description in (
            _sources(EntitySource, "entity_id", ids, self.without_document)
            .order_by("id")
            .values_list("id", "entity_id", "name", "type", "description")
        ):
            if kind:
                types.setdefault(entity_id, Counter())[kind] += 1
            spellings.setdefault(entity_id, Counter())[name] += 1
            descriptions.setdefault(entity_id, []).append((source_id, description))
        fingerprints = _fingerprints(EntitySource, "entity_id", ids, self.without_document)
        alive = {pk: row for pk, row in rows.items() if pk in fingerprints}
        # The display name stays while some source still spells it so (a curated survivor keeps its
        # name); otherwise the most common spelling among the remaining sources takes over.
        names = {
            pk: row["name"] if row["name"] in spellings[pk] else spellings[pk].most_common(1)[0][0]
            for pk, row in alive.items()
        }
        merged = describe("entity", names, descriptions, _states(alive), self.usage, self.fallback)
        vectors = embed_changed(
            {
                pk: (
                    entity_embedding_text(row["name"], row["description"]),
                    entity_embedding_text(names[pk], merged[pk].description),
                    row["published"],
                )
                for pk, row in alive.items()
            }
        )
        updates = {}
        for pk, row in alive.items():
            fields = {
                "name": names[pk],
                "type": types[pk].most_common(1)[0][0] if pk in types else row["type"],
                **_described_fields(merged[pk]),
            }
            if pk in vectors:
                fields["embedding"] = vectors[pk]
            if any(row[name] != value for name, value in fields.items() if name != "embedding") or pk in vectors:
                updates[pk] = fields
        workspace_keys: dict[int, set[str]] = {}
        for row in rows.values():
            workspace_keys.setdefault(row["workspace_id"], set()).add(row["key"])
        orphans = [pk for pk in rows if pk not in fingerprints]
        return _Plan(fingerprints, list(rows), updates, orphans, workspace_keys)

    def lock(self, plan: _Plan) -> None:
        for workspace_id, keys in plan.workspace_keys.items():
            lock_entity_keys(workspace_id=workspace_id, keys=keys)

    def write(self, plan: _Plan, ids: list[int], result: RebuildResult) -> None:
        ids_set = set(ids)
        orphans = [pk for pk in plan.orphans if pk in ids_set]
        if orphans:
            result.deleted += (
                Entity.objects.filter(pk__in=orphans, sources__isnull=True).delete()[1].get("knowledge.Entity", 0)
            )
        _write_updates(Entity, {pk: plan.updates[pk] for pk in ids if pk in plan.updates}, result)


class _RelationRebuild:
    source_model, source_field = RelationSource, "relation_id"

    def __init__(self, ids, usage, fallback, without_document):
        self.ids, self.usage, self.fallback, self.without_document = ids, usage, fallback, without_document

    def plan(self, ids: list[int]) -> _Plan:
        rows = {
            row["pk"]: row
            for row in Relation.objects.filter(pk__in=ids).values(
                "pk",
                "keywords",
                "description",
                "weight",
                "published",
                "source__name",
                "target__name",
                *SUMMARY_FIELDS,
            )
        }
        weights: dict[int, float] = {}
        keywords: dict[int, list[str]] = {}
        descriptions: dict[int, list[tuple[int, str]]] = {}
        for source_id, relation_id, strength, words, description in (
            _sources(RelationSource, "relation_id", ids, self.without_document)
            .order_by("id")
            .values_list("id", "relation_id", "strength", "keywords", "description")
        ):
            weights[relation_id] = weights.get(relation_id, 0.0) + strength
            keywords.setdefault(relation_id, []).append(words)
            descriptions.setdefault(relation_id, []).append((source_id, description))
        fingerprints = _fingerprints(RelationSource, "relation_id", ids, self.without_document)
        alive = {pk: row for pk, row in rows.items() if pk in fingerprints}
        merged = describe(
            "relationship",
            {pk: f"{row['source__name']} and {row['target__name']}" for pk, row in alive.items()},
            descriptions,
            _states(alive),
            self.usage,
            self.fallback,
        )
        new_keywords = {pk: keyword_union(keywords[pk]) for pk in alive}
        # Endpoint names do not change here (renaming or merging an endpoint re-embeds its
        # relations: knowledge.services.curation); the first keywords and the description's first line may.
        vectors = embed_changed(
            {
                pk: (
                    relation_embedding_text(
                        row["source__name"], row["target__name"], row["keywords"], row["description"]
                    ),
                    relation_embedding_text(
                        row["source__name"], row["target__name"], new_keywords[pk], merged[pk].description
                    ),
                    row["published"],
                )
                for pk, row in alive.items()
            }
        )
        updates = {}
        for pk, row in alive.items():
            fields = {"keywords": new_keywords[pk], "weight": weights[pk], **_described_fields(merged[pk])}
            if pk in vectors:
                fields["embedding"] = vectors[pk]
            if any(row[name] != value for name, value in fields.items() if name != "embedding") or pk in vectors:
                updates[pk] = fields
        return _Plan(fingerprints, list(rows), updates, [pk for pk in rows if pk not in fingerprints])

    def lock(self, plan: _Plan) -> None:
        lock_relations(relation_ids=plan.found)

    def write(self, plan: _Plan, ids: list[int], result: RebuildResult) -> None:
        ids_set = set(ids)
        orphans = [pk for pk in plan.orphans if pk in ids_set]
        if orphans:
            result.deleted += Relation.objects.filter(pk__in=orphans, sources__isnull=True).delete()[0]
        _write_updates(Relation, {pk: plan.updates[pk] for pk in ids if pk in plan.updates}, result)


def _write_updates(model, updates: dict[int, dict], result: RebuildResult) -> None:
    update_rows(model, updates)
    result.updated += len(updates)
    result.embedded += sum("embedding" in values for values in updates.values())
