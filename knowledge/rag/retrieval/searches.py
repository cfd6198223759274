"""The searches of retrieval, in SQL: vector and hybrid (vector + full text) searches of chunks,
entities and relations, the one-hop walk around entities, the chunks that support them, and
degrees. Each is one query, however large the workspace (the retrieval benchmark pins the counts).
Callers pass the workspace they already checked; nothing here decides who may read."""

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from django.conf import settings
from django.db import connection
from django.db.models.expressions import RawSQL
from django.db.models.functions import Coalesce
from pgvector.django import CosineDistance

from knowledge.models import Chunk, Entity, EntityVector, Relation, RelationVector, Workspace, vector_type
from knowledge.rag.language import CJK_CHARACTERS
from knowledge.rag.retrieval.scope import (
    Scope,
    chunk_clause,
    hidden_clause,
    row_clause,
    rows_in_scope,
    size_of_scope,
)


def degree_of(entity: str = "") -> Coalesce:
    """The degree of the entity at the lookup path `entity` ("" for the queried entity itself),
    read from EntityDegree, which triggers keep equal to the count of its relations."""
    return Coalesce(f"{entity}degree_row__degree", 0)


def entity_degrees(*, entity_ids: Iterable[int]) -> dict[int, int]:
    """Degree (number of relations) of each entity, in one query."""
    rows = Entity.objects.filter(pk__in=list(entity_ids)).annotate(degree=degree_of())
    return dict(rows.values_list("pk", "degree"))


def relation_ranks(*, relation_ids: Iterable[int]) -> dict[int, int]:
    """Edge rank (sum of both endpoints' degrees) of each relation, in one query."""
    rows = Relation.objects.filter(pk__in=list(relation_ids)).annotate(
        rank=degree_of("source__") + degree_of("target__")
    )
    return dict(rows.values_list("pk", "rank"))


# Reciprocal rank fusion: a row's score is the sum over the rankings that found it of
# 1 / (RRF_K + rank). 60 is the constant of Cormack et al., which most hybrid search engines keep.
RRF_K = 60
# The lexical side ranks at most this many matching rows (read in index order), so a query word
# that occurs in most of a large workspace costs a bounded amount; rarer words match fewer rows.
LEXICAL_CANDIDATES = 500
MAX_QUERY_TERMS = 32
# A word, or a run of a script written without spaces (which cjk_bigrams, in SQL, cuts into
# pairs of characters for the index and the query alike), so "LightRAGの二段階検索" is the
# identifier "LightRAG" and the run "の二段階検索".
_QUERY_TERM = re.compile(rf"[{CJK_CHARACTERS}]+|[^\W{CJK_CHARACTERS}]+(?:[.\-'][^\W{CJK_CHARACTERS}]+)*")


def _looks_like_an_identifier(term: str, following: str) -> bool:
    return (
        any(mark in term for mark in "_.")
        or any(character.isdigit() for character in term)
        or any(character.isupper() for character in term[1:])
        or following.startswith("(")
    )


def identifier_terms(text: str) -> str:
    """A tsquery text matching any identifier-like word of `text`: with an underscore, a dot or a
    digit, capitals past its first letter, or called like a function (`setblocking(`).

    These are what an embedding blurs and what words find exactly. Plain words are left to the
    vector: without document frequencies (Postgres ranks matches by where they occur, not by how
    rare a word is), an OR of a question's plain words ranks the chunks that repeat "file" or
    "use" above the one that answers, and on the known-answer benchmark that lost more first
    places than it won.
    """
    terms = dict.fromkeys(
        match.group().replace("'", "").casefold()
        for match in _QUERY_TERM.finditer(text)
        if _looks_like_an_identifier(match.group(), text[match.end() :])
    )
    return " | ".join(f"'{term}'" for term in list(terms)[:MAX_QUERY_TERMS])


def search_terms(text: str) -> str:
    """A tsquery text matching any word of `text` ('a' | 'b'); an identifier such as
    inspect.get_annotations stays one term, which Postgres matches as a phrase of its parts."""
    terms = dict.fromkeys(match.group().replace("'", "").casefold() for match in _QUERY_TERM.finditer(text))
    return " | ".join(f"'{term}'" for term in list(terms)[:MAX_QUERY_TERMS])


_EXACT_ORDER = "(x.embedding <=> %(vector)s::{vector_type}) + 0"


def _vector_order(size: int, vector_type: str) -> str:
    # Below the threshold an exact scan over the workspace's rows is both right and fast; ordering
    # by an expression the index cannot serve (distance + 0) is what makes the planner choose it.
    # Above it the HNSW index answers, scanning on until it has k rows of the workspace (iterative
    # scans, see settings).
    return _EXACT_ORDER.format(vector_type=vector_type) if size <= settings.VECTOR_EXACT_SCAN_MAX else "distance"


_NEAREST_SQL = """
SELECT x.id, x.embedding <=> %(vector)s::{vector_type} AS distance
FROM knowledge_{table} x
WHERE x.workspace_id = %(workspace_id)s AND x.embedding IS NOT NULL{served}{scope}
ORDER BY {order}
LIMIT %(k)s
"""

