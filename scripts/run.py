"""`make run`: bring the whole app up on embedded defaults.

Starts (or reuses) the embedded Postgres, makes sure Redis answers, migrates, ensures the
demo user, then runs web and worker from the Procfile under honcho until Ctrl-C.
"""

import os
import shutil
import signal
import subprocess
import sys
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


def main() -> None:
    os.chdir(ROOT)
    sys.path.insert(0, str(ROOT))
    os.environ["REDIS_URL"] = ensure_redis()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
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

    host = os.environ.get("HOST", "127.0.0.1")
    shown_host = "localhost" if host in {"127.0.0.1", "0.0.0.0"} else host  # noqa: S104 - only compared
    url = f"http://{shown_host}:{settings.PORT}/"
    database = "embedded Postgres in .data/postgres" if not os.environ.get("DATABASE_URL") else "DATABASE_URL"
    redis_host = urlparse(os.environ["REDIS_URL"]).netloc
    print(
        f"\n  GraphRAG Teams is starting at {url}\n"
        f"  Log in as {username!r} / {password!r} (set DEMO_USER and DEMO_PASSWORD to change).\n"
        f"  Database: {database}. Redis: {redis_host}. Ctrl-C stops everything.\n",
        flush=True,
    )
    # daphne and celery live next to this interpreter (the project's virtualenv).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {**os.environ, "PORT": str(settings.PORT), "HOST": host, "PATH": path}
    honcho = [sys.executable, "-m", "honcho", "start", "-f", str(ROOT / "Procfile")]
    process = subprocess.Popen(honcho, env=env)  # noqa: S603 - our own interpreter and Procfile
    # Ctrl-C in the terminal reaches honcho too, which stops web and worker; a SIGTERM (`kill`,
    # a supervisor) reaches only this process, so pass it on rather than orphan them.
    signal.signal(signal.SIGTERM, lambda signum, frame: process.terminate())
    try:
        code = process.wait()
    except KeyboardInterrupt:
        code = process.wait()
    sys.exit(code)


if __name__ == "__main__":
    main()
