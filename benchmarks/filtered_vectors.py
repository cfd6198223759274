"""Vector search filtered by workspace, with many workspaces sharing one table: recall@k and latency
of the ways Postgres can answer it, for `vector` and `halfvec` columns.

    .venv/bin/python benchmarks/filtered_vectors.py           # build, measure, drop the data
    .venv/bin/python benchmarks/filtered_vectors.py --keep    # keep the data afterwards
    .venv/bin/python benchmarks/filtered_vectors.py --reuse   # measure kept data again

Every entity, relation and chunk search of the app is "the k rows of this workspace nearest to the
question" on a table all workspaces share. The table here holds 1,000 workspaces whose sizes
follow a Zipf law (the largest `--largest` rows, the n-th 1/n^s of it, at least `--smallest`),
with seeded random vectors of EMBEDDING_DIM dimensions drawn around topic centres that workspaces
share (as teams share subjects), so the nearest rows of the whole table mostly belong to other
workspaces: the hard case for a filtered index scan. Questions sit near one of their workspace's
topics. Recall is against the exact float32 answer (numpy), for k = retrieval's top_k.

The strategies, each as the app's selectors write it (knowledge/rag/retrieval/searches.py):
- exact: `ORDER BY (embedding <=> q) + 0`, which the HNSW index cannot serve, so Postgres reads
  the workspace's rows through the workspace index and sorts them (the app's path for
  workspaces of at most VECTOR_EXACT_SCAN_MAX rows);
- post-filter: `ORDER BY embedding <=> q` with iterative scans off (pgvector < 0.8, the app's
  path above the threshold until now): the index yields hnsw.ef_search candidates, the filter
  keeps the workspace's, and the answer can come back short;
- relaxed / strict: the same with hnsw.iterative_scan on (pgvector 0.8): the scan goes on until
  k rows pass the filter or hnsw.max_scan_tuples were visited.
Settings are applied with SET LOCAL before the timed statement (the app sets them per
connection, so they cost it no query). Strategies are timed in turns, query by query, so load
on the machine falls on all of them alike.
"""

import argparse
import math
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import psycopg
from pgvector.psycopg import register_vector

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402

from config.embedded_postgres import embedded_server  # noqa: E402
from knowledge.rag.retrieval import DEFAULT_TOP_K  # noqa: E402

FOLDER = settings.DATA_DIR / "benchmark-filtered-postgres"
DIM = settings.EMBEDDING_DIM
TOPICS = 4_000
ROWS_PER_TOPIC = 50
NOISE = 1.0  # as benchmarks/retrieval.py: members at cosine ~0.7 from their centre
BUCKETS = ((10, 100), (100, 1_000), (1_000, 5_000), (5_000, 20_000), (20_000, 10**9))
VECTOR = ("bench_vector", "x.embedding <=> %(q)s::vector")
HALF = ("bench_half", "x.embedding <=> %(q)s::halfvec")


def exact(table: str, order: str) -> tuple[str, str]:
    return table, f"({order}) + 0"


# (name, table, order by, settings). "planner": the planner chooses between the index and the
# workspace's rows; the others force the HNSW index (enable_sort off leaves it the only way to
# give rows in distance order), so every size shows what the index scan costs and finds.
STRATEGIES = [
    ("exact", *exact(*VECTOR), {}),
    ("post-filter ef200", *VECTOR, {"ef": 200, "iterative": "off", "force": True}),
    ("relaxed ef40", *VECTOR, {"ef": 40, "iterative": "relaxed_order", "force": True}),
    ("relaxed ef100", *VECTOR, {"ef": 100, "iterative": "relaxed_order", "force": True}),
    ("relaxed ef200", *VECTOR, {"ef": 200, "iterative": "relaxed_order", "force": True}),
    ("strict ef200", *VECTOR, {"ef": 200, "iterative": "strict_order", "force": True}),
    ("planner relaxed ef200", *VECTOR, {"ef": 200, "iterative": "relaxed_order"}),
    ("half exact", *exact(*HALF), {}),
    ("half relaxed ef100", *HALF, {"ef": 100, "iterative": "relaxed_order", "force": True}),
    ("half relaxed ef200", *HALF, {"ef": 200, "iterative": "relaxed_order", "force": True}),
]