# An exact scan is there for a workspace that is a small part of the table, whose rows a filtered
# index scan finds among many others' (decision 0039). A workspace that holds nearly all of the
# table, as on a single team's installation, is what the index serves best: an exact scan would
# read all its rows for every question, ten times as many at ten times the corpus. Which is the
# case is read from the table's statistics inside the query (a one-time filter on each branch, so
# one query whatever the case); a table never analyzed counts as small.
_WORKSPACE_NEAREST_SQL = """
(SELECT x.id, x.embedding <=> %(vector)s::{vector_type} AS distance
 FROM knowledge_{table} x
 WHERE x.workspace_id = %(workspace_id)s AND x.embedding IS NOT NULL{served} AND NOT ({indexed})
 ORDER BY (x.embedding <=> %(vector)s::{vector_type}) + 0
 LIMIT %(k)s)
UNION ALL
(SELECT x.id, x.embedding <=> %(vector)s::{vector_type} AS distance
 FROM knowledge_{table} x
 WHERE x.workspace_id = %(workspace_id)s AND x.embedding IS NOT NULL{served} AND ({indexed})
 ORDER BY distance
 LIMIT %(k)s)
"""
_MOST_OF_THE_TABLE = (
    "coalesce(%(workspace_rows)s >= %(index_share)s * (SELECT nullif(greatest(c.reltuples, 0), 0) "
    "FROM pg_class c WHERE c.oid = 'knowledge_{table}'::regclass), false)"
)


# A filtered HNSW scan stops after visiting hnsw.max_scan_tuples rows, so a small scope, whose
# rows are rare along the way, loses recall (benchmarks/results/2026-11-26-scoped-search.md: 0.82
# for chunks and 0.68 for entities at a 5% scope). A scope of at most VECTOR_EXACT_SCAN_MAX rows, as
# its documents count them, is scanned exactly instead. The query picks the branch itself (a
# one-time filter on each), so a question costs the same queries whatever its scope.
_SCOPED_NEAREST_SQL = """
(SELECT x.id, x.embedding <=> %(vector)s::{vector_type} AS distance
 FROM {exact}
 ORDER BY (x.embedding <=> %(vector)s::{vector_type}) + 0
 LIMIT %(k)s)
UNION ALL
(SELECT x.id, x.embedding <=> %(vector)s::{vector_type} AS distance
 FROM knowledge_{table} x
 WHERE x.workspace_id = %(workspace_id)s AND x.embedding IS NOT NULL{served}{scope}
   AND ({size}) > %(scope_exact_max)s
 ORDER BY {order}
 LIMIT %(k)s)
"""
# The exact scan's rows: chunks through the index on their document; entities and relations each
# looked up by its key from the scope's provenance (LIMIT 1 keeps the planner from hashing a scan
# of the whole table instead, whose vectors are most of its pages).
_SCOPED_CHUNKS = (
    "knowledge_chunk x WHERE x.workspace_id = %(workspace_id)s AND x.embedding IS NOT NULL{scope} AND {small}"
)
_SCOPED_ROWS = """(SELECT DISTINCT id FROM ({rows}) r) s
 CROSS JOIN LATERAL (
     SELECT y.id, y.embedding FROM knowledge_{table} y
     WHERE y.id = s.id AND y.workspace_id = %(workspace_id)s AND y.embedding IS NOT NULL{served}
     LIMIT 1
 ) x
 WHERE {small}"""


# A copy of an entity's or relation's vector is written when its first document stages it, ahead
# of publication (knowledge.models.GraphVector): the rows still unpublished, few (those of the
# documents in flight) and read through their own partial index, are hashed once per query.
_SERVED_COPY = (
    " AND {alias}.id NOT IN (SELECT u.id FROM knowledge_{kind} u "
    "WHERE u.workspace_id = %(workspace_id)s AND NOT u.published)"
)


# The table each kind's vectors are searched in.
_SEARCHED = {"chunk": Chunk, "entity": EntityVector, "relation": RelationVector}


