"""Micro-batching: what concurrent callers ask of a model goes to it in one call.

One worker thread per batcher makes the calls. Whatever callers queued while its previous
call ran goes into its next call (up to `max_items`, never splitting one caller's items), so
a burst of questions costs a few model calls instead of one each, while a caller who finds
the worker idle is served at once: there is no collection window to wait out. Callers block
on a future (`__call__`) or await it (`acall`), so threads of any pool and event loops alike
can share one batcher. If a call fails, every caller in it gets the exception.
"""

import asyncio
import logging
import os
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Generic, TypeVar

logger = logging.getLogger(__name__)

Item = TypeVar("Item")
Result = TypeVar("Result")


@dataclass
class _Waiter(Generic[Item, Result]):
    items: list[Item]
    future: Future = field(default_factory=Future)


class Batcher(Generic[Item, Result]):
    """`call` takes a list of items and returns one result per item, in order."""

    def __init__(self, call: Callable[[list[Item]], Sequence[Result]], *, max_items: int, name: str):
        self._call = call
        self._max_items = max_items
        self._name = name
        self._reset()
        # A forked child has none of the parent's threads: neither the worker nor the callers
        # whose waiters are queued, and the lock may have been held by one of them.
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._condition = threading.Condition()
        self._queue: deque[_Waiter] = deque()
        self._worker: threading.Thread | None = None

    def submit(self, items: Sequence[Item]) -> Future:
        """Queue the items; the future's result is their results, in order."""
        waiter = _Waiter(list(items))
        if not waiter.items:
            waiter.future.set_result([])
            return waiter.future
        with self._condition:
            if self._worker is None:
                # Started on first use, so that a process that forks before using the
                # batcher (Celery's prefork pool) never holds a thread its children lack.
                self._worker = threading.Thread(target=self._work, name=self._name, daemon=True)
                self._worker.start()
            self._queue.append(waiter)
            self._condition.notify()
        return waiter.future

    def __call__(self, items: Sequence[Item]) -> list[Result]:
        return self.submit(items).result()

    async def acall(self, items: Sequence[Item]) -> list[Result]:
        # Cancelling the awaiting task cancels the future; a caller not yet taken is then skipped.
        return await asyncio.wrap_future(self.submit(items))

    def _work(self) -> None:
        while True:
            with self._condition:
                while not self._queue:
                    self._condition.wait()
                batch = self._take()
            if batch:
                self._serve(batch)

    def _take(self) -> list[_Waiter]:
        batch: list[_Waiter] = []
        size = 0
        while self._queue and (not batch or size + len(self._queue[0].items) <= self._max_items):
            waiter = self._queue.popleft()
            # False when the caller gave up meanwhile; from here on it can no longer cancel.
            if waiter.future.set_running_or_notify_cancel():
                batch.append(waiter)
                size += len(waiter.items)
        return batch

    def _serve(self, batch: list[_Waiter]) -> None:
        items = [item for waiter in batch for item in waiter.items]
        logger.debug("%s: one call for %d items of %d callers", self._name, len(items), len(batch))
        try:
            results = list(self._call(items))
            if len(results) != len(items):
                raise RuntimeError(f"{self._name}: {len(results)} results for {len(items)} items")
        except BaseException as exc:  # whatever ends the call ends it for every caller; none waits forever
            for waiter in batch:
                waiter.future.set_exception(exc)
            return
        start = 0
        for waiter in batch:
            waiter.future.set_result(results[start : start + len(waiter.items)])
            start += len(waiter.items)
