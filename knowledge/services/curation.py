"""Curation: merging duplicate entities (and undoing a merge exactly), editing an entity, and
finding likely duplicates.

A merge snapshots every row it is about to change (the entities, every relation touching
them, their provenance and their aliases) into its MergeLog, so undo can put those rows back
as they were, ids included. Everything happens under the same advisory key locks ingestion
takes (knowledge.rag.graph), so a document being merged into the graph at the same moment either
finishes before the curation merge or lands on the survivor through the alias afterwards.
"""

import difflib
import itertools
import re
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from knowledge.models import (
    Chunk,
    Entity,
    EntityAlias,
    EntityLink,
    EntitySource,
    MergeLog,
    Relation,
    RelationSource,
    Workspace,
)
from knowledge.rag.graph import (
    embed_published,
    entity_key,
    link_synonyms,
    lock_entity_keys,
    rebuild_entities,
    rebuild_relations,
)
from knowledge.rag.names import surface_form
from knowledge.services.workspaces import audit_record, workspace_refresh_counts


class CurationError(Exception):
    """A curation step that cannot be done; `str(err)` tells the curator why and what to do instead."""


ENTITY_FIELDS = (
    "id",
    "workspace_id",
    "name",
    "key",
    "form",
    "type",
    "description",
    "embedding",
    "published",
    "summary",
    "summary_through",
    "summary_sources",
    "folded",
    "created_at",
    "updated_at",
)
RELATION_FIELDS = (
    "id",
    "workspace_id",
    "source_id",
    "target_id",
    "keywords",
    "description",
    "weight",
    "embedding",
    "published",
    "summary",
    "summary_through",
    "summary_sources",
    "folded",
    "created_at",
    "updated_at",
)
ENTITY_SOURCE_FIELDS = ("id", "entity_id", "chunk_id", "name", "type", "description")
RELATION_SOURCE_FIELDS = ("id", "relation_id", "chunk_id", "description", "keywords", "strength")
ALIAS_FIELDS = ("id", "workspace_id", "key", "name", "entity_id", "created_at")
TIMESTAMPS = ("created_at", "updated_at")


def _to_json(row: dict) -> dict:
    out = {}
    for field, value in row.items():
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, np.ndarray):
            # float32 values printed as Python floats read back to the very same float32.
            value = value.tolist()
        out[field] = value
    return out


def _from_json(row: dict) -> dict:
    return {field: datetime.fromisoformat(value) if field in TIMESTAMPS else value for field, value in row.items()}


def _dump(queryset, fields: Sequence[str]) -> list[dict]:
    return [_to_json(row) for row in queryset.order_by("pk").values(*fields)]


def _restore(model, rows: list[dict]) -> None:
    """Put rows back with their ids, updating those that exist and creating the others, timestamps included."""
    if not rows:
        return
    objects = [model(**_from_json(row)) for row in rows]
    existing = set(model.objects.filter(pk__in=[obj.pk for obj in objects]).values_list("pk", flat=True))
    missing = [model(**_from_json(row)) for row in rows if row["id"] not in existing]
    if missing:
        model.objects.bulk_create(missing)
    # Every column back as it was, timestamps included (bulk_create stamped new rows with the
    # time now). bulk_update's CASE over hundreds of vectors is an order of magnitude slower.
    fields = [name for name in rows[0] if name != "id"]
    _update_rows(
        model,
        fields,
        (
            [model._meta.get_field(name).get_db_prep_save(getattr(obj, name), connection) for name in fields] + [obj.pk]
            for obj in objects
        ),
    )


# ---------------------------------------------------------------------------------------
# Locking


def _lock_around(workspace_id: int, entity_ids: set[int], extra_keys: Iterable[str] = ()) -> None:
    """Lock the keys of these entities and of every entity related to them.

    Relations are keyed by their endpoints, so a merge that rewrites relations must hold their
    far ends too; all keys are taken in one sorted call, so no deadlock with ingestion.
    Neighbours can appear while we wait, so repeat until the set is stable.
    """
    locked: set[str] = set()
    extra_keys = set(extra_keys)
    while True:
        relations = Relation.objects.filter(Q(source_id__in=entity_ids) | Q(target_id__in=entity_ids))
        neighbours = set(relations.values_list("source_id", flat=True)) | set(
            relations.values_list("target_id", flat=True)
        )
        keys = set(Entity.objects.filter(pk__in=entity_ids | neighbours).values_list("key", flat=True)) | extra_keys
        if keys <= locked:
            return
        lock_entity_keys(workspace_id=workspace_id, keys=keys - locked)
        locked |= keys