def _nearest_sql(kind: str, *, workspace: Workspace, size: int, scope: Scope | None) -> tuple[str, dict]:
    """SQL of the ids and cosine distances of the k rows of `kind` ("chunk", "entity", "relation")
    nearest %(vector)s in the workspace and `scope`, and the parameters of its scope."""
    if kind == "chunk":
        clause, params = chunk_clause("x.document_id", workspace, scope)
        table, served = "chunk", ""  # a chunk has its vector once published
    else:
        clause, params = row_clause(kind, "x.id", workspace, scope)
        table = f"{kind}vector"  # the graph's vectors and their index (knowledge.models.GraphVector)
        served = _SERVED_COPY.format(alias="x", kind=kind)
    of_type = vector_type(_SEARCHED[kind])
    if not clause:
        if size > settings.VECTOR_EXACT_SCAN_MAX:
            return _NEAREST_SQL.format(table=table, served=served, scope="", order="distance", vector_type=of_type), {}
        indexed = _MOST_OF_THE_TABLE.format(table=table)
        return _WORKSPACE_NEAREST_SQL.format(table=table, served=served, indexed=indexed, vector_type=of_type), {
            "workspace_rows": size,
            "index_share": settings.VECTOR_INDEX_SHARE,
        }
    small = f"({size_of_scope(kind)}) <= %(scope_exact_max)s"
    if kind == "chunk":
        exact = _SCOPED_CHUNKS.format(scope=clause, small=small)
    else:
        served_here = _SERVED_COPY.format(alias="y", kind=kind)
        exact = _SCOPED_ROWS.format(rows=rows_in_scope(kind), table=table, served=served_here, small=small)
    sql = _SCOPED_NEAREST_SQL.format(
        exact=exact,
        size=size_of_scope(kind),
        table=table,
        served=served,
        scope=clause,
        order=_vector_order(size, of_type),
        vector_type=of_type,
    )
    return sql, {**params, "scope_exact_max": settings.VECTOR_EXACT_SCAN_MAX}


def _positional(sql: str, params: dict) -> tuple[str, list]:
    """Named parameters (%(name)s) as positional ones (%s), for an ORM RawSQL."""
    return re.sub(r"%\((\w+)\)s", "%s", sql), [params[name] for name in re.findall(r"%\((\w+)\)s", sql)]


_CHUNKS_HYBRID_SQL = """
WITH vector_hits AS MATERIALIZED (
    SELECT id, distance, row_number() OVER (ORDER BY distance, id) AS rank
    FROM ({nearest}) nearest
    WHERE distance <= %(max_distance)s
), lexical_hits AS MATERIALIZED (
    SELECT id, row_number() OVER (ORDER BY score DESC, id) AS rank
    FROM (
        SELECT m.id, ts_rank_cd(m.search, q.query) AS score
        FROM (
            SELECT x.id, x.search FROM knowledge_chunk x
            -- As on the vector side, a chunk without its vector is not served (not published yet).
            WHERE x.workspace_id = %(workspace_id)s AND x.embedding IS NOT NULL{scope}
              AND x.search @@ to_tsquery('english', cjk_bigrams(%(terms)s))
            LIMIT %(candidates)s
        ) m, (SELECT to_tsquery('english', cjk_bigrams(%(terms)s)) AS query) q
        ORDER BY score DESC, m.id
        LIMIT %(k)s
    ) best
), fused AS (
    SELECT id, sum(1.0 / (%(rrf_k)s + rank)) AS score, min(distance) AS distance,
           min(rank) FILTER (WHERE lexical) AS lexical_rank
    FROM (
        SELECT id, rank, distance, false AS lexical FROM vector_hits
        UNION ALL
        SELECT id, rank, NULL, true FROM lexical_hits
    ) hits
    GROUP BY id
    ORDER BY score DESC, lexical_rank NULLS LAST, id
    LIMIT %(k)s
)
SELECT c.id, c.workspace_id, c.document_id, c."order", c.text, c.token_count, c.char_start, c.char_end,
       c.section, c.page_start, c.page_end, c.location, c.anchor, d.title AS document_title,
       f.score, f.distance, f.lexical_rank
FROM fused f
JOIN knowledge_chunk c ON c.id = f.id
JOIN knowledge_document d ON d.id = c.document_id
ORDER BY f.score DESC, f.lexical_rank NULLS LAST, c.id
"""


def chunks_nearest(
    *,
    workspace: Workspace,
    vector: Sequence[float],
    k: int,
    min_similarity: float | None = None,
    text: str = "",
    scope: Scope | None = None,
) -> list[Chunk]:
    """The k best chunks of the workspace for a question, in one query: the chunks nearest to
    `vector` by cosine and the chunks that best match the identifiers `text` names (Postgres
    full-text search, see identifier_terms), fused by reciprocal rank; on equal scores the words'
    ranking goes first (an exact word is the sharper signal). Each has `document_title`, `score`,
    `distance` (None when only the words found it) and `lexical_rank` (None when only the vector
    found it). Only chunks of documents in `scope` (scope.py)."""
    clause, scope_params = chunk_clause("x.document_id", workspace, scope)
    nearest, nearest_params = _nearest_sql("chunk", workspace=workspace, size=workspace.chunk_count, scope=scope)
    params = {
        "workspace_id": workspace.pk,
        "vector": _vector_literal(vector),
        "k": k,
        "max_distance": 2.0 if min_similarity is None else 1.0 - min_similarity,
        "terms": identifier_terms(text),
        "candidates": LEXICAL_CANDIDATES,
        "rrf_k": RRF_K,
        **scope_params,
        **nearest_params,
    }
    sql = _CHUNKS_HYBRID_SQL.format(nearest=nearest, scope=clause)
    return list(Chunk.objects.raw(sql, params))


