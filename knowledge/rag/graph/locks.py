"""Transaction-scoped advisory locks: every writer of an entity holds its key's lock, every
writer of a relation's provenance-derived fields holds the relation's lock.

Order, so that no two holders deadlock: entity keys before relation ids, each set taken in
one sorted call. A merge needs both (it creates entities and adds provenance to relations); a
relation rebuild only the relations', so rebuilding a document's relations, vector writes
and all, does not stall other documents merging around the same hub entities.
"""

import hashlib
from collections.abc import Iterable

from django.db import connection


def _lock_id(*parts) -> int:
    digest = hashlib.blake2b(":".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _hold(ids: Iterable[int]) -> None:
    if not connection.in_atomic_block:
        raise RuntimeError("advisory locks only make sense inside transaction.atomic()")
    ids = sorted(set(ids))
    if ids:
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(pg_advisory_xact_lock(k)) FROM unnest(%s::bigint[]) AS k", [ids])


def lock_entity_keys(*, workspace_id: int, keys: Iterable[str]) -> None:
    """Hold, until the transaction ends, a lock on each key."""
    _hold(_lock_id(workspace_id, key) for key in keys)


def lock_relations(*, relation_ids: Iterable[int]) -> None:
    """Hold, until the transaction ends, a lock on each relation (after any entity keys)."""
    _hold(_lock_id("relation", pk) for pk in relation_ids)