# ---------------------------------------------------------------------------------------
# Merge


def _snapshot(entity_ids: set[int]) -> dict:
    relations = Relation.objects.filter(Q(source_id__in=entity_ids) | Q(target_id__in=entity_ids))
    relation_ids = list(relations.values_list("pk", flat=True))
    return {
        "entities": _dump(Entity.objects.filter(pk__in=entity_ids), ENTITY_FIELDS),
        "relations": _dump(Relation.objects.filter(pk__in=relation_ids), RELATION_FIELDS),
        "entity_sources": _dump(EntitySource.objects.filter(entity_id__in=entity_ids), ENTITY_SOURCE_FIELDS),
        "relation_sources": _dump(RelationSource.objects.filter(relation_id__in=relation_ids), RELATION_SOURCE_FIELDS),
        "aliases": _dump(EntityAlias.objects.filter(entity_id__in=entity_ids), ALIAS_FIELDS),
    }


def _join(*texts: str) -> str:
    return "\n".join(dict.fromkeys(text for text in texts if text))


def _keywords(*texts: str) -> str:
    words = (word.strip() for text in texts for word in text.split(","))
    return ", ".join(dict.fromkeys(word for word in words if word))


def _update_rows(model, fields: Sequence[str], rows: Iterable[tuple]) -> None:
    """UPDATE model SET fields = ... WHERE id = ..., one pipelined statement per (values..., id) row."""
    rows = list(rows)
    if not rows:
        return
    columns = [model._meta.get_field(name) for name in fields]
    assignments = ", ".join(f"{connection.ops.quote_name(column.column)} = %s" for column in columns)
    sql = f"UPDATE {connection.ops.quote_name(model._meta.db_table)} SET {assignments} WHERE id = %s"  # noqa: S608 - names from the model
    with connection.cursor() as cursor:
        cursor.executemany(sql, rows)


def _move_sources(model, owner_field: str, moves: dict[int, int], combine) -> None:
    """Re-point provenance rows from owner to owner (`moves`); a chunk the new owner already has
    keeps one row, `combine(kept, moved)` folding the moved one into it."""
    if not moves:
        return
    owner_id = f"{owner_field}_id"
    held = {
        (getattr(row, owner_id), row.chunk_id): row
        for row in model.objects.filter(**{f"{owner_id}__in": set(moves.values())})
    }
    repointed, combined, dropped = [], {}, []
    for row in model.objects.filter(**{f"{owner_id}__in": list(moves)}).order_by("pk"):
        target = moves[getattr(row, owner_id)]
        kept = held.get((target, row.chunk_id))
        if kept is None:
            setattr(row, owner_id, target)
            held[(target, row.chunk_id)] = row
            repointed.append((target, row.pk))
        else:
            combine(kept, row)
            combined[kept.pk] = kept
            dropped.append(row.pk)
    model.objects.filter(pk__in=dropped).delete()
    _update_rows(model, [owner_id], repointed)
    if combined:
        fields = [field for field in ("description", "keywords", "strength") if hasattr(model, field)]
        model.objects.bulk_update(combined.values(), fields)


def _combine_entity_sources(kept: EntitySource, moved: EntitySource) -> None:
    # The chunk mentioned both names: one provenance row, saying both things.
    kept.description = _join(kept.description, moved.description)


def _combine_relation_sources(kept: RelationSource, moved: RelationSource) -> None:
    kept.description = _join(kept.description, moved.description)
    kept.keywords = _keywords(kept.keywords, moved.keywords)
    kept.strength += moved.strength


