"""The micro-batcher behind query embeddings: one model call for what callers queued meanwhile."""

import asyncio
import threading

import pytest

from knowledge.rag.llm.batching import Batcher

WAIT = 30  # seconds: a deadline for a broken batcher, never a measure


class Model:
    """A model whose first call holds until the test lets it go, so callers queue meanwhile."""

    def __init__(self, fail_on: int | None = None):
        self.calls: list[list[str]] = []
        self.first_started = threading.Event()
        self.release_first = threading.Event()
        self.fail_on = fail_on

    def __call__(self, items: list[str]) -> list[str]:
        self.calls.append(list(items))
        if len(self.calls) == 1:
            self.first_started.set()
            assert self.release_first.wait(WAIT)
        if len(self.calls) == self.fail_on:
            raise ValueError("the model failed")
        return [item.upper() for item in items]


def held_batcher(model: Model, *, max_items: int = 64) -> Batcher:
    """A batcher busy with a first call, so that whatever is submitted now waits for the next."""
    batcher = Batcher(model, max_items=max_items, name="test-batcher")
    batcher.submit(["first"])
    assert model.first_started.wait(WAIT)
    return batcher


def test_it_serves_concurrent_callers_their_own_results_in_order_from_one_call():
    model = Model()
    batcher = held_batcher(model)
    results: dict[int, list[str]] = {}
    submitted = threading.Semaphore(0)

    def caller(number: int) -> None:
        future = batcher.submit([f"q{number}-low", f"q{number}-high", f"q{number}-question"])
        submitted.release()
        results[number] = future.result(WAIT)

    threads = [threading.Thread(target=caller, args=(number,)) for number in range(20)]
    for thread in threads:
        thread.start()
    for _ in threads:
        assert submitted.acquire(timeout=WAIT)
    model.release_first.set()
    for thread in threads:
        thread.join(WAIT)

    assert results == {n: [f"Q{n}-LOW", f"Q{n}-HIGH", f"Q{n}-QUESTION"] for n in range(20)}
    assert len(model.calls) == 2  # the held first call, then one for all twenty callers
    assert sorted(model.calls[1]) == sorted(f"q{n}-{part}" for n in range(20) for part in ("low", "high", "question"))


def test_a_call_takes_at_most_max_items_but_never_splits_a_caller():
    model = Model()
    batcher = held_batcher(model, max_items=4)
    futures = [batcher.submit([f"a{n}", f"b{n}"]) for n in range(3)] + [batcher.submit(["c1", "c2", "c3", "c4", "c5"])]
    model.release_first.set()

    assert [future.result(WAIT) for future in futures] == [
        ["A0", "B0"],
        ["A1", "B1"],
        ["A2", "B2"],
        ["C1", "C2", "C3", "C4", "C5"],
    ]
    assert model.calls[1:] == [["a0", "b0", "a1", "b1"], ["a2", "b2"], ["c1", "c2", "c3", "c4", "c5"]]


def test_a_failed_call_fails_every_caller_in_it_and_the_next_call_works():
    model = Model(fail_on=2)
    batcher = held_batcher(model)
    failing = [batcher.submit([f"q{n}"]) for n in range(3)]
    model.release_first.set()

    for future in failing:
        with pytest.raises(ValueError, match="the model failed"):
            future.result(WAIT)
    assert batcher(["later"]) == ["LATER"]
    assert model.calls == [["first"], ["q0", "q1", "q2"], ["later"]]


class CountingCondition(threading.Condition):
    def __init__(self):
        super().__init__()
        self.timed_waits = 0

    def wait(self, timeout=None):
        if timeout is not None:
            self.timed_waits += 1
        return super().wait(timeout)


def test_a_lone_caller_is_served_in_a_call_of_its_own_without_waiting_for_company():
    calls: list[list[str]] = []

    def lengths(items: list[str]) -> list[int]:
        calls.append(list(items))
        return [len(item) for item in items]

    batcher = Batcher(lengths, max_items=64, name="test-batcher")
    condition = batcher._condition = CountingCondition()

    answers = [batcher([f"question {n}" * (n + 1)]) for n in range(5)]

    assert answers == [[len(f"question {n}" * (n + 1))] for n in range(5)]
    assert calls == [[f"question {n}" * (n + 1)] for n in range(5)]  # one call each, nobody else in it
    # The worker wakes on a caller, never on a clock: no collection window is waited out.
    assert condition.timed_waits == 0


async def test_async_callers_share_a_call_and_one_that_gave_up_is_left_out():
    model = Model()
    batcher = held_batcher(model)
    kept = [asyncio.ensure_future(batcher.acall([f"kept{n}"])) for n in range(3)]
    gone = asyncio.ensure_future(batcher.acall(["gone"]))
    await asyncio.sleep(0)  # the tasks run up to their awaits: all four are queued
    gone.cancel()
    with pytest.raises(asyncio.CancelledError):
        await gone
    model.release_first.set()

    assert await asyncio.wait_for(asyncio.gather(*kept), WAIT) == [["KEPT0"], ["KEPT1"], ["KEPT2"]]
    assert model.calls[1] == ["kept0", "kept1", "kept2"]
