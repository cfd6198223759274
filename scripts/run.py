"""`make run`: bring the whole app up on embedded defaults.

Starts (or reuses) the embedded Postgres, makes sure Redis answers, migrates, ensures the
demo user, then runs web, worker and beat from the Procfile until Ctrl-C (or SIGTERM).

Stopping is graceful and bounded: each process gets SIGTERM; workers finish the step at hand
and give their document back (knowledge.tasks); whatever still runs after WORKER_STOP_TIMEOUT
seconds is killed, and its document is taken over at the next start. The embedded Postgres
stops last, whatever happened to the others. (honcho, which this replaced, kills after five
seconds, which cut workers off mid-step, and left Postgres running when one was killed.)
"""

import contextlib
import ctypes
import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

ROOT = Path(__file__).resolve().parent.parent
LOCAL_REDIS_PORT = 6390


def redis_answers(url: str) -> bool:
    import redis

    try:
        return bool(redis.Redis.from_url(url, socket_connect_timeout=1).ping())
    except (redis.exceptions.RedisError, OSError):
        return False


def ensure_redis() -> str:
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    if redis_answers(url):
        return url
    local_url = f"redis://127.0.0.1:{LOCAL_REDIS_PORT}/0"
    if redis_answers(local_url):
        return local_url
    server = shutil.which("redis-server")
    if os.environ.get("REDIS_URL") or server is None:
        sys.exit(
            f"Redis is not reachable at {url}.\n"
            "Start one, then run `make run` again:\n"
            "  Debian/Ubuntu: sudo apt-get install redis-server\n"
            "  macOS:         brew install redis && brew services start redis\n"
            "  Docker:        docker compose up -d redis\n"
            "or point REDIS_URL at a running Redis."
        )
    data = ROOT / ".data" / "redis"
    data.mkdir(parents=True, exist_ok=True)
    print(f"Redis is not reachable at {url}; starting {server} on port {LOCAL_REDIS_PORT}.")
    subprocess.run(  # noqa: S603 - redis-server found on PATH, fixed arguments
        [server, "--port", str(LOCAL_REDIS_PORT), "--bind", "127.0.0.1", "--daemonize", "yes"]
        + ["--dir", str(data), "--logfile", str(data / "redis.log")],
        check=True,
    )
    for _ in range(50):
        if redis_answers(local_url):
            return local_url
        time.sleep(0.1)
    sys.exit(f"Started redis-server but it does not answer at {local_url}; see {data / 'redis.log'}.")


# prctl(2): the signal a process gets when the thread that started it dies.
PR_SET_PDEATHSIG = 1
PREFIX_COLOURS = ("\033[36m", "\033[33m", "\033[35m", "\033[32m")
RESET = "\033[0m"


def procfile(env: dict) -> dict[str, list[str]]:
    """The Procfile's processes, their commands split and $VARIABLES filled from `env`."""
    processes = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        name, separator, command = line.partition(":")
        if separator and name.strip() and not name.startswith("#"):
            expanded = re.sub(r"\$(\w+)", lambda match: env.get(match.group(1), ""), command)
            processes[name.strip()] = shlex.split(expanded)
    return processes


def _relay(name: str, colour: str, stream) -> None:
    tty = sys.stdout.isatty()
    label = f"{colour}{name:7}|{RESET} " if tty else f"{name:7}| "
    for line in iter(stream.readline, b""):
        sys.stdout.write(label + line.decode(errors="replace"))
        sys.stdout.flush()


def _die_with(parent: int) -> None:
    """In the child, before it runs its command: the kernel kills it when this supervisor dies.

    The children live in sessions of their own (for an orderly Ctrl-C), so a supervisor killed
    with SIGKILL, or by a caller out of patience, used to leave web, worker and beat running as
    orphans that held the port and the queue. Celery's pool processes die with their worker the
    same way (Celery sets it for them)."""
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            # The supervisor died between the fork and the prctl: nothing would signal us.
            os._exit(1)


