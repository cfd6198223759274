"""Entities and relations recomputed from their provenance, written only if nobody changed it meanwhile.

What a published row serves comes from the provenance of published documents only. A document's
build (`document_id`) computes its rows from that provenance and its own, and stages the result
for its publishing transaction (knowledge.rag.graph.staging) instead of writing it onto rows
that are served.
"""

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field

from django.db import OperationalError, transaction
from psycopg.errors import DeadlockDetected

from knowledge.models import Entity, EntitySource, Relation, RelationSource
from knowledge.rag import llm
from knowledge.rag.extraction.records import keyword_union
from knowledge.rag.graph.describe import (
    Described,
    Folded,
    Summarized,
    describe,
)
from knowledge.rag.graph.embedding import entity_text, entity_vectors, relation_text, relation_vectors
from knowledge.rag.graph.locks import lock_entity_keys, lock_relations
from knowledge.rag.graph.provenance import (
    fingerprints,
    fingerprints_of,
    fold_fingerprint,
    folding_epoch,
    provenance_epoch,
    source_rows,
    unfolded_rows,
)
from knowledge.rag.graph.staging import stage_rows
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


def rebuild_entities(
    *,
    entity_ids: Iterable[int],
    usage: llm.Usage | None = None,
    fallback: bool = False,
    document_id: int | None = None,
) -> RebuildResult:
    """Recompute type (majority vote), display name and description of each entity from its provenance.

    Entities left without provenance are deleted (their relations with them). A published entity
    whose display name changed is embedded again. `fallback` keeps budgeted fragments when a
    summary call fails instead of raising. With `document_id`, the build of that unpublished
    document: published rows get their values staged for its publication, not written.
    """
    result, usage = RebuildResult(), usage if usage is not None else llm.Usage()
    for batch in _batches(entity_ids):
        _rebuild_batch(_EntityRebuild(batch, usage, fallback, document_id), result)
    return result


def rebuild_relations(
    *,
    relation_ids: Iterable[int],
    usage: llm.Usage | None = None,
    fallback: bool = False,
    document_id: int | None = None,
) -> RebuildResult:
    """Recompute weight (sum of strengths), keywords (union) and description of each relation."""
    result, usage = RebuildResult(), usage if usage is not None else llm.Usage()
    for batch in _batches(relation_ids):
        _rebuild_batch(_RelationRebuild(batch, usage, fallback, document_id), result)
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
                current = fingerprints(job.source_model, job.source_field, ids, job.document_id)
                stale = [pk for pk in ids if current.get(pk) != plan.fingerprints.get(pk)]
                if stale and last:
                    # Still racing after several tries: compute once more while holding the locks.
                    plan = job.plan(ids)
                    stale = []
                fresh = [pk for pk in ids if pk not in stale]
                job.write(plan, fresh, result)
        except (OperationalError, DeadlockDetected) as err:
            # Deleting orphans writes degree rows that a concurrent deletion may hold; Postgres
            # breaks the cycle by failing one side, which computes again. Vector writes go through
            # psycopg's own cursor, whose errors Django does not wrap.
            if last or not isinstance(err if isinstance(err, DeadlockDetected) else err.__cause__, DeadlockDetected):
                raise
            continue
        if not stale:
            return
        ids = stale


SUMMARY_FIELDS = ("summary", "summary_through", "summary_sources", "folded")


def _states(rows: dict[int, dict]) -> dict[int, Summarized]:
    return {pk: Summarized(row["summary"], row["summary_through"], row["summary_sources"]) for pk, row in rows.items()}


def _described_fields(described: Described) -> dict:
    return {
        "description": described.description,
        "summary": described.summarized.summary,
        "summary_through": described.summarized.through,
        "summary_sources": described.summarized.sources,
    }