_ENTITIES_HYBRID_SQL = """
WITH vector_hits AS MATERIALIZED (
    SELECT id, row_number() OVER (ORDER BY distance, id) AS rank
    FROM ({nearest}) nearest
    WHERE distance <= %(max_distance)s
), named AS MATERIALIZED (
    SELECT x.id, x.key = ANY(%(keys)s) AS exact, length(x.name) AS name_length
    FROM knowledge_entity x
    WHERE x.workspace_id = %(workspace_id)s AND x.key = ANY(%(keys)s) AND x.published{scope}
    UNION
    SELECT * FROM (
        SELECT x.id, x.key = ANY(%(keys)s), length(x.name)
        FROM knowledge_entity x
        WHERE x.workspace_id = %(workspace_id)s AND x.published{scope}
          AND x.search @@ to_tsquery('simple', cjk_bigrams(%(names)s))
        LIMIT %(candidates)s
    ) partial
), lexical_hits AS MATERIALIZED (
    SELECT id, exact, row_number() OVER (ORDER BY exact DESC, name_length, id) AS rank
    FROM named
    ORDER BY rank
    LIMIT %(k)s
), fused AS (
    SELECT id, bool_or(exact) AS exact, sum(1.0 / (%(rrf_k)s + rank)) AS score
    FROM (
        SELECT id, false AS exact, rank FROM vector_hits
        UNION ALL
        SELECT id, exact, rank FROM lexical_hits
    ) hits
    GROUP BY id
    ORDER BY bool_or(exact) DESC, score DESC, id
    LIMIT %(k)s
)
SELECT e.id, e.workspace_id, e.key, e.name, e.type, e.description,
       coalesce(g.degree, 0) AS degree, e.embedding <=> %(vector)s::vector AS distance, f.exact, f.score
FROM fused f
JOIN knowledge_entity e ON e.id = f.id
LEFT JOIN knowledge_entitydegree g ON g.entity_id = e.id
ORDER BY f.exact DESC, f.score DESC, e.id
"""


def _vector_literal(vector: Sequence[float]) -> str:
    return "[" + ",".join(repr(float(value)) for value in vector) + "]"


def entities_nearest(
    *,
    workspace: Workspace,
    vector: Sequence[float],
    k: int,
    min_similarity: float | None = None,
    names: Sequence[str] = (),
    scope: Scope | None = None,
) -> list[Entity]:
    """The k best entities of the workspace, in one query: those nearest to `vector` by cosine
    and those named by `names` (the low-level keywords), fused by reciprocal rank. An entity whose
    key equals a name comes first; one whose name holds all the words of a name comes next in the
    name ranking, shortest name first. Each has `.distance`, `.degree` and `.exact`. Only entities
    a chunk of a document in `scope` supports."""
    from knowledge.rag.names import entity_key

    clause, scope_params = row_clause("entity", "x.id", workspace, scope)
    nearest, nearest_params = _nearest_sql("entity", workspace=workspace, size=workspace.entity_count, scope=scope)
    phrases = [" <-> ".join(f"'{word}'" for word in search_terms(name).replace("'", "").split(" | ")) for name in names]
    params = {
        "workspace_id": workspace.pk,
        "vector": _vector_literal(vector),
        "k": k,
        "max_distance": 2.0 if min_similarity is None else 1.0 - min_similarity,
        "keys": [entity_key(name) for name in names],
        "names": " | ".join(f"({phrase})" for phrase in phrases if phrase != "''"),
        "candidates": LEXICAL_CANDIDATES,
        "rrf_k": RRF_K,
        **scope_params,
        **nearest_params,
    }
    sql = _ENTITIES_HYBRID_SQL.format(nearest=nearest, scope=clause)
    return list(Entity.objects.raw(sql, params))


def relations_nearest(
    *,
    workspace: Workspace,
    vector: Sequence[float],
    k: int,
    min_similarity: float | None = None,
    scope: Scope | None = None,
) -> list[Relation]:
    """The k relations closest to `vector`, each with `.distance`, both endpoints loaded (name,
    type, description) and their degrees as `.source_degree` and `.target_degree`; only those a
    chunk of a document in `scope` supports."""
    nearest, params = _nearest_sql("relation", workspace=workspace, size=workspace.relation_count, scope=scope)
    params |= {"workspace_id": workspace.pk, "vector": _vector_literal(vector), "k": k}
    ids = f"SELECT id FROM ({nearest}) nearest"  # noqa: S608 - fixed SQL; values are parameters
    relations = Relation.objects.filter(workspace=workspace, pk__in=RawSQL(*_positional(ids, params)))  # noqa: S611
    rows = list(
        relations.select_related("source", "target")
        .only(
            "pk",
            "workspace_id",
            "source_id",
            "target_id",
            "keywords",
            "description",
            "weight",
            *(f"{end}__{name}" for end in ("source", "target") for name in ("name", "type", "description")),
        )
        .annotate(
            source_degree=degree_of("source__"),
            target_degree=degree_of("target__"),
            distance=CosineDistance("embedding", vector),
        )
        # The subquery has chosen the k rows already: ordering them is an exact sort of k.
        .order_by("distance", "pk")
    )
    # Applied here, the similarity floor gives the same rows as in SQL without sending the vector twice.
    if min_similarity is not None:
        rows = [row for row in rows if row.distance <= 1.0 - min_similarity]
    return rows


