"""The graph: merging chunk records into entities and relations, and rebuilding them from provenance.

Merging is additive and cheap: per batch of chunks, one transaction upserts entities and
relations (INSERT ... ON CONFLICT) and inserts provenance rows. Descriptions, types, weights,
keywords and vectors are then rebuilt from provenance (`rebuild_entities`,
`rebuild_relations`), once per document for everything it touched, and again after a
deletion or a curation merge. Rebuilding from provenance is what makes deletion exact.

Concurrency: every write to an entity key (and to relations, whose endpoints are keys) holds a
transaction-scoped advisory lock on that key, taken in sorted order. A rebuild computes
outside the lock (summaries and embeddings can be slow) and writes under it only if the
provenance it read is still what is there; otherwise it computes again.
"""

import functools
import hashlib
import logging
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import psycopg
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Count, Max, Min
from django.utils import timezone
from pgvector.psycopg.vector import register_vector_info
from psycopg.types import TypeInfo

from knowledge import llm, prompts
from knowledge.extraction import EntityMention, RelationMention, consolidate, entity_key
from knowledge.models import Chunk, Entity, EntityAlias, EntitySource, Relation, RelationSource

logger = logging.getLogger(__name__)

__all__ = ["entity_key", "lock_entity_keys", "merge_chunks", "rebuild_entities", "rebuild_relations"]

REBUILD_BATCH = 500
REBUILD_ATTEMPTS = 3
# Room in the model's context for the prompt's own words and the answer.
SUMMARY_PROMPT_OVERHEAD = 600


