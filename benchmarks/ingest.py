"""The ingestion pipeline's own overhead, with a model double that answers instantly.

    .venv/bin/python benchmarks/ingest.py                  # ~1M corpus tokens (the default)
    .venv/bin/python benchmarks/ingest.py --tokens 200000  # a quicker run

A synthetic corpus whose entity frequencies follow a power law (the most frequent entities
appear in hundreds of chunks) is ingested document by document in this process, exactly as
a worker would (document_create + document_ingest: chunk, embed, extract with gleaning,
merge, summarize, re-embed). The OpenAI double runs in a child process on the other core
and answers chat (extraction, gleaning, summaries) and embeddings from the text at once.

Prints corpus tokens/s, chunks/s, entity mentions merged/s and the peak memory of this
process. It runs in a database of its own (the test database name with suffix _bench_ingest),
created and migrated at the start and dropped at the end unless --keep.
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


def serve_double(ready, dim: int) -> None:
    from tests.openai_double import OpenAIDouble

    double = OpenAIDouble(dim=dim).start()
    double.reply(answer)
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1_000_000, help="Corpus size in tokens (default 1M).")
    parser.add_argument("--document-tokens", type=int, default=20_000, help="Tokens per document.")
    parser.add_argument("--entities", type=int, default=5_000, help="Distinct entities in the corpus.")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--keep", action="store_true", help="Keep (and reuse) the benchmark database.")
    parser.add_argument("--sql", action="store_true", help="Also print where the database time went.")
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
    databases = setup_databases(verbosity=0, interactive=False, keepdb=args.keep)

    from knowledge import services
    from knowledge.models import Document, EntitySource, RelationSource, Workspace

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
        start, cpu_start = time.perf_counter(), time.process_time()
        for index, text in enumerate(documents):
            document = services.document_create(
                workspace=workspace, filename=f"report-{index}.txt", data=text.encode(), enqueue=False
            )
            done = services.document_ingest(document_id=document.pk)
            if done is None or done.status != "processed":
                raise SystemExit(f"document {index} did not finish: {done and done.error}")
            print(f"\r{index + 1}/{len(documents)} documents", end="", file=sys.stderr, flush=True)
        elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
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
        peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(f"corpus:               {len(documents)} documents, {totals['tokens']:,} tokens")
        print(f"chunks:               {totals['chunks']:,}")
        print(f"graph:                {workspace.entity_count:,} entities, {workspace.relation_count:,} relations")
        print(f"provenance:           {mentions:,} entity mentions, {relation_mentions:,} relation mentions")
        print(f"busiest entity:       in {busiest} chunks")
        print(f"model calls:          {totals['calls']:,} chat calls (double answers instantly)")
        print(f"wall time:            {elapsed:.1f} s (this process used {cpu:.1f} s CPU)")
        print(f"corpus tokens/s:      {totals['tokens'] / elapsed:,.0f}")
        print(f"chunks/s:             {totals['chunks'] / elapsed:,.1f}")
        print(f"entities merged/s:    {mentions / elapsed:,.0f} (entity mentions)")
        print(f"relations merged/s:   {relation_mentions / elapsed:,.0f} (relation mentions)")
        print(f"peak worker memory:   {peak_mb:,.0f} MB")
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