class _Sources:
    """A batch's sources, read in full or, for rows whose folded values still hold, only those
    not folded yet.

    A document's build only adds sources, so on a published row it starts from what the row's
    `folded` says it counts (the last source id and how many; the tallies of types and
    spellings; the description), if nothing but publications changed the workspace's provenance
    since (knowledge.rag.graph.provenance), and reads only the published sources after it and
    its own. A hub mentioned by every document is then read once per document for what that
    document adds, not for everything every document said. Deletions, merges and edits rebuild
    from all sources (document_id is None) and fold again.
    """

    def __init__(self, job, rows: dict[int, dict], columns: tuple[str, ...]):
        # Read before the sources: a change after it makes the folds written here count as old.
        epoch = folding_epoch(job.document_id)
        if epoch is None:
            workspace_id = next((row["workspace_id"] for row in rows.values()), None)
            self.epoch = provenance_epoch(workspace_id) if workspace_id is not None else 0
        else:
            self.epoch = epoch
        self.fingerprints = {}
        summarizes = llm.chat_model_configured()
        for pk, row in rows.items():
            fingerprint = fold_fingerprint(row["folded"], row["published"], epoch, summarizes)
            if fingerprint is not None:
                self.fingerprints[pk] = fingerprint
        self.folded = {pk: rows[pk]["folded"] for pk in self.fingerprints}
        # The other rows are read whole, and fingerprinted from what is read.
        whole = [pk for pk in rows if pk not in self.folded]
        self.rows = source_rows(job.source_model, job.source_field, whole, columns, job.document_id) if whole else {}
        self.fingerprints.update(fingerprints_of(self.rows))
        self.rows.update(
            unfolded_rows(
                job.source_model,
                job.source_field,
                {pk: folded["through"] for pk, folded in self.folded.items()},
                columns,
                job.document_id,
            )
        )

    def described(self, rows: dict[int, dict]) -> dict[int, Folded]:
        return {
            pk: Folded(rows[pk]["description"], folded["cut"], folded["through"], folded["count"])
            for pk, folded in self.folded.items()
        }

    def fold(self, pk: int, described: Described, **tallies) -> dict:
        """The row's new `folded`: what it counts now, and the epoch it was read at."""
        before = self.folded.get(pk, {"through": 0, "count": 0})
        found = [row[0] for row in self.rows.get(pk, [])]
        return {
            "epoch": self.epoch,
            "through": max([before["through"], *found]),
            "count": before["count"] + len(found),
            "cut": described.cut,
            **tallies,
        }


@dataclass
class _Plan:
    fingerprints: dict[int, tuple]
    found: list[int]
    updates: dict[int, dict]
    orphans: list[int]
    workspace_keys: dict[int, set[str]] = field(default_factory=dict)
    # Every live row's values (without its vector) and which were published, for staging.
    values: dict[int, dict] = field(default_factory=dict)
    published: set[int] = field(default_factory=set)


class _EntityRebuild:
    source_model, source_field = EntitySource, "entity_id"

    def __init__(self, ids, usage, fallback, document_id):
        self.ids, self.usage, self.fallback, self.document_id = ids, usage, fallback, document_id

    def plan(self, ids: list[int]) -> _Plan:
        rows = {
            row["pk"]: row
            for row in Entity.objects.filter(pk__in=ids).values(
                "pk", "workspace_id", "key", "name", "type", "description", "published", *SUMMARY_FIELDS
            )
        }
        sources = _Sources(self, rows, ("name", "type", "description"))
        types = {pk: Counter(folded["types"]) for pk, folded in sources.folded.items()}
        spellings = {pk: Counter(folded["names"]) for pk, folded in sources.folded.items()}
        descriptions: dict[int, list[tuple[int, str]]] = {}
        for entity_id, found in sources.rows.items():
            for source_id, name, kind, description in found:
                if kind:
                    types.setdefault(entity_id, Counter())[kind] += 1
                spellings.setdefault(entity_id, Counter())[name] += 1
                descriptions.setdefault(entity_id, []).append((source_id, description))
        fingerprints = sources.fingerprints
        alive = {pk: row for pk, row in rows.items() if pk in fingerprints}
        # The display name stays while some source still spells it so (a curated survivor keeps its
        # name); otherwise the most common spelling among the remaining sources takes over.
        names = {
            pk: row["name"] if row["name"] in spellings[pk] else spellings[pk].most_common(1)[0][0]
            for pk, row in alive.items()
        }
        merged = describe(
            "entity", names, descriptions, _states(alive), self.usage, self.fallback, sources.described(rows)
        )
        # Published rows whose name changed get a new vector now; unpublished ones get theirs when
        # their document is staged for publishing (knowledge.services.ingestion).
        renamed = [
            pk for pk, row in alive.items() if row["published"] and entity_text(names[pk]) != entity_text(row["name"])
        ]
        vectors = dict(zip(renamed, entity_vectors([names[pk] for pk in renamed]), strict=True))
        updates, values = {}, {}
        for pk, row in alive.items():
            fields = {
                "name": names[pk],
                "type": types[pk].most_common(1)[0][0] if types.get(pk) else row["type"],
                **_described_fields(merged[pk]),
                "folded": sources.fold(pk, merged[pk], types=dict(types.get(pk, {})), names=dict(spellings[pk])),
            }
            values[pk] = dict(fields)
            if pk in vectors:
                fields["embedding"] = vectors[pk]
            if any(row[name] != value for name, value in fields.items() if name != "embedding") or pk in vectors:
                updates[pk] = fields
        workspace_keys: dict[int, set[str]] = {}
        for row in rows.values():
            workspace_keys.setdefault(row["workspace_id"], set()).add(row["key"])
        orphans = [pk for pk in rows if pk not in fingerprints]
        published = {pk for pk, row in alive.items() if row["published"]}
        return _Plan(fingerprints, list(rows), updates, orphans, workspace_keys, values, published)

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
        _write(Entity, plan, ids, result, self.document_id)


