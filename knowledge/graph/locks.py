"""Transaction-scoped advisory locks per entity key: every writer of a key holds its lock."""

import hashlib
from collections.abc import Iterable

from django.db import connection


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