def _rewire_relations(survivor: Entity, other_ids: list[int]) -> set[int]:
    """Point the others' relations at the survivor; returns the relations whose contents changed."""
    merged = set(other_ids) | {survivor.pk}
    around_survivor = Relation.objects.filter(Q(source=survivor) | Q(target=survivor))
    by_pair = {
        (source, target): pk for source, target, pk in around_survivor.values_list("source_id", "target_id", "pk")
    }
    self_loops, repointed, folded = [], [], {}
    touching = Relation.objects.filter(Q(source_id__in=other_ids) | Q(target_id__in=other_ids))
    for pk, source_id, target_id in touching.order_by("pk").values_list("pk", "source_id", "target_id"):
        ends = {survivor.pk if end in merged else end for end in (source_id, target_id)}
        if len(ends) == 1:
            self_loops.append(pk)  # the two ends are now one entity
            continue
        pair = tuple(sorted(ends))
        into = by_pair.get(pair)
        if into is None:
            by_pair[pair] = pk
            repointed.append((*pair, pk))
        else:
            folded[pk] = into
    Relation.objects.filter(pk__in=self_loops).delete()
    _move_sources(RelationSource, "relation", folded, _combine_relation_sources)
    Relation.objects.filter(pk__in=folded).delete()
    _update_rows(Relation, ["source_id", "target_id"], repointed)
    return {pk for *_, pk in repointed} | set(folded.values())


def entity_merge(*, survivor: Entity, others: Iterable[Entity], actor) -> MergeLog:
    """Merge `others` into `survivor`: relations, provenance and aliases move, descriptions and
    vectors are rebuilt, the old names become aliases, and a MergeLog keeps what undo needs."""
    other_ids = sorted({other.pk for other in others} - {survivor.pk})
    if not other_ids:
        raise CurationError("Choose at least one other entity to merge into the survivor.")
    workspace_id = survivor.workspace_id
    ids = {survivor.pk, *other_ids}
    with transaction.atomic():
        _lock_around(workspace_id, ids)
        entities = {entity.pk: entity for entity in Entity.objects.filter(pk__in=ids, workspace_id=workspace_id)}
        if len(entities) != len(ids):
            raise CurationError(
                "Some of these entities are gone or belong to another workspace (a document may have been "
                "deleted meanwhile). Reload and choose again."
            )
        survivor, others = entities[survivor.pk], [entities[pk] for pk in other_ids]
        snapshot = _snapshot(ids)
        _move_sources(EntitySource, "entity", dict.fromkeys(other_ids, survivor.pk), _combine_entity_sources)
        changed_relations = _rewire_relations(survivor, other_ids)
        EntityAlias.objects.filter(entity_id__in=other_ids).update(entity=survivor)
        created = EntityAlias.objects.bulk_create(
            [
                EntityAlias(workspace_id=workspace_id, key=other.key, name=other.name, entity=survivor)
                for other in others
            ]
        )
        snapshot["created_aliases"] = [alias.pk for alias in created]
        Entity.objects.filter(pk__in=other_ids).delete()
        rebuild_entities(entity_ids=[survivor.pk], fallback=True)
        rebuild_relations(relation_ids=changed_relations, fallback=True)
        # Their vectors are made of their endpoints' names, and one endpoint is now the survivor.
        embed_published(relation_ids=changed_relations)
        workspace_refresh_counts(workspace_id=workspace_id)
        names = [other.name for other in others]
        log = MergeLog.objects.create(
            workspace_id=workspace_id,
            survivor=survivor,
            survivor_name=survivor.name,
            merged_names=names,
            snapshot=snapshot,
            user=actor if actor is not None and actor.is_authenticated else None,
        )
        audit_record(
            workspace=survivor.workspace,
            actor=actor,
            action="entity.merge",
            summary=f"Merged {', '.join(names)} into {survivor.name}",
            detail={"merge_log": log.pk, "survivor": survivor.pk, "merged": dict(zip(other_ids, names, strict=True))},
        )
    return log


def _snapshot_entity_ids(log: MergeLog) -> set[int]:
    return {row["id"] for row in log.snapshot.get("entities", [])}


def _ids_of(rows: list[dict]) -> set[int]:
    return {row["id"] for row in rows}