# The candidates are ranked on ids and numbers alone; only the rows kept are joined to their text.
# Degrees are looked up per candidate: a join lets the planner hash the whole degree table.
# Only far ends come with their description: the caller has the given entities' own, and a
# hub's description repeated on each of its hundreds of relations would be most of the reply.
_RELATIONS_AROUND_SQL = """
WITH candidates AS MATERIALIZED (
    SELECT c.id, c.source_id, c.target_id, c.weight,
           coalesce((SELECT degree FROM knowledge_entitydegree WHERE entity_id = c.source_id), 0) AS source_degree,
           coalesce((SELECT degree FROM knowledge_entitydegree WHERE entity_id = c.target_id), 0) AS target_degree
    FROM knowledge_relation c
    WHERE c.workspace_id = %(workspace_id)s AND c.published
      AND (c.source_id = ANY(%(ids)s) OR c.target_id = ANY(%(ids)s)){scope}
), ranked AS (
    SELECT * FROM candidates ORDER BY source_degree + target_degree DESC, weight DESC, id LIMIT %(limit)s
)
SELECT k.id, k.source_id, k.target_id, r.keywords, r.description, k.weight,
       k.source_degree, k.target_degree, s.name, s.type, t.name, t.type,
       CASE WHEN k.source_id = ANY(%(ids)s) THEN '' ELSE s.description END,
       CASE WHEN k.target_id = ANY(%(ids)s) THEN '' ELSE t.description END
FROM ranked k
JOIN knowledge_relation r ON r.id = k.id
JOIN knowledge_entity s ON s.id = k.source_id
JOIN knowledge_entity t ON t.id = k.target_id
ORDER BY k.source_degree + k.target_degree DESC, k.weight DESC, k.id
"""

_AROUND_COLUMNS = (
    "id",
    "source_id",
    "target_id",
    "keywords",
    "description",
    "weight",
    "source_degree",
    "target_degree",
    "source_name",
    "source_type",
    "target_name",
    "target_type",
    "source_description",
    "target_description",
)


def relations_around_entities(
    *, workspace: Workspace, entity_ids: Iterable[int], limit: int, scope: Scope | None = None
) -> list[dict]:
    """The relations touching any of the entities, best first by (edge rank, weight), in one query.

    Each row is a dict with the relation's fields, both endpoints' name, type and degree
    (`source_degree`, `target_degree`; the edge rank is their sum), and the description of each
    endpoint that is not one of `entity_ids` (`source_description`, `target_description`; "" for
    those that are).
    """
    clause, scope_params = row_clause("relation", "c.id", workspace, scope)
    params = {"workspace_id": workspace.pk, "ids": list(entity_ids), "limit": limit, **scope_params}
    with connection.cursor() as cursor:
        cursor.execute(_RELATIONS_AROUND_SQL.format(scope=clause), params)
        return [dict(zip(_AROUND_COLUMNS, row, strict=True)) for row in cursor.fetchall()]


# The relations among the entities drawn, heaviest first. A hub's thousands of relations are not
# read to find the few to other drawn entities: a relation with an endpoint of few relations is
# read from that endpoint's side, and those between two hubs (entities with more relations than
# there are entities drawn) by their two ends (at 10M tokens, 2,462 index entries and 5 ms
# rather than 50,360 and 11 ms).
_AMONG_SQL = """
WITH nodes AS MATERIALIZED (
    SELECT n.id, coalesce(d.degree, 0) > cardinality(%(ids)s::bigint[]) AS hub
    FROM unnest(%(ids)s::bigint[]) n (id) LEFT JOIN knowledge_entitydegree d ON d.entity_id = n.id
), found AS MATERIALIZED (
    SELECT r.id, r.weight FROM nodes n CROSS JOIN LATERAL (
        SELECT id, weight FROM knowledge_relation
        WHERE source_id = n.id AND target_id = ANY(%(ids)s) AND workspace_id = %(workspace_id)s AND published
        UNION ALL
        SELECT id, weight FROM knowledge_relation
        WHERE target_id = n.id AND source_id = ANY(%(ids)s) AND workspace_id = %(workspace_id)s AND published
    ) r
    WHERE NOT n.hub
    UNION
    SELECT id, weight FROM knowledge_relation
    WHERE workspace_id = %(workspace_id)s AND published
      AND source_id = ANY(ARRAY(SELECT id FROM nodes WHERE hub))
      AND target_id = ANY(ARRAY(SELECT id FROM nodes WHERE hub))
), heaviest AS MATERIALIZED (
    SELECT f.id, f.weight FROM found f WHERE true{scope} ORDER BY f.weight DESC, f.id LIMIT %(limit)s
)
SELECT r.id, r.source_id, r.target_id, r.weight, r.keywords, r.description
FROM heaviest h JOIN knowledge_relation r ON r.id = h.id
ORDER BY h.weight DESC, h.id
"""
_AMONG_COLUMNS = ("id", "source_id", "target_id", "weight", "keywords", "description")


