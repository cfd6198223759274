"""Chunk records into the graph: new entities and relations, and one provenance row per chunk."""

from collections.abc import Iterable
from dataclasses import dataclass

from django.db import connection, transaction
from django.utils import timezone

from knowledge.models import Entity, EntityAlias, EntitySource, Relation, RelationSource
from knowledge.rag.extraction.records import EntityMention, RelationMention, consolidate, keyword_union
from knowledge.rag.graph.locks import lock_entity_keys, lock_relations
from knowledge.rag.names import surface_form


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
                    form=surface_form(key),
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
    # Before the insert below touches any degree row: a rebuild holding one of these may be
    # deleting that relation, which writes degree rows too.
    lock_relations(relation_ids=relation_id_of.values())
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
                keywords=keyword_union(part.keywords for part in parts),
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
