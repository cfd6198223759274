"""Real processes for tests: daphne, Celery workers and beat, a private Redis, all against the
test database. Each runs in a process group of its own, so a test can kill it as a crash would
(SIGKILL to the whole group) or stop it as an operator would (SIGTERM).

Tests that use them need committed data (`transactional_db`), since the processes have their
own database connections.
"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def database_url() -> str:
    """The test database as a DATABASE_URL, for processes started by a test."""
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = quote(db["HOST"] or "", safe="")
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{credentials}@{host}{port}/{db['NAME']}"


def process_env(**overrides) -> dict:
    """The environment of a started process: the test database and the test's model settings."""
    env = {
        **os.environ,
        "DATABASE_URL": database_url(),
        "REDIS_URL": settings.REDIS_URL,
        "LLM_BASE_URL": settings.LLM_BASE_URL,
        "LLM_API_KEY": settings.LLM_API_KEY,
        "LLM_MODEL": settings.LLM_MODEL,
        "EMBEDDING_BASE_URL": settings.EMBEDDING_BASE_URL,
        "EMBEDDING_API_KEY": settings.EMBEDDING_API_KEY,
        "EMBEDDING_MODEL": settings.EMBEDDING_MODEL,
        "LLM_RETRY_BACKOFF": str(settings.LLM_RETRY_BACKOFF),
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        # Started servers speak plain HTTP to the test, as `make run` does.
        "HTTPS": "false",
        "LOG_LEVEL": "INFO",
    }
    env.update({name: str(value) for name, value in overrides.items()})
    return env


class Started:
    """A process group started by a test, with its log."""

    def __init__(self, name: str, command: list[str], env: dict):
        ARTIFACTS.mkdir(exist_ok=True)
        self.name = name
        self.log_path = ARTIFACTS / f"{name}.log"
        self._log = self.log_path.open("w")
        self.process = subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        return self.process.pid

    def log(self) -> str:
        if not self._log.closed:
            self._log.flush()
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL to the whole group, as a crash or an out-of-memory killer would."""
        self.signal(signal.SIGKILL)
        self.process.wait()

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signum)

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM to the main process, as a supervisor sends it (Celery's pool processes die at
        once on one of their own; their parent's warm shutdown lets them finish); then SIGKILL."""
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        self._log.close()
        return self.process.returncode


@contextmanager
def started(name: str, command: list[str], env: dict):
    process = Started(name, command, env)
    try:
        yield process
    finally:
        if process.process.poll() is None:
            process.stop()


def celery_worker(name: str, env: dict, *, concurrency: int = 1):
    command = [sys.executable, "-m", "celery", "-A", "config", "worker", "--concurrency", str(concurrency)]
    command += ["--loglevel", "INFO", "-n", f"{name}@%h", "--without-gossip", "--without-mingle"]
    return started(name, command, env)


def celery_beat(env: dict, schedule: Path):
    command = [sys.executable, "-m", "celery", "-A", "config", "beat", "--loglevel", "INFO", "-s", str(schedule)]
    return started("beat", command, env)


def wait_for(condition, *, timeout: float, interval: float = 0.2, what: str = "the condition"):
    """Poll until `condition()` is truthy and return its value; fail the test after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(interval)
    pytest.fail(f"{what} did not happen within {timeout:g} s")


@contextmanager
def daphne(env: dict):
    port = free_port()
    command = [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"]
    with started("daphne", command, env) as process:
        url = f"http://127.0.0.1:{port}"

        def serving():
            if process.process.poll() is not None:
                pytest.fail(f"daphne exited with {process.process.returncode}; see {process.log_path}")
            try:
                with urllib.request.urlopen(f"{url}/login/", timeout=2) as response:  # noqa: S310 - our own server
                    return response.status == 200
            except OSError:
                return False

        wait_for(serving, timeout=60, what="daphne serving")
        process.url = url
        yield process


class PrivateRedis:
    """A redis-server of the test's own, which it may stop and start again."""

    def __init__(self, folder: Path):
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            pytest.skip("redis-server is not installed; it is needed to restart Redis under a running app")
        self.folder, self.port = folder, free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
            + ["--dir", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        import redis

        def answers():
            try:
                return redis.Redis.from_url(self.url, socket_timeout=1).ping()
            except redis.RedisError:
                return False

        wait_for(answers, timeout=20, what="redis-server answering")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
