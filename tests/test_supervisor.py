"""`make run`'s supervisor (scripts/run.py) killed outright: web, worker and beat die with it."""

import contextlib
import signal
import sys

import psutil
import pytest

from tests.processes import free_port, process_env, started, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def _gone(process: psutil.Process) -> bool:
    # Reparented to PID 1, a dead child may stay a zombie until it is reaped: dead all the same.
    try:
        return process.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_web_worker_and_beat_die_with_a_supervisor_killed_with_sigkill():
    env = process_env(PORT=free_port(), HOST="127.0.0.1", DEMO_USER="demo", DEMO_PASSWORD="demo-password-1")
    with started("supervisor", [sys.executable, "scripts/run.py"], env) as supervisor:
        root = psutil.Process(supervisor.pid)

        def all_running():
            if supervisor.process.poll() is not None:
                pytest.fail(f"the supervisor exited:\n{supervisor.log()[-3000:]}")
            descendants = root.children(recursive=True)
            # web, worker and beat, and the worker's pool below it.
            return len(root.children()) == 3 and len(descendants) > 3 and descendants

        descendants = wait_for(all_running, timeout=180, what="web, worker and beat")
        names = " ".join(" ".join(process.cmdline()) for process in root.children())
        assert all(name in names for name in ("daphne", "worker", "beat"))

        supervisor.process.send_signal(signal.SIGKILL)
        supervisor.process.wait()

        try:
            wait_for(lambda: all(_gone(process) for process in descendants), timeout=60, what="the children to die")
        finally:
            # Whatever outlived it must not outlive the test.
            for process in descendants:
                with contextlib.suppress(psutil.NoSuchProcess):
                    process.kill()
