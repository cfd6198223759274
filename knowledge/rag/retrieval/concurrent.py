"""Independent reads of one retrieval, run side by side on connections of their own.

Postgres runs a statement on one core. The entity search with its one-hop expansion, the
relation search and the chunk search need nothing from each other, and neither do the
provenance and subgraph lookups after them; on two connections they overlap, and the
Python work of this thread overlaps both. Inside a transaction everything stays on the
caller's connection, because other connections cannot see what it has not committed.
"""

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait

from django.db import close_old_connections, connection

WORKERS = 2

_pool = ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="retrieval")


def run_together(calls: dict[str, Callable], *, wrapper: Callable) -> dict:
    """Run each call and return {name: result}. The first call runs on this thread, the others
    on pool threads (whose queries also pass through `wrapper`, as this thread's do); the first
    exception raised by any of them is raised once all have finished."""
    names = list(calls)
    if len(names) < 2 or connection.in_atomic_block:
        return {name: calls[name]() for name in names}
    futures = {name: _pool.submit(_on_own_connection, calls[name], wrapper) for name in names[1:]}
    try:
        results = {names[0]: calls[names[0]]()}
    finally:
        wait(futures.values())
    results.update((name, future.result()) for name, future in futures.items())
    return results


def _on_own_connection(call: Callable, wrapper: Callable):
    # Honours CONN_MAX_AGE and CONN_HEALTH_CHECKS the way a request does.
    close_old_connections()
    with connection.execute_wrapper(wrapper):
        return call()


def close_connections() -> None:
    """Close the pool threads' database connections (before dropping a test database, say)."""
    barrier = threading.Barrier(WORKERS)

    def close() -> None:
        connection.close()
        barrier.wait(timeout=10)  # holds this thread, so the other task runs on the other one

    for future in [_pool.submit(close) for _ in range(WORKERS)]:
        future.result()