def entity_merge_undo(*, merge_log: MergeLog, actor) -> None:
    """Put back the entities, relations, provenance and aliases a merge changed, as they were.

    What arrived after the merge (provenance from later documents that landed on the survivor)
    stays on the survivor, and whatever it touches is rebuilt. Merges are undone newest first.
    """
    with transaction.atomic():
        log = MergeLog.objects.select_for_update().select_related("workspace").get(pk=merge_log.pk)
        if log.undone_at is not None:
            raise CurationError("This merge has already been undone.")
        snapshot, mine = log.snapshot, _snapshot_entity_ids(log)
        later = MergeLog.objects.filter(workspace=log.workspace, pk__gt=log.pk, undone_at=None)
        blocking = [other for other in later if _snapshot_entity_ids(other) & mine]
        if blocking:
            raise CurationError(f"Undo the later merge into {blocking[0].survivor_name} first.")
        if log.survivor_id is None:
            raise CurationError(
                f"{log.survivor_name} no longer exists (the documents behind it were deleted), so there is "
                "nothing to split back."
            )
        ids = mine | {log.survivor_id}
        neighbours = {row[end] for row in snapshot["relations"] for end in ("source_id", "target_id")}
        neighbour_keys = Entity.objects.filter(pk__in=neighbours).values_list("key", flat=True)
        _lock_around(
            log.workspace_id, ids, extra_keys=[row["key"] for row in snapshot["entities"]] + list(neighbour_keys)
        )
        restored_keys = {row["key"] for row in snapshot["entities"] if row["id"] != log.survivor_id}
        squatter = (
            Entity.objects.filter(workspace_id=log.workspace_id, key__in=restored_keys).exclude(pk__in=ids).first()
        )
        if squatter is not None:
            raise CurationError(f"An entity named {squatter.name} exists again; merge or rename it first.")

        EntityAlias.objects.filter(pk__in=snapshot.get("created_aliases", [])).delete()
        _restore(Entity, snapshot["entities"])
        live_aliases = set(EntityAlias.objects.filter(pk__in=_ids_of(snapshot["aliases"])).values_list("pk", flat=True))
        _restore(EntityAlias, [row for row in snapshot["aliases"] if row["id"] in live_aliases])

        existing_entities = set(Entity.objects.filter(pk__in=ids | neighbours).values_list("pk", flat=True))
        relations = [
            row
            for row in snapshot["relations"]
            if row["source_id"] in existing_entities and row["target_id"] in existing_entities
        ]
        chunk_ids = {row["chunk_id"] for row in snapshot["entity_sources"] + snapshot["relation_sources"]}
        live_chunks = set(Chunk.objects.filter(pk__in=chunk_ids).values_list("pk", flat=True))
        relation_ids = _ids_of(relations)
        RelationSource.objects.filter(pk__in=_ids_of(snapshot["relation_sources"])).delete()
        EntitySource.objects.filter(pk__in=_ids_of(snapshot["entity_sources"])).delete()
        _restore(Relation, relations)
        relation_sources = [
            row
            for row in snapshot["relation_sources"]
            if row["chunk_id"] in live_chunks and row["relation_id"] in relation_ids
        ]
        entity_sources = [row for row in snapshot["entity_sources"] if row["chunk_id"] in live_chunks]
        RelationSource.objects.bulk_create(RelationSource(**row) for row in relation_sources)
        EntitySource.objects.bulk_create(EntitySource(**row) for row in entity_sources)

        # Rows whose provenance is no longer what the snapshot held (later documents added to
        # them, or deleted chunks took some away) are rebuilt; the rest are exact already.
        rebuild_entities(entity_ids=_drifted(EntitySource, "entity_id", ids, entity_sources), fallback=True)
        rebuild_relations(
            relation_ids=_drifted(RelationSource, "relation_id", relation_ids, relation_sources), fallback=True
        )
        # The links the merged-away entities had went with them; they are made again as at publish.
        link_synonyms(ids)
        workspace_refresh_counts(workspace_id=log.workspace_id)
        log.undone_at = timezone.now()
        log.save(update_fields=["undone_at"])
        audit_record(
            workspace=log.workspace,
            actor=actor,
            action="entity.unmerge",
            summary=f"Undid the merge of {', '.join(log.merged_names)} into {log.survivor_name}",
            detail={"merge_log": log.pk, "restored": sorted(mine - {log.survivor_id})},
        )


