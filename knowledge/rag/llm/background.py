"""One event loop thread per process, for sync code that calls async clients.

The model's SDK and the channel layer keep their connections per event loop. `async_to_sync`
and `asyncio.run` make a new loop on every call, so each call would open (and close) its
connections again: ~10 ms per progress event, where a loop that lives on reuses them.
"""

import asyncio
import os
import threading
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")


class BackgroundLoop:
    """Runs coroutines for sync callers on one loop thread; recreated after a fork."""

    def __init__(self):
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pid = 0

    def run(self, coro: Awaitable[T], timeout: float | None = None) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self._get())
        try:
            return future.result(timeout)
        except TimeoutError:
            # Nobody waits for it any more; it must not finish later behind the caller's back.
            future.cancel()
            raise

    def _get(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None or self._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="background-loop", daemon=True).start()
                self._loop, self._pid = loop, os.getpid()
            return self._loop


background = BackgroundLoop()