def _lock_id(workspace_id: int, key: str) -> int:
    digest = hashlib.blake2b(f"{workspace_id}:{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def lock_entity_keys(*, workspace_id: int, keys: Iterable[str]) -> None:
    """Hold, until the transaction ends, a lock on each key (sorted, so two holders cannot deadlock)."""
    if not connection.in_atomic_block:
        raise RuntimeError("lock_entity_keys() only makes sense inside transaction.atomic()")
    ids = sorted({_lock_id(workspace_id, key) for key in keys})
    if ids:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k", [ids])


# ---------------------------------------------------------------------------------------
# Merge


@dataclass
class MergeResult:
    entity_ids: set[int]
    relation_ids: set[int]


def _aliases(workspace_id: int, keys: Iterable[str]) -> dict[str, tuple[int, str]]:
    rows = EntityAlias.objects.filter(workspace_id=workspace_id, key__in=list(keys)).values_list(
        "key", "entity_id", "entity__key"
    )
    return {key: (entity_id, survivor_key) for key, entity_id, survivor_key in rows}


def merge_chunks(*, workspace_id: int, records_by_chunk: dict[int, dict]) -> MergeResult:
    """Add the chunks' records to the graph: upsert entities and relations, insert provenance.

    Idempotent (a chunk merged twice adds nothing) and a handful of queries per call, whatever
    the number of chunks. Names merged away by curation resolve to the surviving entity.
    """
    mentions = {chunk_id: consolidate(records) for chunk_id, records in records_by_chunk.items()}
    first_mention: dict[str, EntityMention] = {}
    for entities, _ in mentions.values():
        for key, mention in entities.items():
            first_mention.setdefault(key, mention)
    if not first_mention:
        return MergeResult(set(), set())
    keys = set(first_mention)
    with transaction.atomic():
        aliases = _aliases(workspace_id, keys)
        lock_entity_keys(workspace_id=workspace_id, keys=keys | {survivor for _, survivor in aliases.values()})
        # A curation merge may have committed while we waited for the lock.
        fresh = _aliases(workspace_id, keys)
        late = {survivor for _, survivor in fresh.values()} - {survivor for _, survivor in aliases.values()}
        if late:
            lock_entity_keys(workspace_id=workspace_id, keys=late)
        entity_id_of = {key: entity_id for key, (entity_id, _) in fresh.items()}
        # Existing rows are read, not upserted: an UPDATE would write a new row version and,
        # since the vector column is indexed, a new HNSW entry for an unchanged vector.
        entity_id_of.update(
            Entity.objects.filter(workspace_id=workspace_id, key__in=keys - set(entity_id_of)).values_list("key", "pk")
        )
        now = timezone.now()
        # Every key is locked, so nobody else can insert these between the read and the insert.
        created = Entity.objects.bulk_create(
            [
                Entity(
                    workspace_id=workspace_id,
                    key=key,
                    name=mention.name[:300],
                    type=mention.type[:80],
                    description=mention.description,
                    created_at=now,
                    updated_at=now,
                )
                for key, mention in first_mention.items()
                if key not in entity_id_of
            ],
            batch_size=1000,
        )
        entity_id_of.update({entity.key: entity.pk for entity in created})
        _add_entity_sources(mentions, entity_id_of)
        relation_ids = _merge_relations(workspace_id, mentions, entity_id_of, now)
    return MergeResult(set(entity_id_of.values()), relation_ids)


def _add_entity_sources(mentions: dict, entity_id_of: dict[str, int]) -> None:
    sources: dict[tuple[int, int], EntitySource] = {}
    for chunk_id, (entities, _) in mentions.items():
        for key, mention in entities.items():
            pair = (entity_id_of[key], chunk_id)
            existing = sources.get(pair)
            if existing is not None:  # two names of one chunk that curation merged into one entity
                existing.description = "\n".join(filter(None, [existing.description, mention.description]))
                continue
            sources[pair] = EntitySource(
                entity_id=pair[0],
                chunk_id=chunk_id,
                name=mention.name[:300],
                type=mention.type[:80],
                description=mention.description,
            )
    EntitySource.objects.bulk_create(sources.values(), ignore_conflicts=True, batch_size=2000)


def _merge_relations(workspace_id: int, mentions: dict, entity_id_of: dict[str, int], now) -> set[int]:
    per_chunk: dict[tuple[int, int], list[RelationMention]] = {}
    for chunk_id, (_, relations) in mentions.items():
        for (first, second), mention in relations.items():
            a, b = entity_id_of[first], entity_id_of[second]
            if a != b:
                per_chunk.setdefault((chunk_id, *sorted((a, b))), []).append(mention)
    if not per_chunk:
        return set()
    pairs = sorted({(a, b) for _, a, b in per_chunk})
    relation_id_of = _relation_ids(workspace_id, pairs)
    created = Relation.objects.bulk_create(
        [
            Relation(workspace_id=workspace_id, source_id=a, target_id=b, created_at=now, updated_at=now)
            for a, b in pairs
            if (a, b) not in relation_id_of
        ],
        batch_size=1000,
    )
    relation_id_of.update({(relation.source_id, relation.target_id): relation.pk for relation in created})
    sources = []
    for (chunk_id, a, b), parts in per_chunk.items():
        sources.append(
            RelationSource(
                relation_id=relation_id_of[(a, b)],
                chunk_id=chunk_id,
                keywords=_keyword_union(part.keywords for part in parts),
                description="\n".join(dict.fromkeys(part.description for part in parts if part.description)),
                strength=sum(part.strength for part in parts),
            )
        )
    RelationSource.objects.bulk_create(sources, ignore_conflicts=True, batch_size=2000)
    return set(relation_id_of.values())


def _relation_ids(workspace_id: int, pairs: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
    """The ids of the relations that already exist among these (source, target) pairs, in one query."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT r.source_id, r.target_id, r.id FROM knowledge_relation r "
            "JOIN unnest(%s::bigint[], %s::bigint[]) AS p(source_id, target_id) "
            "ON r.source_id = p.source_id AND r.target_id = p.target_id WHERE r.workspace_id = %s",
            [[a for a, _ in pairs], [b for _, b in pairs], workspace_id],
        )
        return {(source, target): pk for source, target, pk in cursor.fetchall()}


def _keyword_union(values: Iterable[str]) -> str:
    seen: dict[str, str] = {}
    for value in values:
        for keyword in value.split(","):
            keyword = " ".join(keyword.split())
            if keyword:
                seen.setdefault(keyword.casefold(), keyword)
    return ", ".join(seen.values())


# ---------------------------------------------------------------------------------------
# Descriptions


@functools.lru_cache(maxsize=200_000)
def _tokens(text: str) -> int:
    from knowledge.tokens import count_tokens

    return count_tokens(text)


def _fragments(descriptions: Iterable[str]) -> list[str]:
    seen: dict[str, None] = {}
    for description in descriptions:
        for line in description.split("\n"):
            line = line.strip()
            if line:
                seen.setdefault(line, None)
    return list(seen)


def _needs_summary(fragments: list[str]) -> bool:
    return len(fragments) > settings.SUMMARY_TRIGGER or sum(map(_tokens, fragments)) > settings.SUMMARY_MAX_TOKENS


def _within_budget(fragments: list[str]) -> str:
    """As many fragments as fit in SUMMARY_MAX_TOKENS, in order (the first one cut if it alone is too long)."""
    kept, used = [], 0
    for fragment in fragments:
        size = _tokens(fragment)
        if used + size > settings.SUMMARY_MAX_TOKENS:
            if not kept:
                from knowledge.tokens import decode, encode

                kept.append(decode(encode(fragment)[: settings.SUMMARY_MAX_TOKENS]))
            break
        kept.append(fragment)
        used += size
    return "\n".join(kept)


@dataclass
class _Summary:
    kind: str
    subject: str
    fragments: list[str]
    result: str = ""


def _groups(fragments: list[str], budget: int) -> list[list[str]]:
    groups, current, used = [], [], 0
    for fragment in fragments:
        size = _tokens(fragment)
        if current and used + size > budget:
            groups.append(current)
            current, used = [], 0
        current.append(fragment)
        used += size
    if current:
        groups.append(current)
    return groups


def _summarize(items: list[_Summary], usage: llm.Usage) -> None:
    """LLM summaries, map-reduced: fragments past the context are summarized in groups first."""
    budget = max(500, settings.LLM_CONTEXT_TOKENS - settings.SUMMARY_MAX_TOKENS - SUMMARY_PROMPT_OVERHEAD)
    max_words = max(30, settings.SUMMARY_MAX_TOKENS * 3 // 4)
    pending = list(items)
    while pending:
        calls, owners = [], []
        for item in pending:
            for group in _groups(item.fragments, budget):
                calls.append(
                    prompts.summary_messages(
                        subject_kind=item.kind, subject=item.subject, fragments=group, max_words=max_words
                    )
                )
                owners.append(item)
        answers = llm.complete_many(calls, kind="summary", usage=usage, temperature=0)
        errors = [answer for answer in answers if isinstance(answer, llm.LLMError)]
        if errors:
            raise errors[0]
        by_item: dict[int, list[str]] = {}
        for item, answer in zip(owners, answers, strict=True):
            by_item.setdefault(id(item), []).append(answer.strip())
        still = []
        for item in pending:
            parts = by_item[id(item)]
            if len(parts) == 1:
                item.result = parts[0]
            else:
                item.fragments = parts
                still.append(item)
        pending = still


def _describe(kind: str, subjects: dict[int, str], descriptions: dict[int, list[str]], usage, fallback) -> dict:
    """id -> merged description: fragments joined, or summarized past the trigger (no LLM: budgeted fragments)."""
    result, to_summarize = {}, []
    for pk, subject in subjects.items():
        fragments = _fragments(descriptions.get(pk, []))
        if not _needs_summary(fragments):
            result[pk] = "\n".join(fragments)
        elif llm.chat_model_configured():
            to_summarize.append((pk, _Summary(kind, subject, fragments)))
        else:
            result[pk] = _within_budget(fragments)
    if to_summarize:
        try:
            _summarize([item for _, item in to_summarize], usage)
            result.update({pk: item.result for pk, item in to_summarize})
        except llm.LLMError:
            if not fallback:
                raise
            logger.warning("summaries failed; keeping budgeted fragments for %d %ss", len(to_summarize), kind)
            result.update({pk: _within_budget(_fragments(descriptions[pk])) for pk, _ in to_summarize})
    return result


def _embed_changed(rows: dict[int, tuple[str, str, bool]]) -> dict[int, list[float]]:
    """Vectors for rows whose embedding text changed (or that have none): id -> (old, new, has_vector)."""
    changed = [pk for pk, (old, new, has_vector) in rows.items() if new != old or not has_vector]
    vectors = llm.embed([rows[pk][1] for pk in changed], purpose="passage")
    return dict(zip(changed, vectors, strict=True))


def entity_embedding_text(name: str, description: str) -> str:
    return f"{name}\n{description}".strip()


def relation_embedding_text(keywords: str, source: str, target: str, description: str) -> str:
    return f"{keywords}\n{source}\n{target}\n{description}".strip()


# ---------------------------------------------------------------------------------------
# Rebuild


@dataclass
class RebuildResult:
    updated: int = 0
    deleted: int = 0
    embedded: int = 0


def _batches(ids: Iterable[int]) -> list[list[int]]:
    ordered = sorted(set(ids))
    return [ordered[i : i + REBUILD_BATCH] for i in range(0, len(ordered), REBUILD_BATCH)]


def _fingerprints(model, field: str, ids: list[int]) -> dict[int, tuple]:
    rows = (
        model.objects.filter(**{f"{field}__in": ids})
        .values(field)
        .annotate(n=Count("id"), low=Min("id"), high=Max("id"))
        .values_list(field, "n", "low", "high")
    )
    return {row[0]: row[1:] for row in rows}


def rebuild_entities(
    *, entity_ids: Iterable[int], usage: llm.Usage | None = None, fallback: bool = False
) -> RebuildResult:
    """Recompute type (majority vote), description and vector of each entity from its provenance.

    Entities left without provenance are deleted (their relations with them). Only rows
    whose embedding text changed are re-embedded. `fallback` keeps budgeted fragments when
    a summary call fails instead of raising.
    """
    result, usage = RebuildResult(), usage if usage is not None else llm.Usage()
    for batch in _batches(entity_ids):
        _rebuild_batch(_EntityRebuild(batch, usage, fallback), result)
    return result


def rebuild_relations(
    *, relation_ids: Iterable[int], usage: llm.Usage | None = None, fallback: bool = False
) -> RebuildResult:
    """Recompute weight (sum of strengths), keywords (union), description and vector of each relation."""
    result, usage = RebuildResult(), usage if usage is not None else llm.Usage()
    for batch in _batches(relation_ids):
        _rebuild_batch(_RelationRebuild(batch, usage, fallback), result)
    return result


def _rebuild_batch(job, result: RebuildResult) -> None:
    ids = job.ids
    for attempt in range(REBUILD_ATTEMPTS):
        plan = job.plan(ids)
        with transaction.atomic():
            if not plan.workspace_keys:
                return
            for workspace_id, keys in plan.workspace_keys.items():
                lock_entity_keys(workspace_id=workspace_id, keys=keys)
            current = _fingerprints(job.source_model, job.source_field, ids)
            last = attempt + 1 == REBUILD_ATTEMPTS
            stale = [pk for pk in ids if current.get(pk) != plan.fingerprints.get(pk)]
            if stale and last:
                # Still racing after several tries: compute once more while holding the locks.
                plan = job.plan(ids)
                stale = []
            fresh = [pk for pk in ids if pk not in stale]
            job.write(plan, fresh, result)
        if not stale:
            return
        ids = stale


@dataclass
class _Plan:
    fingerprints: dict[int, tuple]
    workspace_keys: dict[int, set[str]]
    updates: dict[int, dict]
    orphans: list[int]


class _EntityRebuild:
    source_model, source_field = EntitySource, "entity_id"

    def __init__(self, ids, usage, fallback):
        self.ids, self.usage, self.fallback = ids, usage, fallback

    def plan(self, ids: list[int]) -> _Plan:
        rows = {
            row["pk"]: row
            for row in Entity.objects.filter(pk__in=ids).values(
                "pk", "workspace_id", "key", "name", "type", "description", "embedding"
            )
        }
        types: dict[int, Counter] = {}
        spellings: dict[int, Counter] = {}
        descriptions: dict[int, list[str]] = {}
        for entity_id, name, kind, description in (
            EntitySource.objects.filter(entity_id__in=ids)
            .order_by("id")
            .values_list("entity_id", "name", "type", "description")
        ):
            if kind:
                types.setdefault(entity_id, Counter())[kind] += 1
            spellings.setdefault(entity_id, Counter())[name] += 1
            descriptions.setdefault(entity_id, []).append(description)
        fingerprints = _fingerprints(EntitySource, "entity_id", ids)
        alive = {pk: row for pk, row in rows.items() if pk in fingerprints}
        # The display name stays while some source still spells it so (a curated survivor keeps its
        # name); otherwise the most common spelling among the remaining sources takes over.
        names = {
            pk: row["name"] if row["name"] in spellings[pk] else spellings[pk].most_common(1)[0][0]
            for pk, row in alive.items()
        }
        merged = _describe("entity", names, descriptions, self.usage, self.fallback)
        vectors = _embed_changed(
            {
                pk: (
                    entity_embedding_text(row["name"], row["description"]),
                    entity_embedding_text(names[pk], merged[pk]),
                    row["embedding"] is not None,
                )
                for pk, row in alive.items()
            }
        )
        updates = {}
        for pk, row in alive.items():
            fields = {
                "name": names[pk],
                "description": merged[pk],
                "type": types[pk].most_common(1)[0][0] if pk in types else row["type"],
            }
            if pk in vectors:
                fields["embedding"] = vectors[pk]
            if any(row[name] != value for name, value in fields.items() if name != "embedding") or pk in vectors:
                updates[pk] = fields
        workspace_keys: dict[int, set[str]] = {}
        for row in rows.values():
            workspace_keys.setdefault(row["workspace_id"], set()).add(row["key"])
        return _Plan(fingerprints, workspace_keys, updates, [pk for pk in rows if pk not in fingerprints])

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

    def __init__(self, ids, usage, fallback):
        self.ids, self.usage, self.fallback = ids, usage, fallback

    def plan(self, ids: list[int]) -> _Plan:
        rows = {
            row["pk"]: row
            for row in Relation.objects.filter(pk__in=ids).values(
                "pk",
                "workspace_id",
                "keywords",
                "description",
                "weight",
                "embedding",
                "source__name",
                "source__key",
                "target__name",
                "target__key",
            )
        }
        weights: dict[int, float] = {}
        keywords: dict[int, list[str]] = {}
        descriptions: dict[int, list[str]] = {}
        for relation_id, strength, words, description in (
            RelationSource.objects.filter(relation_id__in=ids)
            .order_by("id")
            .values_list("relation_id", "strength", "keywords", "description")
        ):
            weights[relation_id] = weights.get(relation_id, 0.0) + strength
            keywords.setdefault(relation_id, []).append(words)
            descriptions.setdefault(relation_id, []).append(description)
        fingerprints = _fingerprints(RelationSource, "relation_id", ids)
        alive = {pk: row for pk, row in rows.items() if pk in fingerprints}
        merged = _describe(
            "relationship",
            {pk: f"{row['source__name']} and {row['target__name']}" for pk, row in alive.items()},
            descriptions,
            self.usage,
            self.fallback,
        )
        new_keywords = {pk: _keyword_union(keywords[pk]) for pk in alive}
        vectors = _embed_changed(
            {
                pk: (
                    relation_embedding_text(
                        row["keywords"], row["source__name"], row["target__name"], row["description"]
                    ),
                    relation_embedding_text(new_keywords[pk], row["source__name"], row["target__name"], merged[pk]),
                    row["embedding"] is not None,
                )
                for pk, row in alive.items()
            }
        )
        updates = {}
        for pk, row in alive.items():
            fields = {"description": merged[pk], "keywords": new_keywords[pk], "weight": weights[pk]}
            if pk in vectors:
                fields["embedding"] = vectors[pk]
            if any(row[name] != value for name, value in fields.items() if name != "embedding") or pk in vectors:
                updates[pk] = fields
        workspace_keys: dict[int, set[str]] = {}
        for row in rows.values():
            workspace_keys.setdefault(row["workspace_id"], set()).update([row["source__key"], row["target__key"]])
        return _Plan(fingerprints, workspace_keys, updates, [pk for pk in rows if pk not in fingerprints])

    def write(self, plan: _Plan, ids: list[int], result: RebuildResult) -> None:
        ids_set = set(ids)
        orphans = [pk for pk in plan.orphans if pk in ids_set]
        if orphans:
            result.deleted += Relation.objects.filter(pk__in=orphans, sources__isnull=True).delete()[0]
        _write_updates(Relation, {pk: plan.updates[pk] for pk in ids if pk in plan.updates}, result)


_COLUMN_TYPES = {"name": "text", "type": "text", "description": "text", "keywords": "text", "weight": "float8"}


def _vector_cursor() -> psycopg.Cursor:
    """A cursor on Django's connection (same transaction) that binds on the server and sends vectors in binary.

    Django's cursor interpolates parameters into the SQL text: thousands of vectors become
    megabytes of SQL to quote and parse, twenty times slower than pgvector's binary format.
    """
    connection.ensure_connection()
    cursor = psycopg.Cursor(connection.connection)
    register_vector_info(cursor, TypeInfo.fetch(connection.connection, "vector"))
    return cursor


def update_rows(model, updates: dict[int, dict]) -> None:
    """Set different values on many rows in one statement per 1000 rows (UPDATE ... FROM unnest).

    Django's bulk_update writes a CASE per column, which Postgres evaluates row by row: with
    vectors in it, thousands of rows take seconds. Rows without an "embedding" keep theirs.
    """
    if not updates:
        return
    columns = sorted({name for values in updates.values() for name in values} - {"embedding"})
    with_vectors = any("embedding" in values for values in updates.values())
    names = [*columns, "embedding"] if with_vectors else columns
    assignments = [f"{column} = v.{column}" for column in columns]
    arrays = ["%s::bigint[]", *(f"%s::{_COLUMN_TYPES[column]}[]" for column in columns)]
    if with_vectors:
        assignments.append("embedding = COALESCE(v.embedding, t.embedding)")
        arrays.append("%b::vector[]")
    if any(field.name == "updated_at" for field in model._meta.concrete_fields):
        assignments.append("updated_at = now()")
    sql = (
        f"UPDATE {model._meta.db_table} AS t SET {', '.join(assignments)} "  # noqa: S608 - our own names
        f"FROM unnest({', '.join(arrays)}) AS v(id, {', '.join(names)}) WHERE t.id = v.id"
    )
    items = list(updates.items())
    with _vector_cursor() as cursor:
        for start in range(0, len(items), 1000):
            page = items[start : start + 1000]
            params = [[pk for pk, _ in page]]
            params += [[values.get(column) for _, values in page] for column in columns]
            if with_vectors:
                params.append([_as_vector(values.get("embedding")) for _, values in page])
            cursor.execute(sql, params)


def _as_vector(vector):
    return None if vector is None else np.asarray(vector, dtype=np.float32)


def _write_updates(model, updates: dict[int, dict], result: RebuildResult) -> None:
    update_rows(model, updates)
    result.updated += len(updates)
    result.embedded += sum("embedding" in values for values in updates.values())


# ---------------------------------------------------------------------------------------
# Re-embedding (after changing the embedding model)

REEMBED_PAGE = 256
VECTOR_TABLES = {"knowledge_chunk": "chunk", "knowledge_entity": "entity", "knowledge_relation": "relation"}


def vector_dimensions() -> int:
    """The dimension the vector columns hold now (pgvector keeps it as the column's type modifier)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'knowledge_chunk'::regclass AND attname = 'embedding'"
        )
        return cursor.fetchone()[0]


def resize_vector_columns(dimensions: int) -> None:
    """Change every vector column to `dimensions`, dropping the old vectors and rebuilding the HNSW indexes."""
    with transaction.atomic(), connection.cursor() as cursor:
        for table, prefix in VECTOR_TABLES.items():
            index = f"{prefix}_embedding_hnsw"
            cursor.execute(f"DROP INDEX IF EXISTS {index}")  # noqa: S608 - fixed names, no user input
            cursor.execute(
                f"ALTER TABLE {table} ALTER COLUMN embedding TYPE vector({int(dimensions)}) USING NULL"  # noqa: S608
            )
            cursor.execute(
                f"CREATE INDEX {index} ON {table} USING hnsw (embedding vector_cosine_ops) "  # noqa: S608
                "WITH (m = 16, ef_construction = 64)"
            )


def _reembed(model, queryset, text_of) -> int:
    done, last = 0, 0
    while True:
        page = list(queryset.filter(pk__gt=last).order_by("pk")[:REEMBED_PAGE])
        if not page:
            return done
        vectors = llm.embed([text_of(row) for row in page], purpose="passage")
        update_rows(model, {row["pk"]: {"embedding": vector} for row, vector in zip(page, vectors, strict=True)})
        done += len(page)
        last = page[-1]["pk"]


def reembed_workspace(*, workspace_id: int) -> dict[str, int]:
    """Embed every chunk, entity and relation of the workspace again with the current embedding model."""
    return {
        "chunks": _reembed(
            Chunk, Chunk.objects.filter(workspace_id=workspace_id).values("pk", "text"), lambda row: row["text"]
        ),
        "entities": _reembed(
            Entity,
            Entity.objects.filter(workspace_id=workspace_id).values("pk", "name", "description"),
            lambda row: entity_embedding_text(row["name"], row["description"]),
        ),
        "relations": _reembed(
            Relation,
            Relation.objects.filter(workspace_id=workspace_id).values(
                "pk", "keywords", "description", "source__name", "target__name"
            ),
            lambda row: relation_embedding_text(
                row["keywords"], row["source__name"], row["target__name"], row["description"]
            ),
        ),
    }