def _drifted(model, field: str, owner_ids: set[int], expected_rows: list[dict]) -> list[int]:
    expected = defaultdict(set)
    for row in expected_rows:
        expected[row[field]].add(row["id"])
    actual = defaultdict(set)
    for owner, pk in model.objects.filter(**{f"{field}__in": owner_ids}).values_list(field, "pk"):
        actual[owner].add(pk)
    return sorted(owner for owner in owner_ids if expected.get(owner, set()) != actual.get(owner, set()))


# ---------------------------------------------------------------------------------------
# Editing


def check_entity_name(*, entity: Entity, name: str) -> None:
    """Raise CurationError when `entity` cannot be called `name` (empty, or another entity's name or alias)."""
    new_key = entity_key(name)
    if not new_key:
        raise CurationError("An entity needs a name.")
    if new_key == entity.key:
        return
    clash = Entity.objects.filter(workspace_id=entity.workspace_id, key=new_key).exclude(pk=entity.pk).first()
    if clash is not None:
        raise CurationError(f"{clash.name} already exists in this workspace; merge the two instead.")
    alias = (
        EntityAlias.objects.filter(workspace_id=entity.workspace_id, key=new_key)
        .exclude(entity=entity)
        .select_related("entity")
        .first()
    )
    if alias is not None:
        raise CurationError(f"{name} is an alias of {alias.entity.name}; merge the two instead.")


def entity_update(*, entity: Entity, actor, name: str, type: str, description: str) -> Entity:
    """Change an entity's name, type or description and embed it again.

    A new name keeps the old one as an alias, so later documents that use it still land here.
    """
    name = " ".join(name.split())
    new_key = entity_key(name)
    with transaction.atomic():
        lock_entity_keys(workspace_id=entity.workspace_id, keys=[entity.key, new_key])
        entity = Entity.objects.select_related("workspace").get(pk=entity.pk)
        check_entity_name(entity=entity, name=name)
        old = {"name": entity.name, "type": entity.type, "description": entity.description}
        if new_key != entity.key:
            EntityAlias.objects.filter(workspace_id=entity.workspace_id, key=new_key, entity=entity).delete()
            EntityAlias.objects.create(
                workspace_id=entity.workspace_id, key=entity.key, name=entity.name, entity=entity
            )
        renamed = name != entity.name
        entity.name, entity.key, entity.type, entity.description = name, new_key, type.strip(), description.strip()
        entity.form = surface_form(new_key)
        # The edited values are no longer what the provenance folds: the next build counts it all again.
        entity.folded = None
        entity.save()
        # An entity's vector is made of its name, its relations' of their names (and keywords).
        relations = Relation.objects.filter(Q(source=entity) | Q(target=entity)) if renamed else Relation.objects.none()
        embed_published(entity_ids=[entity.pk], relation_ids=list(relations.values_list("pk", flat=True)))
        entity.refresh_from_db(fields=["embedding"])
        if renamed:
            EntityLink.objects.filter(Q(source=entity) | Q(target=entity)).delete()
            link_synonyms([entity.pk])
        changed = {field: {"from": value, "to": getattr(entity, field)} for field, value in old.items()}
        changed = {field: change for field, change in changed.items() if change["from"] != change["to"]}
        if changed:
            audit_record(
                workspace=entity.workspace,
                actor=actor,
                action="entity.update",
                summary=f"Edited {entity.name} ({', '.join(changed)})",
                detail={"entity": entity.pk, **changed},
            )
    return entity


# ---------------------------------------------------------------------------------------
# Possible duplicates

DUPLICATE_CANDIDATES = 5000
_WORD = re.compile(r"\w+")


@dataclass
class DuplicatePair:
    first: Entity
    second: Entity
    name_similarity: float
    cosine: float | None
    # Linked as synonyms when their documents published (knowledge.rag.graph.synonyms): the
    # walk of retrieval already treats them as one; merging makes it so everywhere.
    linked: bool = False

    @property
    def score(self) -> float:
        return max(self.name_similarity, self.cosine or 0.0)


def _blocks(key: str) -> set[str]:
    words = _WORD.findall(key)
    squashed = "".join(words)
    # Names that share a word, or start alike once spaces and punctuation go, are worth comparing.
    return {f"w:{word}" for word in words if len(word) > 2} | ({f"p:{squashed[:4]}"} if squashed else set())


