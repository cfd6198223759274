"""Context-build latency of every retrieval mode on a synthetic graph of LightRAG's scale.

    .venv/bin/python benchmarks/retrieval.py            # build, measure, drop the database
    .venv/bin/python benchmarks/retrieval.py --keep     # keep the benchmark database afterwards
    .venv/bin/python benchmarks/retrieval.py --reuse    # measure on the kept database (no rebuild)

The graph (100,000 entities, 300,000 relations, 25,000 chunks of about 1,200 tokens, their
provenance rows and random unit vectors in clusters, so nearest neighbours clear the similarity
floor the way real embeddings do) lives in its own database next to the project's, built with
binary COPY and indexed afterwards; nothing touches the project's data. Degrees follow a
power law, so some retrieved entities are hubs with hundreds of relations.

Model calls are excluded: every query passes its keywords (a real entity's name among the
low-level ones) and precomputed query vectors, so the numbers are the database work (vector and
full-text searches), ranking, token counting and context formatting of retrieve(). Each
question names two words of the corpus, as a real question names terms of its documents.
"""

import argparse
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402
from django.utils import timezone  # noqa: E402

from knowledge.models import Chunk, Document, Entity, EntityVector, RelationVector, Workspace, vector_type  # noqa: E402
from knowledge.rag.graph.vectors import INDEXED_VECTOR_MODELS, hnsw_index  # noqa: E402
from knowledge.rag.retrieval import Keywords, QueryVectors, retrieve  # noqa: E402
from knowledge.services.workspaces import workspace_refresh_counts  # noqa: E402

ENTITIES = 100_000
RELATIONS = 300_000
CHUNKS = 25_000
DOCUMENTS = 1_000
CLUSTERS = 2_000
# Each vector is its cluster's centre plus noise of the same length: members sit at cosine
# ~0.7 from the centre and ~0.5 from each other, like related passages under a real model.
NOISE = 1.0
DIM = settings.EMBEDDING_DIM
MODES = ("local", "global", "hybrid", "mix", "naive")

rng = np.random.default_rng(42)
SYLLABLES = [a + b for a in "bdfgklmnprstvz" for b in ("a", "e", "i", "o", "u", "an", "er", "on")]


def words(count: int) -> str:
    picks = rng.integers(0, len(SYLLABLES), size=(count, 2))
    return " ".join(SYLLABLES[a] + SYLLABLES[b] for a, b in picks)


def unit_rows(centres: np.ndarray, count: int) -> np.ndarray:
    noise = rng.normal(size=(count, DIM)).astype(np.float32) / np.sqrt(DIM) * NOISE
    rows = centres[rng.integers(0, len(centres), size=count)] + noise
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def unit_centres() -> np.ndarray:
    centres = rng.normal(size=(CLUSTERS, DIM)).astype(np.float32)
    return centres / np.linalg.norm(centres, axis=1, keepdims=True)


def progress(message: str, started: float) -> None:
    print(f"  [{time.perf_counter() - started:6.1f}s] {message}", flush=True)


def copy_rows(table: str, columns: list[str], types: list[str], rows, started: float) -> None:
    raw = connection.connection
    with raw.cursor() as cursor:
        quoted = ", ".join(f'"{column}"' for column in columns)
        with cursor.copy(f"COPY {table} ({quoted}) FROM STDIN WITH (FORMAT BINARY)") as copy:
            copy.set_types(types)
            for count, row in enumerate(rows, 1):
                copy.write_row(row)
                if count % 100_000 == 0:
                    progress(f"{table}: {count:,} rows", started)


def power_law_pairs(count: int) -> np.ndarray:
    """Unique unordered entity pairs whose endpoints follow a power law (a few hubs)."""
    weights = 1.0 / np.arange(1, ENTITIES + 1) ** 0.6
    weights /= weights.sum()
    order = rng.permutation(ENTITIES) + 1
    pairs = np.empty((0, 2), dtype=np.int64)
    while len(pairs) < count:
        drawn = order[rng.choice(ENTITIES, size=(count, 2), p=weights)]
        drawn = drawn[drawn[:, 0] != drawn[:, 1]]
        drawn.sort(axis=1)
        pairs = np.unique(np.vstack([pairs, drawn]), axis=0)
    return pairs[rng.permutation(len(pairs))[:count]]