def relations_among_entities(
    *, workspace: Workspace, entity_ids: Iterable[int], limit: int, scope: Scope | None = None
) -> list[dict]:
    """The relations in `scope` whose two endpoints are both among the entities, heaviest first, in
    one query: dicts with id, source_id, target_id, weight, keywords and description."""
    ids = list(entity_ids)
    if not ids:
        return []
    clause, scope_params = row_clause("relation", "f.id", workspace, scope)
    params = {"workspace_id": workspace.pk, "ids": ids, "limit": limit, **scope_params}
    with connection.cursor() as cursor:
        cursor.execute(_AMONG_SQL.format(scope=clause), params)
        return [dict(zip(_AMONG_COLUMNS, row, strict=True)) for row in cursor.fetchall()]


# The neighbourhood a walk spreads over, in one query: the entities the seed passages mention
# (with `lead`, also those of the `lead` passages nearest to the question that the seed entities
# lead to: the second hop of a mode without a chunk search, decision 0161) and the seed
# entities, their synonyms, and for each of those entities the `fanout` passages that
# mention it nearest to the question (of the first MENTIONS_READ of its mentions, so a hub mentioned
# by thousands of passages costs a bounded number of distances, and at most MENTIONS_MEASURED
# mentions in all, so a walk costs the same in any graph). Only what is served is walked:
# published entities, passages of processed documents with their vector; and only what the
# question's scope may read (scope.py): entities an in-scope passage supports, in-scope passages.
_WALK_SQL = """
WITH unpublished AS MATERIALIZED (
    -- A few documents, read once (document_unpublished), rather than each passage's document.
    SELECT id FROM knowledge_document WHERE workspace_id = %(workspace_id)s AND status <> 'processed'
), served AS NOT MATERIALIZED (
    SELECT c.id, c.embedding FROM knowledge_chunk c
    WHERE c.workspace_id = %(workspace_id)s AND c.embedding IS NOT NULL
      AND c.document_id NOT IN (SELECT id FROM unpublished){chunk_scope}
), seeds AS MATERIALIZED (
    SELECT e.id FROM unnest(%(entity_ids)s::bigint[]) n (id) CROSS JOIN LATERAL (
        SELECT e.id FROM knowledge_entity e
        WHERE e.id = n.id AND e.workspace_id = %(workspace_id)s AND e.published{entity_scope}
        LIMIT 1
    ) e
), first AS MATERIALIZED (
    -- Without searched passages, the passages nearest to the question that the seed entities
    -- lead to lead on in their place.
    SELECT m.chunk_id AS id, min(m.distance) AS distance
    FROM seeds w CROSS JOIN LATERAL (
        SELECT c.id AS chunk_id, c.embedding <=> %(vector)s::vector AS distance
        FROM (SELECT chunk_id FROM knowledge_entitysource WHERE entity_id = w.id LIMIT %(scan)s) s
        JOIN served c ON c.id = s.chunk_id
        ORDER BY distance, c.id
        LIMIT %(fanout)s
    ) m
    WHERE %(lead)s > 0
    GROUP BY m.chunk_id
    ORDER BY min(m.distance), m.chunk_id
    LIMIT %(lead)s
), given AS MATERIALIZED (
    SELECT id, NULL::float AS distance FROM unnest(%(chunk_ids)s::bigint[]) AS t (id)
    UNION ALL
    SELECT id, distance FROM first WHERE NOT id = ANY(%(chunk_ids)s)
), hop AS MATERIALIZED (
    SELECT s.entity_id AS id FROM knowledge_entitysource s JOIN given g ON g.id = s.chunk_id
    UNION
    SELECT id FROM seeds
), synonyms AS MATERIALIZED (
    SELECT l.source_id, l.target_id FROM knowledge_entitylink l
    WHERE l.workspace_id = %(workspace_id)s
      AND (l.source_id IN (SELECT id FROM hop) OR l.target_id IN (SELECT id FROM hop))
), walked AS MATERIALIZED (
    -- Each looked up by its key: a join lets the planner hash a scan of every entity.
    SELECT e.id
    FROM (SELECT id FROM hop UNION SELECT source_id FROM synonyms UNION SELECT target_id FROM synonyms) n
    CROSS JOIN LATERAL (
        SELECT e.id FROM knowledge_entity e
        WHERE e.id = n.id AND e.workspace_id = %(workspace_id)s AND e.published{entity_scope}
        LIMIT 1
    ) e
), measured AS MATERIALIZED (
    -- The walked entities whose passages are measured against the question, the most specific
    -- first, as many as MENTIONS_MEASURED allows: counting an entity's first mentions reads only
    -- the index, measuring them reads each passage's vector.
    SELECT id FROM (
        SELECT w.id, sum(r.reads) OVER (ORDER BY r.reads, w.id) AS running
        FROM walked w CROSS JOIN LATERAL (
            SELECT count(*) AS reads
            FROM (SELECT 1 FROM knowledge_entitysource WHERE entity_id = w.id LIMIT %(scan)s) s
        ) r
    ) c
    WHERE running <= %(measured)s
)
SELECT 'M', s.entity_id, s.chunk_id, g.distance
FROM knowledge_entitysource s JOIN walked w ON w.id = s.entity_id JOIN given g ON g.id = s.chunk_id
UNION ALL
SELECT 'M', w.id, m.chunk_id, m.distance
FROM measured w CROSS JOIN LATERAL (
    SELECT c.id AS chunk_id, c.embedding <=> %(vector)s::vector AS distance
    FROM (SELECT chunk_id FROM knowledge_entitysource WHERE entity_id = w.id LIMIT %(scan)s) s
    JOIN served c ON c.id = s.chunk_id
    WHERE NOT c.id IN (SELECT id FROM given)
    ORDER BY distance, c.id
    LIMIT %(fanout)s
) m
UNION ALL
SELECT 'S', source_id, target_id, NULL FROM synonyms
WHERE source_id IN (SELECT id FROM walked) AND target_id IN (SELECT id FROM walked)
"""
# How many mentions of one entity or relation a question reads, walking or citing: a hub's
# thousands are not read whole, so a question costs the same at any corpus size.
MENTIONS_READ = 64
# How many mentions one walk measures against the question, over all the entities it walks. The
# bound above caps each entity, but a walk still grew with the corpus until most of its entities
# reached it (1.6x the edges at 10M tokens as at 1M); under this one it does not. The entities
# left out are those with the most mentions, whose passages a bridge lifts least (walk.py divides
# a bridge by the passages its entity leads to). On HotpotQA it changes nothing (decision 0174).
MENTIONS_MEASURED = 4096