class Supervisor:
    """Runs the Procfile's processes, each in a process group of its own, and stops them all."""

    def __init__(self, env: dict, stop_timeout: float):
        self.env, self.stop_timeout = env, stop_timeout
        self.processes: dict[str, subprocess.Popen] = {}
        self.stopping = threading.Event()

    def start(self) -> None:
        for name, command in procfile(self.env).items():
            self.processes[name] = subprocess.Popen(  # noqa: S603 - commands from our own Procfile
                command,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                # Own group: Ctrl-C reaches only this process, which stops the others in order.
                start_new_session=True,
                preexec_fn=functools.partial(_die_with, os.getpid()),  # no other thread runs yet: relays start below
            )
        for index, (name, process) in enumerate(self.processes.items()):
            colour = PREFIX_COLOURS[index % len(PREFIX_COLOURS)]
            threading.Thread(target=_relay, args=(name, colour, process.stdout), daemon=True).start()

    def wait(self) -> int:
        """Until one process exits or a stop is asked for; the first exit code that is not 0."""
        while not self.stopping.is_set():
            for name, process in self.processes.items():
                if process.poll() is not None:
                    print(f"{name} exited with code {process.returncode}; stopping the others.", flush=True)
                    self.stop()
                    return process.returncode or 1
            self.stopping.wait(0.5)
        return 0

    def stop(self, *_signal) -> None:
        if self.stopping.is_set():
            return
        self.stopping.set()
        print(f"Stopping (workers finish their step; at most {self.stop_timeout:g} s)...", flush=True)
        for process in self.processes.values():
            # The main process only: Celery's pool processes die at once on a SIGTERM of their
            # own, while their parent's warm shutdown lets them finish the step at hand.
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.stop_timeout
        for name, process in self.processes.items():
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                print(f"{name} did not stop within {self.stop_timeout:g} s; killing it.", flush=True)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def main() -> None:
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ["REDIS_URL"] = ensure_redis()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    # `make run` serves plain HTTP on this machine; a deployment puts a TLS proxy in front instead.
    os.environ.setdefault("HTTPS", "false")
    import django
    from django.core.management import call_command

    # Setting up Django starts the embedded Postgres (unless DATABASE_URL is set); this
    # process keeps it alive until web and worker have stopped.
    django.setup()
    call_command("migrate", interactive=False, verbosity=0)
    username = os.environ.get("DEMO_USER", "demo")
    password = os.environ.get("DEMO_PASSWORD", "demo")
    call_command("ensure_demo", username=username, password=password)

    from django.conf import settings
    from django.db import connections

    host = os.environ.get("HOST", "127.0.0.1")
    shown_host = "localhost" if host in {"127.0.0.1", "0.0.0.0"} else host  # noqa: S104 - only compared
    url = f"http://{shown_host}:{settings.PORT}/"
    embedded = not os.environ.get("DATABASE_URL")
    database = "embedded Postgres in .data/postgres" if embedded else "DATABASE_URL"
    redis_host = urlparse(os.environ["REDIS_URL"]).netloc
    print(
        f"\n  GraphRAG Teams is starting at {url}\n"
        f"  Log in as {username!r} / {password!r} (set DEMO_USER and DEMO_PASSWORD to change).\n"
        f"  Database: {database}. Redis: {redis_host}. Ctrl-C stops everything.\n",
        flush=True,
    )
    connections.close_all()
    # daphne and celery live next to this interpreter (the project's virtualenv).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PORT": str(settings.PORT), "HOST": host, "PATH": path}
    supervisor = Supervisor(env, settings.WORKER_STOP_TIMEOUT)
    signal.signal(signal.SIGTERM, supervisor.stop)
    signal.signal(signal.SIGINT, supervisor.stop)
    supervisor.start()
    code = supervisor.wait()
    supervisor.stop()
    if embedded:
        from config.embedded_postgres import forget_dead_processes

        # A process killed above never let go of the server; the exit of this one stops it.
        forget_dead_processes(settings.DATA_DIR / "postgres")
    sys.exit(code)


if __name__ == "__main__":
    main()
