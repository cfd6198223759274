"""The CI entry point: a missing browser fails a CI run and is a loud skip elsewhere (issue 29)."""

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "ensure_chromium.sh"


def _ensure_chromium(tmp_path, **env) -> subprocess.CompletedProcess:
    # No apt-get on this PATH, so the script cannot install anything and says what it would skip.
    return subprocess.run(  # noqa: S603 - our own script
        ["/bin/sh", str(SCRIPT)],
        env={"PATH": str(tmp_path), "CHROMIUM": str(tmp_path / "chromium"), **env},
        capture_output=True,
        text=True,
        check=False,
    )


def test_a_missing_browser_fails_a_ci_run(tmp_path):
    result = _ensure_chromium(tmp_path, CI="1")

    assert result.returncode == 1
    assert "the run FAILS" in result.stderr


def test_a_developer_machine_without_a_browser_gets_a_loud_skip(tmp_path):
    result = _ensure_chromium(tmp_path)

    assert result.returncode == 0
    assert "The browser tests will be SKIPPED" in result.stderr


def test_a_present_browser_passes_either_way(tmp_path):
    chromium = tmp_path / "chromium"
    chromium.write_text("#!/bin/sh\n")
    chromium.chmod(0o755)

    assert _ensure_chromium(tmp_path, CI="1").returncode == 0


def test_the_ci_entry_point_runs_the_tests_as_ci():
    lines = (ROOT / ".ci" / "run").read_text().splitlines()

    assert "export CI=1" in lines
    assert lines.index("export CI=1") < lines.index("make test")


@pytest.mark.parametrize(("ci", "outcome"), [("1", "error"), ("", "skipped")])
def test_a_browser_test_without_its_browser_fails_in_ci_and_skips_elsewhere(tmp_path, ci, outcome):
    test = tmp_path / "test_needs_browser.py"
    test.write_text(
        "from pathlib import Path\n\n"
        "import tests.browser.conftest as browser\n"
        "from tests.browser.conftest import browser_page  # noqa: F401\n\n"
        "browser.CHROMIUM = Path('/nonexistent/chromium')\n\n"
        "def test_it(browser_page):\n"
        "    pass\n"
    )
    result = subprocess.run(  # noqa: S603 - the project's own pytest
        [str(ROOT / ".venv" / "bin" / "pytest"), "-q", "-p", "no:cacheprovider", str(test), "--rootdir", str(ROOT)],
        cwd=ROOT,
        env={**os.environ, "CI": ci},
        capture_output=True,
        text=True,
        check=False,
    )

    assert f"1 {outcome}" in result.stdout, result.stdout[-2000:]