@dataclass
class WalkEdges:
    """What searches.walk_edges found: (entity id, chunk id) mentions, (entity, entity) synonym
    pairs, and the question's distance to each passage reached beyond the seeds."""

    mentions: list[tuple[int, int]] = field(default_factory=list)
    synonyms: list[tuple[int, int]] = field(default_factory=list)
    distances: dict[int, float] = field(default_factory=dict)


def walk_edges(
    *,
    workspace: Workspace,
    chunk_ids: Sequence[int],
    entity_ids: Sequence[int],
    vector: Sequence[float],
    fanout: int,
    lead: int = 0,
    scope: Scope | None = None,
    measured: int = MENTIONS_MEASURED,
) -> WalkEdges:
    """The edges around the seed passages and entities that a walk spreads over, in one query;
    only entities and passages of documents in `scope`. With `lead`, the `lead` passages nearest to
    `vector` that the seed entities lead to are seed passages too (with their distance). The
    passages the walked entities lead to are measured against `vector` for at most `measured`
    mentions, the entities with the fewest first."""
    edges = WalkEdges()
    if not chunk_ids and not entity_ids:
        return edges
    entity_scope, scope_params = row_clause("entity", "e.id", workspace, scope)
    chunk_scope, _ = chunk_clause("c.document_id", workspace, scope)
    params = {
        "workspace_id": workspace.pk,
        "chunk_ids": list(chunk_ids),
        "entity_ids": list(entity_ids),
        "vector": _vector_literal(vector),
        "fanout": fanout,
        "lead": lead,
        "scan": MENTIONS_READ,
        "measured": measured,
        **scope_params,
    }
    with connection.cursor() as cursor:
        cursor.execute(_WALK_SQL.format(entity_scope=entity_scope, chunk_scope=chunk_scope), params)
        for kind, a, b, distance in cursor.fetchall():
            if kind == "S":
                edges.synonyms.append((a, b))
                continue
            edges.mentions.append((a, b))
            # A zero vector has no direction, and pgvector gives NaN for its distance: no nearness.
            if distance is not None and not math.isnan(distance):
                edges.distances[b] = distance
    return edges


