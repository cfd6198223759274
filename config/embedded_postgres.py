"""The embedded default database: a pip-installed Postgres with pgvector (`pgserver`).

Used only when DATABASE_URL is unset. Every process that calls this shares one server on
the data folder; pgserver counts the processes and stops the server when the last exits.
"""

import logging
import os
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from django.core.exceptions import ImproperlyConfigured

DATABASE_NAME = "graphrag"


def embedded_database(pgdata: Path) -> dict:
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (normal in containers and CI).
        warnings.simplefilter("ignore")
        import pgserver

    # pgserver logs every start at INFO on the root logger before Django configures logging.
    logging.getLogger("pgserver").setLevel(logging.WARNING)
    pgdata.mkdir(parents=True, exist_ok=True)
    forget_dead_processes(pgdata)
    try:
        server = pgserver.get_server(pgdata, cleanup_mode="stop")
    except Exception as exc:
        raise ImproperlyConfigured(
            f"Could not start the embedded Postgres in {pgdata} ({exc}). "
            f"See {pgdata / 'log'}, or set DATABASE_URL to a Postgres server with pgvector."
        ) from exc
    uri = urlparse(server.get_uri())
    socket_dir = parse_qs(uri.query)["host"][0]
    _ensure_database(server)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE_NAME,
        "USER": uri.username or "postgres",
        "PASSWORD": "",
        "HOST": socket_dir,
        "PORT": "",
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }


def forget_dead_processes(pgdata: Path) -> None:
    """Drop processes that died without letting go of the server (kill -9) from pgserver's list of
    users, so the last live one still stops it on exit instead of leaving it running forever."""
    from pgserver.postgres_server import PostgresServer
    from pgserver.utils import DiskList

    users = DiskList(pgdata / ".handle_pids.json")
    with PostgresServer._lock:
        alive = [pid for pid in users.get() if _alive(pid)]
        if alive != users.get():
            users.put(alive)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ensure_database(server) -> None:
    exists = server.psql("SELECT 1 FROM pg_database WHERE datname = 'graphrag';")
    if "(1 row)" not in exists:
        server.psql("CREATE DATABASE graphrag;")
