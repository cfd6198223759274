"""Bad configuration stops the process at start-up with a message naming the variable."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _start_django(**env) -> subprocess.CompletedProcess:
    environment = {**os.environ, "DJANGO_SETTINGS_MODULE": "config.settings", **env}
    return subprocess.run(
        [sys.executable, "-c", "import django; django.setup()"],
        cwd=ROOT,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("url", ["not a url", "mysql://u:p@localhost/db", "postgres://"])
def test_it_rejects_a_malformed_database_url(url):
    result = _start_django(DATABASE_URL=url)

    assert result.returncode != 0
    assert "DATABASE_URL" in result.stderr


def test_it_rejects_a_non_integer_embedding_dim():
    result = _start_django(DATABASE_URL="postgres://u:p@localhost/db", EMBEDDING_DIM="384d")

    assert result.returncode != 0
    assert "EMBEDDING_DIM must be an integer, got '384d'" in result.stderr


def test_it_rejects_a_malformed_boolean():
    result = _start_django(DATABASE_URL="postgres://u:p@localhost/db", DEBUG="maybe")

    assert result.returncode != 0
    assert "DEBUG must be true or false" in result.stderr


@pytest.mark.parametrize("url", ["knowledge.example.com", "ftp://example.com", "https://"])
def test_it_rejects_a_public_base_url_a_browser_cannot_open(url):
    result = _start_django(DATABASE_URL="postgres://u:p@localhost/db", PUBLIC_BASE_URL=url)

    assert result.returncode != 0
    assert "PUBLIC_BASE_URL must be an http:// or https:// URL" in result.stderr


def test_it_rejects_an_unknown_iterative_scan_mode():
    result = _start_django(DATABASE_URL="postgres://u:p@localhost/db", HNSW_ITERATIVE_SCAN="on")

    assert result.returncode != 0
    assert "HNSW_ITERATIVE_SCAN must be one of off, relaxed_order, strict_order, got 'on'" in result.stderr


def test_it_accepts_a_valid_database_url_without_connecting():
    result = _start_django(DATABASE_URL="postgres://u:p@db.invalid:5432/graph")

    assert result.returncode == 0, result.stderr