# Every part reads a bounded number of rows whatever the graph's size (2026-11-28-scale-10m.md):
# the unserved chunks from their documents, at most MENTIONS_READ passages per entity and relation
# (a hub's thousands would be most of the query) plus its links into the passages given, and the
# links of each passage kept aggregated once.
_CHUNKS_SUPPORTING_SQL = """
WITH hidden AS MATERIALIZED (
    -- Chunks of documents not published yet (or failed): nothing is served from them.
    SELECT c.id FROM knowledge_document d
    CROSS JOIN LATERAL (SELECT id FROM knowledge_chunk WHERE document_id = d.id) c
    WHERE d.workspace_id = %(workspace_id)s AND (d.status <> 'processed'{scope})
), entity_rows AS (
    SELECT id, pos FROM unnest(%(entity_ids)s::bigint[]) WITH ORDINALITY AS t (id, pos)
), relation_rows AS (
    SELECT id, pos FROM unnest(%(relation_ids)s::bigint[]) WITH ORDINALITY AS t (id, pos)
), links AS MATERIALIZED (
    SELECT s.chunk_id, 'E' AS kind, r.id AS item, r.pos, d.description
    FROM entity_rows r CROSS JOIN LATERAL (
        SELECT id, chunk_id FROM knowledge_entitysource
        WHERE entity_id = r.id AND chunk_id NOT IN (SELECT id FROM hidden)
        ORDER BY id LIMIT %(scan)s
    ) s JOIN knowledge_entitysource d ON d.id = s.id
    UNION
    SELECT s.chunk_id, 'E', s.entity_id, r.pos, s.description
    FROM knowledge_entitysource s JOIN entity_rows r ON r.id = s.entity_id
    WHERE s.chunk_id = ANY(%(chunk_ids)s) AND s.chunk_id NOT IN (SELECT id FROM hidden)
    UNION
    SELECT s.chunk_id, 'R', r.id, r.pos, s.description
    FROM relation_rows r CROSS JOIN LATERAL (
        SELECT chunk_id, description FROM knowledge_relationsource
        WHERE relation_id = r.id AND chunk_id NOT IN (SELECT id FROM hidden)
        ORDER BY chunk_id LIMIT %(scan)s
    ) s
    UNION
    SELECT s.chunk_id, 'R', s.relation_id, r.pos, s.description
    FROM knowledge_relationsource s JOIN relation_rows r ON r.id = s.relation_id
    WHERE s.chunk_id = ANY(%(chunk_ids)s) AND s.chunk_id NOT IN (SELECT id FROM hidden)
), per_chunk AS (
    SELECT chunk_id, count(*) AS support, min(pos) AS first_pos FROM links GROUP BY chunk_id
), top AS (
    SELECT id AS chunk_id, place FROM unnest(%(chunk_ids)s::bigint[]) WITH ORDINALITY AS t (id, place)
    WHERE id NOT IN (SELECT id FROM hidden)
), best AS (
    SELECT DISTINCT ON (l.kind, l.item) l.chunk_id
    FROM links l JOIN per_chunk p USING (chunk_id)
    ORDER BY l.kind, l.item, p.support DESC, l.chunk_id
), wanted AS MATERIALIZED (
    SELECT chunk_id, true AS in_top, place FROM top
    UNION ALL
    SELECT chunk_id, false, NULL FROM best WHERE chunk_id NOT IN (SELECT chunk_id FROM top)
), listed AS (
    SELECT chunk_id, json_agg(json_build_array(kind, item, description) ORDER BY kind, pos) AS links
    FROM links WHERE chunk_id IN (SELECT chunk_id FROM wanted) GROUP BY chunk_id
)
SELECT c.id, c.document_id, d.title, c.char_start, c.char_end,
       CASE WHEN w.in_top THEN c.text END, c.token_count, coalesce(p.support, 0), w.in_top,
       k.links, c.section, c.location, c.page_start, c.page_end, c.anchor
FROM wanted w
LEFT JOIN per_chunk p ON p.chunk_id = w.chunk_id
LEFT JOIN listed k ON k.chunk_id = w.chunk_id
JOIN knowledge_chunk c ON c.id = w.chunk_id
JOIN knowledge_document d ON d.id = c.document_id
WHERE c.workspace_id = %(workspace_id)s
ORDER BY w.in_top DESC, w.place, p.support DESC, p.first_pos NULLS LAST, c.id
"""

_CHUNK_COLUMNS = (
    "chunk_id",
    "document_id",
    "document_title",
    "char_start",
    "char_end",
    "text",
    "token_count",
    "support",
    "in_top",
    "links",
    "section",
    "location",
    "page_start",
    "page_end",
    "anchor",
)


def chunks_supporting(
    *,
    workspace: Workspace,
    chunk_ids: Sequence[int],
    entity_ids: Sequence[int],
    relation_ids: Sequence[int],
    scope: Scope | None = None,
) -> list[dict]:
    """The given passages with their text, in their order (`in_top`), then, without text, the
    best-supported passage of every given entity and relation not among them (of its first
    MENTIONS_READ), so each can be cited; in one query. A passage's `support` is how many of the
    given entities and relations it was extracted for, and `links` lists them as (kind "E" or
    "R", id, description in that passage). Passages of documents not published, or not in
    `scope`, are left out."""
    if not chunk_ids and not entity_ids and not relation_ids:
        return []
    params = {
        "workspace_id": workspace.pk,
        "chunk_ids": list(chunk_ids),
        "entity_ids": list(entity_ids),
        "relation_ids": list(relation_ids),
        "scan": MENTIONS_READ,
    }
    clause, scope_params = hidden_clause("d.id", workspace, scope)
    params.update(scope_params)
    with connection.cursor() as cursor:
        cursor.execute(_CHUNKS_SUPPORTING_SQL.format(scope=clause), params)
        return [dict(zip(_CHUNK_COLUMNS, row, strict=True)) for row in cursor.fetchall()]