def build(workspace: Workspace, started: float) -> dict:
    from pgvector.psycopg import register_vector

    register_vector(connection.connection)
    now = timezone.now()
    with connection.cursor() as cursor:
        cursor.execute("SET maintenance_work_mem = '2GB'")
        cursor.execute("SET max_parallel_maintenance_workers = 1")
        # The indexes a question searches (entities and relations through their vector copies,
        # decision 0156) are built once after the copy: the copies' triggers would otherwise
        # insert 400,000 rows into HNSW one at a time.
        for model in INDEXED_VECTOR_MODELS:
            cursor.execute(f"DROP INDEX IF EXISTS {hnsw_index(model).name}")

    documents = Document.objects.bulk_create(
        Document(workspace=workspace, title=f"Report {n}", content_hash=f"bench-{n}", status="processed")
        for n in range(DOCUMENTS)
    )
    document_ids = [document.pk for document in documents]
    progress(f"{DOCUMENTS:,} documents", started)

    chunk_centres, entity_centres, relation_centres = unit_centres(), unit_centres(), unit_centres()
    chunk_vectors = unit_rows(chunk_centres, CHUNKS)
    per_document = CHUNKS // DOCUMENTS
    copy_rows(
        "knowledge_chunk",
        ["id", "workspace_id", "document_id", "order", "text", "token_count", "char_start", "char_end", "embedding"]
        + ["section", "location", "anchor"],
        ["int8", "int8", "int8", "int4", "text", "int4", "int4", "int4", "vector", "text", "text", "text"],
        (
            (n + 1, workspace.pk, document_ids[n // per_document], n % per_document, text, 1200, 0, len(text), vector)
            + ("", "", "")
            for n, vector in enumerate(chunk_vectors)
            for text in [words(580)]
        ),
        started,
    )
    progress(f"{CHUNKS:,} chunks", started)

    entity_vectors = unit_rows(entity_centres, ENTITIES)
    types = ["person", "organization", "location", "event", "concept", "technology"]
    copy_rows(
        "knowledge_entity",
        ["id", "workspace_id", "name", "key", "type", "description", "embedding", "published"]
        + ["created_at", "updated_at"],
        ["int8", "int8", "text", "text", "text", "text", "vector", "bool", "timestamptz", "timestamptz"],
        (
            (n + 1, workspace.pk, name, name.lower(), types[n % len(types)], words(30), vector, True, now, now)
            for n, vector in enumerate(entity_vectors)
            for name in [f"Entity {n + 1} {words(1)}"]
        ),
        started,
    )
    progress(f"{ENTITIES:,} entities", started)

    entity_chunks = rng.integers(1, CHUNKS + 1, size=(ENTITIES + 1, 3))
    entity_chunk_count = rng.integers(1, 4, size=ENTITIES + 1)
    copy_rows(
        "knowledge_entitysource",
        ["entity_id", "chunk_id", "name", "type", "description"],
        ["int8", "int8", "text", "text", "text"],
        (
            (entity, int(chunk), "", "", words(12))
            for entity in range(1, ENTITIES + 1)
            for chunk in set(entity_chunks[entity, : entity_chunk_count[entity]].tolist())
        ),
        started,
    )
    progress("entity provenance", started)

    pairs = power_law_pairs(RELATIONS)
    progress(f"{RELATIONS:,} power-law pairs", started)
    relation_vectors = unit_rows(relation_centres, RELATIONS)
    weights = rng.integers(1, 10, size=RELATIONS).astype(float)
    copy_rows(
        "knowledge_relation",
        ["id", "workspace_id", "source_id", "target_id", "keywords", "description", "weight", "embedding"]
        + ["published", "created_at", "updated_at"],
        ["int8", "int8", "int8", "int8", "text", "text", "float8", "vector", "bool", "timestamptz", "timestamptz"],
        (
            (n + 1, workspace.pk, int(pairs[n, 0]), int(pairs[n, 1]), words(3), words(20), weights[n], vector, True)
            + (now, now)
            for n, vector in enumerate(relation_vectors)
        ),
        started,
    )
    # A relation is extracted from a chunk that mentions its source entity, as in real text.
    copy_rows(
        "knowledge_relationsource",
        ["relation_id", "chunk_id", "description", "keywords", "strength"],
        ["int8", "int8", "text", "text", "float8"],
        ((n + 1, int(entity_chunks[pairs[n, 0], 0]), words(10), "", 1.0) for n in range(RELATIONS)),
        started,
    )
    progress("relations and their provenance", started)
    count_per_document()
    progress("counts per document", started)

    with connection.cursor() as cursor:
        # Rows were copied with explicit ids; later inserts must continue after them.
        cursor.execute("SELECT setval(pg_get_serial_sequence('knowledge_chunk', 'id'), %s)", [CHUNKS])
        cursor.execute("SELECT setval(pg_get_serial_sequence('knowledge_entity', 'id'), %s)", [ENTITIES])
        cursor.execute("SELECT setval(pg_get_serial_sequence('knowledge_relation', 'id'), %s)", [RELATIONS])
    with connection.schema_editor() as editor:
        for model in INDEXED_VECTOR_MODELS:
            editor.add_index(model, hnsw_index(model))
            progress(f"HNSW index on {model._meta.db_table}", started)
    workspace_refresh_counts(workspace_id=workspace.pk)
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")
    progress("vacuum analyze", started)
    return {"entities": entity_centres, "relations": relation_centres, "chunks": chunk_centres}


def count_per_document() -> None:
    """Each document's chunks, and the entities and relations its chunks support, as publishing
    counts them (a scoped search sizes its scope by them)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            UPDATE knowledge_document d SET
                chunk_count = (SELECT count(*) FROM knowledge_chunk c WHERE c.document_id = d.id),
                entity_count = (SELECT count(DISTINCT s.entity_id) FROM knowledge_entitysource s
                                JOIN knowledge_chunk c ON c.id = s.chunk_id WHERE c.document_id = d.id),
                relation_count = (SELECT count(DISTINCT s.relation_id) FROM knowledge_relationsource s
                                  JOIN knowledge_chunk c ON c.id = s.chunk_id WHERE c.document_id = d.id)
            """
        )


_WARM_UP = {
    kind: f"SELECT id FROM {model._meta.db_table} ORDER BY embedding <=> %s::{vector_type(model)} LIMIT 10"  # noqa: S608
    for kind, model in (("entities", EntityVector), ("relations", RelationVector), ("chunks", Chunk))
}


# Tables (read through their primary key, so the pages stay in shared_buffers: a sequential
# scan of a table past a quarter of them reads through a small ring instead) and the indexes
# that retrieval walks.
_WARM_TABLES = {
    "knowledge_entity": "description",
    "knowledge_relation": "description",
    "knowledge_chunk": "text",
    "knowledge_entitysource": "description",
    "knowledge_relationsource": "description",
    "knowledge_entitydegree": "degree",
    "knowledge_document": "title",
}
_WARM_INDEXES = {
    "knowledge_relation": ("source_id", "target_id"),
    "knowledge_entitysource": ("entity_id", "chunk_id"),
    "knowledge_relationsource": ("relation_id", "chunk_id"),
}


def warm_up(centres: dict, started: float) -> None:
    """Bring what retrieval reads into shared_buffers, as a server in use has it (the embedded
    build has no pg_prewarm): every table and the indexes it walks, and the HNSW indexes by
    one wide search from every cluster centre."""
    with connection.cursor() as cursor:
        cursor.execute("SET enable_seqscan = off")
        cursor.execute("SET enable_bitmapscan = off")
        for table, column in _WARM_TABLES.items():
            key = "entity_id" if table == "knowledge_entitydegree" else "id"
            cursor.execute(f"SELECT sum(length({column}::text)) FROM {table} WHERE {key} > 0")  # noqa: S608
        for table, columns in _WARM_INDEXES.items():
            for column in columns:
                cursor.execute(f"SELECT count(*) FROM {table} WHERE {column} > 0")  # noqa: S608
        # The full-text columns (their TOASTed tsvectors), where the schema has them; the GIN indexes
        # warm with each mode's first queries.
        for table in ("knowledge_chunk", "knowledge_entity"):
            cursor.execute(
                "SELECT 1 FROM information_schema.columns WHERE table_name = %s AND column_name = 'search'", [table]
            )
            if cursor.fetchone():
                cursor.execute(f"ANALYZE {table}")
                cursor.execute(f"SELECT sum(length(search)) FROM {table} WHERE id > 0")  # noqa: S608
        cursor.execute("RESET enable_seqscan")
        cursor.execute("RESET enable_bitmapscan")
        cursor.execute("SET hnsw.ef_search = 400")
        for kind, sql in _WARM_UP.items():
            for centre in centres[kind]:
                cursor.execute(sql, [str(centre.tolist())])
        cursor.execute(f"SET hnsw.ef_search = {int(settings.HNSW_EF_SEARCH)}")
    progress("warmed up the tables and indexes", started)


def measure(workspace: Workspace, centres: dict, runs: int, modes: list[str]) -> None:
    # Questions and keywords name things the corpus has: two of its words (each in about 4% of
    # the chunks, so the full-text search has a thousand matches to rank) and an entity's name.
    names = list(Entity.objects.filter(workspace=workspace).order_by("?").values_list("name", flat=True)[:500])

    # Called like functions, so the chunk search takes them for identifiers and searches the text.
    def question() -> str:
        return f"What does {words(1)}() say about {words(1)}()?"

    def keywords() -> Keywords:
        return Keywords(high_level=("market strategy",), low_level=(names[rng.integers(len(names))], "Report"))

    def vectors() -> QueryVectors:
        return QueryVectors(
            low_level=unit_rows(centres["entities"], 1)[0].tolist(),
            high_level=unit_rows(centres["relations"], 1)[0].tolist(),
            question=unit_rows(centres["chunks"], 1)[0].tolist(),
        )

    print(f"\n{'mode':8} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8} {'entities':>9} {'relations':>10} {'chunks':>7}")
    for mode in modes:
        for _ in range(50):  # the pages this mode reads into shared_buffers, as in a server in use
            retrieve(workspace=workspace, question=question(), mode=mode, keywords=keywords(), vectors=vectors())
        latencies, stages, last = [], {}, None
        for _ in range(runs):
            asked, query_keywords, query_vectors = question(), keywords(), vectors()
            started = time.perf_counter()
            last = retrieve(
                workspace=workspace, question=asked, mode=mode, keywords=query_keywords, vectors=query_vectors
            )
            latencies.append((time.perf_counter() - started) * 1000)
            for stage, ms in last.stats["timings"].items():
                stages.setdefault(stage, []).append(ms)
        p50 = statistics.median(latencies)
        p95 = statistics.quantiles(latencies, n=20)[-1]
        print(
            f"{mode:8} {p50:8.1f} {p95:8.1f} {last.stats['sql_queries']:8} {len(last.entities):9} "
            f"{len(last.relations):10} {len(last.chunks):7}"
        )
        medians = ", ".join(f"{stage} {statistics.median(ms):.1f}" for stage, ms in stages.items())
        print(f"         median per stage (ms): {medians}")


def compare_searches(workspace: Workspace, centres: dict, runs: int) -> None:
    """The searches that hybrid retrieval changed, old and new statement taken in turns, so both
    see the same load: the chunk search (vector only, as before, against vector + full text in
    one statement) and the entity search (vector only against vector + name lookup)."""
    from knowledge.models import Chunk
    from knowledge.rag.retrieval.searches import _nearest, chunks_nearest, degree_of, entities_nearest

    names = list(Entity.objects.filter(workspace=workspace).order_by("?").values_list("name", flat=True)[:500])
    floor = settings.RETRIEVAL_MIN_SIMILARITY

    def old_chunks(vector, text, name):
        return _nearest(
            Chunk.objects.filter(workspace=workspace)
            .select_related("document")
            .only(
                "pk",
                "workspace_id",
                "document_id",
                "order",
                "text",
                "token_count",
                "char_start",
                "char_end",
                "document__title",
            ),
            size=workspace.chunk_count,
            vector=vector,
            k=20,
            min_similarity=floor,
        )

    def old_entities(vector, text, name):
        return _nearest(
            Entity.objects.filter(workspace=workspace)
            .only("pk", "workspace_id", "key", "name", "type", "description")
            .annotate(degree=degree_of()),
            size=workspace.entity_count,
            vector=vector,
            k=40,
            min_similarity=floor,
        )

    pairs = {
        "chunks": (
            old_chunks,
            lambda vector, text, name: chunks_nearest(
                workspace=workspace, vector=vector, text=text, k=20, min_similarity=floor
            ),
            "chunks",
        ),
        "entities": (
            old_entities,
            lambda vector, text, name: entities_nearest(
                workspace=workspace, vector=vector, names=[name, "Report"], k=40, min_similarity=floor
            ),
            "entities",
        ),
    }
    print(f"\n{'search':9} {'old p50':>8} {'new p50':>8} {'paired p50 diff':>16} {'new p95':>8}   ({runs} pairs, ms)")
    for label, (old, new, kind) in pairs.items():
        timings = {"old": [], "new": []}
        for index in range(runs + 20):
            vector = unit_rows(centres[kind], 1)[0].tolist()
            text, name = f"What does {words(1)}() say about {words(1)}()?", names[index % len(names)]
            for which, call in (("old", old), ("new", new)) if index % 2 else (("new", new), ("old", old)):
                started = time.perf_counter()
                call(vector, text, name)
                if index >= 20:  # the first ones warm the pages this search reads
                    timings[which].append((time.perf_counter() - started) * 1000)
        differences = [new_ms - old_ms for old_ms, new_ms in zip(timings["old"], timings["new"], strict=True)]
        print(
            f"{label:9} {statistics.median(timings['old']):8.1f} {statistics.median(timings['new']):8.1f} "
            f"{statistics.median(differences):16.1f} {statistics.quantiles(timings['new'], n=20)[-1]:8.1f}"
        )


SCOPES = {"5%": 0.05, "50%": 0.5}
_VECTOR_SQL = """
SELECT x.id FROM knowledge_{table} x
WHERE x.workspace_id = %(workspace_id)s AND x.embedding IS NOT NULL{scope}
ORDER BY (x.embedding <=> %(vector)s::vector){exact}
LIMIT %(k)s
"""


def measure_scopes(workspace: Workspace, centres: dict, runs: int, modes: list[str]) -> None:
    """Scoped questions: documents tagged so that 5% and 50% of them are in scope; per scope, the
    latency of each mode, and the recall of the product's scoped vector searches (chunks, entities,
    relations) against an exact scan with the same filter."""
    from knowledge.rag.retrieval.scope import Scope, chunk_clause, row_clause
    from knowledge.rag.retrieval.searches import chunks_nearest, entities_nearest, relations_nearest

    ids = list(Document.objects.filter(workspace=workspace).order_by("pk").values_list("pk", flat=True))
    chooser = np.random.default_rng(7)  # the same documents in scope on a kept graph, run after run
    for tag, share in SCOPES.items():
        chosen = chooser.choice(ids, size=max(int(len(ids) * share), 1), replace=False).tolist()
        with connection.cursor() as cursor:  # a kept graph is tagged afresh
            cursor.execute("UPDATE knowledge_document SET tags = array_remove(tags, %s)", [tag])
            cursor.execute(
                "UPDATE knowledge_document SET tags = array_append(tags, %s) WHERE id = ANY(%s)", [tag, chosen]
            )
    names = list(Entity.objects.filter(workspace=workspace).order_by("?").values_list("name", flat=True)[:500])
    print(f"\n{'scope':6} {'mode':8} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8} {'chunks':>7}")
    for label, scope in [("all", None), *((tag, Scope(tags=(tag,))) for tag in SCOPES)]:
        for mode in modes:
            latencies, last = [], None
            for index in range(runs + 20):
                question = f"What does {words(1)}() say about {words(1)}()?"
                keywords = Keywords(high_level=("market strategy",), low_level=(names[rng.integers(len(names))],))
                vectors = QueryVectors(
                    low_level=unit_rows(centres["entities"], 1)[0].tolist(),
                    high_level=unit_rows(centres["relations"], 1)[0].tolist(),
                    question=unit_rows(centres["chunks"], 1)[0].tolist(),
                )
                started = time.perf_counter()
                last = retrieve(
                    workspace=workspace, question=question, mode=mode, keywords=keywords, vectors=vectors, scope=scope
                )
                if index >= 20:  # the first ones warm this scope's pages
                    latencies.append((time.perf_counter() - started) * 1000)
            p50, p95 = statistics.median(latencies), statistics.quantiles(latencies, n=20)[-1]
            print(f"{label:6} {mode:8} {p50:8.1f} {p95:8.1f} {last.stats['sql_queries']:8} {len(last.chunks):7}")
    # The product's own searches (vector side only: no words, no names) against an exact scan with
    # the same filter, written here.
    print(f"\n{'scope':6} {'search':8} {'recall@k':>9} {'rows':>6} {'search ms':>9} {'exact ms':>9}")
    searches = {
        "chunk": lambda vector, k, scope: [
            row.pk
            for row in chunks_nearest(workspace=workspace, vector=vector, k=k, scope=scope)
            if row.distance is not None
        ],
        "entity": lambda vector, k, scope: [
            row.pk for row in entities_nearest(workspace=workspace, vector=vector, k=k, scope=scope)
        ],
        "relation": lambda vector, k, scope: [
            row.pk for row in relations_nearest(workspace=workspace, vector=vector, k=k, scope=scope)
        ],
    }
    for label, scope in [(tag, Scope(tags=(tag,))) for tag in SCOPES]:
        for table, k, clause in (
            ("chunk", 20, chunk_clause("x.document_id", workspace, scope)),
            ("entity", 40, row_clause("entity", "x.id", workspace, scope)),
            ("relation", 40, row_clause("relation", "x.id", workspace, scope)),
        ):
            recalls, found, fast, slow = [], [], [], []
            centre = {"chunk": "chunks", "entity": "entities", "relation": "relations"}[table]
            for _ in range(min(runs, 50)):
                vector = unit_rows(centres[centre], 1)[0].tolist()
                params = {"workspace_id": workspace.pk, "vector": str(vector), "k": k, **clause[1]}
                started = time.perf_counter()
                approximate = set(searches[table](vector, k, scope))
                middle = time.perf_counter()
                with connection.cursor() as cursor:
                    cursor.execute(_VECTOR_SQL.format(table=table, scope=clause[0], exact=" + 0"), params)
                    exact = {row[0] for row in cursor.fetchall()}
                ended = time.perf_counter()
                recalls.append(len(approximate & exact) / max(len(exact), 1))
                found.append(len(approximate))
                fast.append((middle - started) * 1000)
                slow.append((ended - middle) * 1000)
            print(
                f"{label:6} {table:8} {statistics.mean(recalls):9.3f} {statistics.mean(found):6.1f} "
                f"{statistics.median(fast):9.1f} {statistics.median(slow):9.1f}"
            )


def start_server(folder: Path, shared_buffers: str) -> None:
    """Point Django at a Postgres of its own in `folder`, with room for the HNSW indexes in
    shared_buffers: a search that reads index pages from the OS page cache is ten times slower."""
    from config.embedded_postgres import embedded_database, embedded_server

    config = embedded_database(folder)
    if f"shared_buffers = '{shared_buffers}'" not in (folder / "postgresql.auto.conf").read_text():
        server = embedded_server(folder)
        server.psql(f"ALTER SYSTEM SET shared_buffers = '{shared_buffers}';")
        server.cleanup()
        config = embedded_database(folder)
    connection.close()
    connection.settings_dict.update({name: config[name] for name in ("NAME", "USER", "PASSWORD", "HOST", "PORT")})


def stop_server(folder: Path) -> None:
    from config.embedded_postgres import embedded_server

    connection.close()
    embedded_server(folder).cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep the benchmark server's data afterwards")
    parser.add_argument("--reuse", action="store_true", help="measure on kept data (no rebuild)")
    parser.add_argument("--runs", type=int, default=200, help="queries per mode (default 200)")
    parser.add_argument("--scale", type=float, default=1.0, help="fraction of the full graph to build (default 1)")
    parser.add_argument("--shared-buffers", default="2GB", help="the benchmark server's shared_buffers (default 2GB)")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated modes (default {','.join(MODES)})")
    parser.add_argument(
        "--compare-searches",
        action="store_true",
        help="instead of the modes, time the vector-only and the hybrid searches in turns (same load for both)",
    )
    parser.add_argument(
        "--scopes",
        action="store_true",
        help="instead of the modes alone, scoped questions (5%% and 50%% of the documents): latency and recall",
    )
    args = parser.parse_args()
    global ENTITIES, RELATIONS, CHUNKS, DOCUMENTS, CLUSTERS
    ENTITIES, RELATIONS, CHUNKS = int(ENTITIES * args.scale), int(RELATIONS * args.scale), int(CHUNKS * args.scale)
    DOCUMENTS, CLUSTERS = max(int(DOCUMENTS * args.scale), 1), max(int(CLUSTERS * args.scale), 1)

    folder = Path(settings.DATA_DIR) / "benchmark-postgres"
    started = time.perf_counter()
    print(f"Benchmark server in {folder} (shared_buffers {args.shared_buffers})", flush=True)
    start_server(folder, args.shared_buffers)
    try:
        call_command("migrate", verbosity=0)
        workspace = Workspace.objects.filter(slug="benchmark").first()
        centres_file = folder.parent / "benchmark_centres.npy"
        if workspace is None or not args.reuse or not centres_file.exists():
            Workspace.objects.filter(slug="benchmark").delete()
            workspace = Workspace.objects.create(name="Benchmark", slug="benchmark")
            centres = build(workspace, started)
            np.save(centres_file, np.stack([centres["entities"], centres["relations"], centres["chunks"]]))
        else:
            entities, relations, chunks = np.load(centres_file)
            centres = {"entities": entities, "relations": relations, "chunks": chunks}
        workspace.refresh_from_db()
        if not args.compare_searches:  # taken in turns, old and new statements see the same cache
            warm_up(centres, started)
        print(
            f"\n{workspace.entity_count:,} entities, {workspace.relation_count:,} relations, "
            f"{workspace.chunk_count:,} chunks; top_k 40, chunk_top_k 20, hnsw.ef_search {settings.HNSW_EF_SEARCH}, "
            f"exact scan up to {settings.VECTOR_EXACT_SCAN_MAX:,} rows; {args.runs} queries per mode"
        )
        if args.compare_searches:
            compare_searches(workspace, centres, args.runs)
        elif args.scopes:
            measure_scopes(workspace, centres, args.runs, args.modes.split(","))
        else:
            measure(workspace, centres, args.runs, args.modes.split(","))
    finally:
        stop_server(folder)
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
            (folder.parent / "benchmark_centres.npy").unlink(missing_ok=True)


if __name__ == "__main__":
    main()