def progress(message: str, started: float) -> None:
    print(f"  [{time.perf_counter() - started:6.1f}s] {message}", flush=True)


def unit(rows: np.ndarray) -> np.ndarray:
    return (rows / np.linalg.norm(rows, axis=-1, keepdims=True)).astype(np.float32)


def literal(vector: np.ndarray) -> str:
    return "[" + ",".join(f"{value:.6f}" for value in vector) + "]"


class Corpus:
    """The workspaces' sizes, topics and vectors, all derived from the seed."""

    def __init__(self, *, workspaces: int, largest: int, smallest: int, zipf: float, seed: int = 42):
        rng = np.random.default_rng(seed)
        self.sizes = np.maximum(smallest, (largest / np.arange(1, workspaces + 1) ** zipf).astype(int))
        self.centres = unit(rng.normal(size=(TOPICS, DIM)))
        self.topics = [
            rng.choice(TOPICS, size=max(2, int(size) // ROWS_PER_TOPIC), replace=False) for size in self.sizes
        ]
        self.workspace_of = np.repeat(np.arange(workspaces), self.sizes)
        topic_of = np.concatenate(
            [rng.choice(topics, size=int(size)) for topics, size in zip(self.topics, self.sizes, strict=True)]
        )
        self.vectors = np.empty((len(topic_of), DIM), dtype=np.float32)
        for start in range(0, len(topic_of), 50_000):
            end = min(start + 50_000, len(topic_of))
            noise = rng.normal(size=(end - start, DIM)).astype(np.float32) / np.sqrt(DIM) * NOISE
            self.vectors[start:end] = unit(self.centres[topic_of[start:end]] + noise)
        self.starts = np.concatenate([[0], np.cumsum(self.sizes)])
        self.rng = rng

    def questions(self, per_bucket: int, sample: int) -> list[tuple[int, np.ndarray]]:
        """(workspace, query vector) pairs: `per_bucket` for each size bucket, spread over up to
        `sample` of its workspaces."""
        questions = []
        for low, high in BUCKETS:
            members = np.flatnonzero((self.sizes >= low) & (self.sizes < high))
            if not len(members):
                continue
            chosen = self.rng.choice(members, size=min(sample, len(members)), replace=False)
            for index in range(per_bucket):
                workspace = int(chosen[index % len(chosen)])
                centre = self.centres[self.rng.choice(self.topics[workspace])]
                noise = self.rng.normal(size=DIM).astype(np.float32) / np.sqrt(DIM) * NOISE
                questions.append((workspace, unit(centre + noise)))
        return questions

    def truth(self, workspace: int, query: np.ndarray, k: int) -> set[int]:
        start, end = self.starts[workspace], self.starts[workspace + 1]
        scores = self.vectors[start:end] @ query
        best = np.argsort(-scores)[:k]
        return {int(start + index) + 1 for index in best}  # ids start at 1


def start(shared_buffers: str) -> psycopg.Connection:
    server = embedded_server(FOLDER)
    if f"shared_buffers = '{shared_buffers}'" not in (FOLDER / "postgresql.auto.conf").read_text():
        server.psql(f"ALTER SYSTEM SET shared_buffers = '{shared_buffers}';")
        server.cleanup()
        server = embedded_server(FOLDER)
    if "(1 row)" not in server.psql("SELECT 1 FROM pg_database WHERE datname = 'filteredbench';"):
        server.psql("CREATE DATABASE filteredbench;")
    # As Django's: parameters bound on the client and nothing prepared, so every statement is
    # planned for its workspace (a prepared statement's generic plan would not know its size).
    return psycopg.connect(
        server.get_uri("filteredbench"), autocommit=True, cursor_factory=psycopg.ClientCursor, prepare_threshold=None
    )


def build(db: psycopg.Connection, corpus: Corpus, started: float, ef_construction: int = 64) -> dict:
    db.execute("DROP TABLE IF EXISTS bench_vector, bench_half")
    db.execute("CREATE EXTENSION IF NOT EXISTS vector")
    register_vector(db)
    db.execute(f"CREATE TABLE bench_vector (id bigint PRIMARY KEY, workspace_id int NOT NULL, embedding vector({DIM}))")
    with db.cursor().copy("COPY bench_vector (id, workspace_id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "int4", "vector"])
        for index, (workspace, vector) in enumerate(zip(corpus.workspace_of, corpus.vectors, strict=True)):
            copy.write_row((index + 1, int(workspace), vector))
            if (index + 1) % 50_000 == 0:
                progress(f"{index + 1:,} rows copied", started)
    db.execute(
        "CREATE TABLE bench_half AS "  # noqa: S608
        f"SELECT id, workspace_id, embedding::halfvec({DIM}) AS embedding FROM bench_vector"
    )
    db.execute("ALTER TABLE bench_half ADD PRIMARY KEY (id)")
    db.execute("SET maintenance_work_mem = '2GB'")
    timings = {}
    for table, opclass in (("bench_vector", "vector_cosine_ops"), ("bench_half", "halfvec_cosine_ops")):
        db.execute(f"CREATE INDEX {table}_workspace ON {table} (workspace_id)")
        begun = time.perf_counter()
        # The app's index: m 16, ef_construction 64, cosine (knowledge.models.embedding_index),
        # unless --ef-construction asks what a cheaper build would cost in recall.
        db.execute(
            f"CREATE INDEX {table}_hnsw ON {table} USING hnsw (embedding {opclass}) "
            f"WITH (m = 16, ef_construction = {int(ef_construction)})"
        )
        timings[table] = time.perf_counter() - begun
        progress(f"{table}: HNSW built in {timings[table]:.0f} s", started)
        db.execute(f"VACUUM ANALYZE {table}")
    return timings


def _configure(db: psycopg.Connection, options: dict) -> None:
    db.execute(f"SET LOCAL hnsw.iterative_scan = {options.get('iterative', 'off')}")
    db.execute(f"SET LOCAL hnsw.ef_search = {options.get('ef', 200)}")
    if options.get("force"):
        db.execute("SET LOCAL enable_sort = off")


def _statement(table: str, order: str) -> str:
    return (
        f"SELECT x.id FROM {table} x WHERE x.workspace_id = %(w)s AND x.embedding IS NOT NULL "  # noqa: S608
        f"ORDER BY {order} LIMIT %(k)s"
    )


def search(db: psycopg.Connection, strategy: tuple, workspace: int, query: str, k: int) -> tuple[list[int], float]:
    _, table, order, options = strategy
    with db.transaction():
        _configure(db, options)
        begun = time.perf_counter()
        rows = db.execute(_statement(table, order), {"w": workspace, "q": query, "k": k}).fetchall()
        elapsed = (time.perf_counter() - begun) * 1000
    return [row[0] for row in rows], elapsed


def uses_hnsw(db: psycopg.Connection, strategy: tuple, workspace: int, query: str, k: int) -> bool:
    _, table, order, options = strategy
    with db.transaction():
        _configure(db, options)
        plan = db.execute("EXPLAIN " + _statement(table, order), {"w": workspace, "q": query, "k": k}).fetchall()
    return any("_hnsw" in line for (line,) in plan)


def bucket_of(size: int) -> str:
    for low, high in BUCKETS:
        if low <= size < high:
            return f"{low:,}-{high - 1:,}" if high < 10**9 else f"{low:,}+"
    return "?"


def measure(db: psycopg.Connection, corpus: Corpus, questions: list, k: int, started: float) -> None:
    literals = [(workspace, literal(query)) for workspace, query in questions]
    for workspace, query in literals:  # warm-up: every strategy reads what it will read
        for strategy in STRATEGIES:
            search(db, strategy, workspace, query, k)
    progress("warmed up", started)
    results = {}  # (bucket, strategy name) -> lists
    plans = {}  # (workspace, strategy name) -> whether the plan scans the HNSW index
    for turn, ((workspace, query), (_, vector)) in enumerate(zip(literals, questions, strict=True)):
        size = int(corpus.sizes[workspace])
        truth = corpus.truth(workspace, vector, k)
        wanted = min(k, size)
        for offset in range(len(STRATEGIES)):
            strategy = STRATEGIES[(turn + offset) % len(STRATEGIES)]
            ids, elapsed = search(db, strategy, workspace, query, k)
            entry = results.setdefault((bucket_of(size), strategy[0]), {"recall": [], "ms": [], "hnsw": []})
            entry["recall"].append(len(truth & set(ids)) / wanted)
            entry["ms"].append(elapsed)
            if (workspace, strategy[0]) not in plans:
                plans[workspace, strategy[0]] = uses_hnsw(db, strategy, workspace, query, k)
            entry["hnsw"].append(plans[workspace, strategy[0]])
    progress("measured", started)
    print(f"\nrecall@{k} (mean / min), latency p50 / p95 ms, share of plans on the HNSW index")
    print(f"{'workspace rows':>15} {'strategy':22} {'recall':>7} {'min':>6} {'p50':>7} {'p95':>7} {'hnsw':>5} {'n':>4}")
    for low, _ in BUCKETS:
        bucket = bucket_of(low)
        for name, *_ in STRATEGIES:
            entry = results.get((bucket, name))
            if entry is None:
                continue
            ms = sorted(entry["ms"])
            p95 = ms[min(len(ms) - 1, math.ceil(0.95 * len(ms)) - 1)]
            print(
                f"{bucket:>15} {name:22} {statistics.mean(entry['recall']):7.3f} {min(entry['recall']):6.3f} "
                f"{statistics.median(ms):7.1f} {p95:7.1f} {statistics.mean(entry['hnsw']):5.2f} {len(ms):4}"
            )


def sizes(db: psycopg.Connection) -> None:
    print("\nrelation sizes (MB)")
    for name in ("bench_vector", "bench_vector_hnsw", "bench_half", "bench_half_hnsw"):
        megabytes = db.execute("SELECT pg_total_relation_size(%s) / 1e6", (name,)).fetchone()[0]
        if not name.endswith("_hnsw"):
            indexes = db.execute("SELECT pg_indexes_size(%s) / 1e6", (name,)).fetchone()[0]
            megabytes -= indexes
        print(f"  {name:20} {megabytes:9.1f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workspaces", type=int, default=1_000)
    parser.add_argument("--largest", type=int, default=40_000, help="rows of the largest workspace")
    parser.add_argument("--smallest", type=int, default=10, help="rows of the smallest workspaces")
    parser.add_argument("--zipf", type=float, default=1.0, help="exponent s of the size law")
    parser.add_argument("--per-bucket", type=int, default=60, help="questions per size bucket")
    parser.add_argument("--sample", type=int, default=20, help="workspaces per size bucket asked")
    parser.add_argument("--k", type=int, default=DEFAULT_TOP_K)
    parser.add_argument("--shared-buffers", default="2GB")
    parser.add_argument("--ef-construction", type=int, default=64, help="the HNSW build's beam (the app's: 64)")
    parser.add_argument("--keep", action="store_true")
    parser.add_argument("--reuse", action="store_true")
    arguments = parser.parse_args()
    started = time.perf_counter()
    corpus = Corpus(
        workspaces=arguments.workspaces, largest=arguments.largest, smallest=arguments.smallest, zipf=arguments.zipf
    )
    print(
        f"{arguments.workspaces} workspaces, {len(corpus.vectors):,} rows of {DIM} dimensions "
        f"(largest {corpus.sizes[0]:,}, median {int(np.median(corpus.sizes)):,}, smallest {corpus.sizes[-1]:,}), "
        f"k = {arguments.k}",
        flush=True,
    )
    db = start(arguments.shared_buffers)
    try:
        version = db.execute(
            "SELECT current_setting('server_version'), extversion FROM pg_extension WHERE extname = 'vector'"
        ).fetchone()
        if not arguments.reuse or version is None:
            timings = build(db, corpus, started, arguments.ef_construction)
            print("HNSW build seconds: " + ", ".join(f"{table} {seconds:.0f}" for table, seconds in timings.items()))
            version = db.execute(
                "SELECT current_setting('server_version'), extversion FROM pg_extension WHERE extname = 'vector'"
            ).fetchone()
        print(f"Postgres {version[0]}, pgvector {version[1]}, hnsw.max_scan_tuples default", flush=True)
        sizes(db)
        measure(db, corpus, corpus.questions(arguments.per_bucket, arguments.sample), arguments.k, started)
    finally:
        db.close()
        embedded_server(FOLDER).cleanup()
        if not arguments.keep:
            shutil.rmtree(FOLDER, ignore_errors=True)


if __name__ == "__main__":
    main()
