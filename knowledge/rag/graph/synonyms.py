"""Synonym links: entities that are one thing under two surface forms.

Two entities are linked when they share a surface form (names.surface_form: case, punctuation,
spaces and plural endings aside) or when their name vectors are nearly identical and their names
agree (the same digits, mostly the same letters). The second condition is what keeps "IPv6" and
"IPv4", or "Canada" and "Australia", apart: name vectors of related names are close, and only the
name itself says they differ. Links are read by the walk of retrieval and listed first on the
duplicates page; merging the two is the curator's call (decision 0073).

An entity looks for its synonyms once, right after the transaction that publishes it commits
(decision 0164): the transaction queues the search (SynonymSearch), so the search sees every
entity published before it, whichever of two documents published at once commits first, and a
worker that dies in between leaves it queued for the sweeper.
"""

import re
from collections.abc import Iterable
from datetime import datetime, timedelta
from difflib import SequenceMatcher

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from knowledge.models import EntityVector, SynonymSearch, vector_type
from knowledge.rag.names import surface_form

SYNONYM_COSINE = 0.93
NAME_AGREEMENT = 0.8
NEAREST = 5
_DIGITS = re.compile(r"\d+")


def names_agree(first: str, second: str) -> bool:
    """Whether two names could spell one thing: the same numbers, and forms mostly alike."""
    a, b = surface_form(first), surface_form(second)
    if not a or not b or _DIGITS.findall(a) != _DIGITS.findall(b):
        return False
    return a == b or SequenceMatcher(None, a, b).ratio() >= NAME_AGREEMENT


# Candidates for the given (published) entities: every other published entity of the workspace
# with the same form, and the NEAREST by name vector above the cosine floor (one index scan each).
_CANDIDATES_SQL = f"""
WITH given AS MATERIALIZED (
    SELECT id, workspace_id, name, form, embedding FROM knowledge_entity
    WHERE id = ANY(%(ids)s) AND published
)
SELECT g.id, g.name, o.id, o.name, NULL::float
FROM given g JOIN knowledge_entity o
  ON o.workspace_id = g.workspace_id AND o.form = g.form AND o.id <> g.id AND o.published
WHERE g.form <> ''
UNION ALL
SELECT g.id, g.name, n.id, n.name, 1 - n.distance
FROM given g CROSS JOIN LATERAL (
    -- The copy's half precision chooses the nearest; the floor applies to the full vectors.
    SELECT v.id, o.name, o.embedding <=> g.embedding AS distance
    FROM (
        SELECT v.id
        FROM knowledge_entityvector v
        WHERE v.workspace_id = g.workspace_id AND v.id <> g.id
        ORDER BY v.embedding <=> g.embedding::{vector_type(EntityVector)}
        LIMIT %(nearest)s
    ) v JOIN knowledge_entity o ON o.id = v.id AND o.published  -- a copy may be staged ahead (GraphVector)
) n
WHERE g.embedding IS NOT NULL AND n.distance <= 1 - %(cosine)s
"""  # noqa: S608 - a column type, no input

_SETTINGS_SQL = "SELECT set_config('enable_sort', %s, true), set_config('hnsw.ef_search', %s, true)"
# pgvector's default beam: enough for the few nearest rows a near-duplicate is among.
SYNONYM_EF_SEARCH = 40

_INSERT_SQL = """
INSERT INTO knowledge_entitylink (workspace_id, source_id, target_id, cosine, created_at)
SELECT e.workspace_id, l.source_id, l.target_id, l.cosine, now()
FROM unnest(%(sources)s::bigint[], %(targets)s::bigint[], %(cosines)s::float8[]) AS l (source_id, target_id, cosine)
JOIN knowledge_entity e ON e.id = l.source_id
ON CONFLICT (source_id, target_id) DO NOTHING
"""


def link_synonyms(entity_ids: Iterable[int]) -> int:
    """Link the given published entities to their synonyms in their workspaces, in two queries (and
    a setting around the first); returns how many candidate pairs were found (existing links are
    kept as they are)."""
    ids = list(entity_ids)
    if not ids:
        return 0
    pairs: dict[tuple[int, int], float | None] = {}
    with transaction.atomic(), connection.cursor() as cursor:
        # The vectors' table is narrow, so for a few thousand entities the planner prefers reading
        # the workspace's vectors once per given entity and sorting them (4 ms each, 0.2 s per
        # document published) to the HNSW index; and a near-duplicate is found with the index's
        # default beam. Both only for this query (2026-11-28-scale-10m.md: 213 ms to 28 ms).
        cursor.execute(_SETTINGS_SQL, ["off", str(SYNONYM_EF_SEARCH)])
        cursor.execute(_CANDIDATES_SQL, {"ids": ids, "nearest": NEAREST, "cosine": SYNONYM_COSINE})
        candidates = cursor.fetchall()
        cursor.execute(_SETTINGS_SQL, ["on", str(settings.HNSW_EF_SEARCH)])
        for a, a_name, b, b_name, cosine in candidates:
            if cosine is not None and not names_agree(a_name, b_name):
                continue
            pair = (min(a, b), max(a, b))
            pairs[pair] = pairs.get(pair, cosine)
        if pairs:
            # In one order, so two searches that find the same pairs wait for each other on the
            # unique index instead of deadlocking.
            ordered = sorted(pairs)
            cursor.execute(
                _INSERT_SQL,
                {
                    "sources": [a for a, _ in ordered],
                    "targets": [b for _, b in ordered],
                    "cosines": [pairs[pair] for pair in ordered],
                },
            )
    return len(pairs)


def queue_synonym_search(entity_ids: Iterable[int], *, takeover_after: timedelta) -> None:
    """Record, in the publishing transaction, that these entities are to look for their synonyms
    once it commits; the sweeper does it after `takeover_after` if the publisher could not."""
    due = timezone.now() + takeover_after
    SynonymSearch.objects.bulk_create(
        [SynonymSearch(entity_id=pk, due_at=due) for pk in entity_ids], ignore_conflicts=True
    )


# The sweeper's share per call: a few seconds of searches.
SWEEP_BATCH = 500


def run_synonym_searches(*, entity_ids: Iterable[int] | None = None, due_before: datetime | None = None) -> int:
    """Look for the synonyms of queued entities (these, or those due before a time) and take them
    off the queue; entities another process is searching are skipped. Returns how many searched."""
    wanted = None if entity_ids is None else list(entity_ids)
    if wanted == []:  # a document that published no new entity
        return 0
    with transaction.atomic():
        queued = SynonymSearch.objects.select_for_update(skip_locked=True)
        if wanted is not None:
            queued = queued.filter(entity_id__in=wanted)
        if due_before is not None:
            queued = queued.filter(due_at__lt=due_before).order_by("due_at")[:SWEEP_BATCH]
        ids = list(queued.values_list("entity_id", flat=True))
        if ids:
            link_synonyms(ids)
            SynonymSearch.objects.filter(entity_id__in=ids).delete()
    return len(ids)