def _name_pairs(rows: list[dict], threshold: float) -> dict[tuple[int, int], float]:
    blocks: dict[str, list[dict]] = defaultdict(list)
    for row in rows:
        for block in _blocks(row["key"]):
            blocks[block].append(row)
    pairs: dict[tuple[int, int], float] = {}
    for members in blocks.values():
        if len(members) > 200:  # a word as common as "the": comparing everything in it finds nothing useful
            continue
        for a, b in itertools.combinations(members, 2):
            pair = (min(a["pk"], b["pk"]), max(a["pk"], b["pk"]))
            if pair in pairs:
                continue
            squashed_a, squashed_b = "".join(_WORD.findall(a["key"])), "".join(_WORD.findall(b["key"]))
            ratio = 1.0 if squashed_a == squashed_b else difflib.SequenceMatcher(None, a["key"], b["key"]).ratio()
            if ratio >= threshold:
                pairs[pair] = ratio
    return pairs


def _vector_pairs(rows: list[dict], threshold: float) -> dict[tuple[int, int], float]:
    rows = [row for row in rows if row["embedding"] is not None]
    if len(rows) < 2:
        return {}
    ids = np.array([row["pk"] for row in rows])
    vectors = np.array([row["embedding"] for row in rows], dtype=np.float32)
    vectors /= np.linalg.norm(vectors, axis=1, keepdims=True).clip(min=1e-12)
    pairs: dict[tuple[int, int], float] = {}
    for start in range(0, len(rows), 1024):
        block = vectors[start : start + 1024] @ vectors.T
        for i, j in zip(*np.nonzero(block >= threshold), strict=True):
            if start + i < j:
                pairs[(int(min(ids[start + i], ids[j])), int(max(ids[start + i], ids[j])))] = float(block[i, j])
    return pairs


def possible_duplicates(
    *, workspace: Workspace, name_threshold: float = 0.85, cosine_threshold: float = 0.92, limit: int = 200
) -> list[DuplicatePair]:
    """Pairs of entities that may be one thing, most certain first: the synonym links (same surface
    form, or near name vectors with agreeing names), then pairs whose names look alike or whose
    name vectors are close.

    The second kind looks at the workspace's most recently changed DUPLICATE_CANDIDATES entities,
    so the page stays quick on very large graphs; duplicates are usually young.
    """
    links = list(
        EntityLink.objects.filter(workspace=workspace)
        .order_by("cosine", "-pk")  # same form (no cosine) first
        .values_list("source_id", "target_id", "cosine")[:limit]
    )
    rows = list(
        Entity.objects.filter(workspace=workspace)
        .order_by("-updated_at", "-pk")
        .values("pk", "key", "embedding")[:DUPLICATE_CANDIDATES]
    )
    linked = {(a, b) for a, b, _ in links}
    by_name = _name_pairs(rows, name_threshold)
    by_vector = _vector_pairs(rows, cosine_threshold)
    scored = {
        pair: (by_name.get(pair, 0.0), by_vector.get(pair)) for pair in (by_name.keys() | by_vector.keys()) - linked
    }
    best = sorted(scored.items(), key=lambda item: (-max(item[1][0], item[1][1] or 0.0), item[0]))
    best = best[: max(limit - len(links), 0)]
    wanted = {pk for pair, _ in best for pk in pair} | {pk for a, b, _ in links for pk in (a, b)}
    entities = Entity.objects.filter(workspace=workspace).defer("embedding").in_bulk(wanted)
    vector_of = {row["pk"]: row["embedding"] for row in rows}
    pairs = [
        DuplicatePair(
            entities[a],
            entities[b],
            difflib.SequenceMatcher(None, entities[a].key, entities[b].key).ratio(),
            cosine,
            linked=True,
        )
        for a, b, cosine in links
    ]
    for (a, b), (name_similarity, cosine) in best:
        if cosine is None and vector_of.get(a) is not None and vector_of.get(b) is not None:
            first, second = np.asarray(vector_of[a]), np.asarray(vector_of[b])
            cosine = float(first @ second / max(np.linalg.norm(first) * np.linalg.norm(second), 1e-12))
        pairs.append(DuplicatePair(entities[a], entities[b], name_similarity, cosine))
    return pairs