class _RelationRebuild:
    source_model, source_field = RelationSource, "relation_id"

    def __init__(self, ids, usage, fallback, document_id):
        self.ids, self.usage, self.fallback, self.document_id = ids, usage, fallback, document_id

    def plan(self, ids: list[int]) -> _Plan:
        rows = {
            row["pk"]: row
            for row in Relation.objects.filter(pk__in=ids).values(
                "pk",
                "workspace_id",
                "keywords",
                "description",
                "weight",
                "published",
                "source__name",
                "target__name",
                *SUMMARY_FIELDS,
            )
        }
        sources = _Sources(self, rows, ("strength", "keywords", "description"))
        weights = {pk: rows[pk]["weight"] for pk in sources.folded}
        keywords = {pk: [rows[pk]["keywords"]] for pk in sources.folded}
        descriptions: dict[int, list[tuple[int, str]]] = {}
        for relation_id, found in sources.rows.items():
            for source_id, strength, words, description in found:
                weights[relation_id] = weights.get(relation_id, 0.0) + strength
                keywords.setdefault(relation_id, []).append(words)
                descriptions.setdefault(relation_id, []).append((source_id, description))
        fingerprints = sources.fingerprints
        alive = {pk: row for pk, row in rows.items() if pk in fingerprints}
        merged = describe(
            "relationship",
            {pk: f"{row['source__name']} and {row['target__name']}" for pk, row in alive.items()},
            descriptions,
            _states(alive),
            self.usage,
            self.fallback,
            sources.described(rows),
        )
        new_keywords = {pk: keyword_union(keywords[pk]) for pk in alive}
        # Endpoint names do not change here (renaming or merging an endpoint re-embeds its
        # relations: knowledge.services.curation); the first keywords may.
        moved = [
            pk
            for pk, row in alive.items()
            if row["published"]
            and relation_text(row["source__name"], row["target__name"], new_keywords[pk])
            != relation_text(row["source__name"], row["target__name"], row["keywords"])
        ]
        vectors = dict(
            zip(
                moved,
                relation_vectors(
                    [(alive[pk]["source__name"], alive[pk]["target__name"], new_keywords[pk]) for pk in moved]
                ),
                strict=True,
            )
        )
        updates, values = {}, {}
        for pk, row in alive.items():
            fields = {
                "keywords": new_keywords[pk],
                "weight": weights[pk],
                **_described_fields(merged[pk]),
                "folded": sources.fold(pk, merged[pk]),
            }
            values[pk] = dict(fields)
            if pk in vectors:
                fields["embedding"] = vectors[pk]
            if any(row[name] != value for name, value in fields.items() if name != "embedding") or pk in vectors:
                updates[pk] = fields
        orphans = [pk for pk in rows if pk not in fingerprints]
        published = {pk for pk, row in alive.items() if row["published"]}
        return _Plan(fingerprints, list(rows), updates, orphans, {}, values, published)

    def lock(self, plan: _Plan) -> None:
        lock_relations(relation_ids=plan.found)

    def write(self, plan: _Plan, ids: list[int], result: RebuildResult) -> None:
        ids_set = set(ids)
        orphans = [pk for pk in plan.orphans if pk in ids_set]
        if orphans:
            result.deleted += Relation.objects.filter(pk__in=orphans, sources__isnull=True).delete()[0]
        _write(Relation, plan, ids, result, self.document_id)


def _write(model, plan: _Plan, ids: list[int], result: RebuildResult, document_id: int | None) -> None:
    """Write the fresh rows' new values; for a document's build, stage them for its publication
    instead, except on rows nobody is served yet (their vectors are staged by the build)."""
    updates = {pk: plan.updates[pk] for pk in ids if pk in plan.updates}
    if document_id is not None:
        served = {pk: fields for pk, fields in updates.items() if pk in plan.published}
        stage_rows(
            document_id=document_id,
            model=model,
            rows={pk: (plan.values[pk], plan.fingerprints[pk]) for pk in ids if pk in plan.values},
            vectors={pk: fields["embedding"] for pk, fields in served.items() if "embedding" in fields},
        )
        updates = {pk: values for pk, values in updates.items() if pk not in plan.published}
    update_rows(model, updates)
    result.updated += len(updates)
    result.embedded += sum("embedding" in values for values in updates.values())
