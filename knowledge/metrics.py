"""Counters and histograms for Prometheus, kept in Redis so every process adds to the same ones.

Web (daphne), workers and beat are separate processes, in production separate containers: an
in-process prometheus_client registry would show one process's share to whichever process the
scrape reached, and prometheus_client's multiprocess mode needs one shared directory. Redis is
already what every process shares (the broker, the channel layer, the rate limits), so each
observation is one pipelined write there, and /metrics (knowledge/api/metrics.py) reads them all
back with the gauges it computes from the database at scrape time (decision 0112).

Recording never fails the work it measures: when Redis is away, observations are dropped and
Redis is not tried again for a while, as the rate limits fail open.

Nothing here imports the models or the pipeline, so every layer can record.
"""

import contextlib
import contextvars
import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import redis
from django.conf import settings

logger = logging.getLogger(__name__)

KEY_PREFIX = "graphrag:metrics"
# After a failed write, observations are dropped for this long instead of waiting on Redis again.
BACKOFF_SECONDS = 30.0
SOCKET_TIMEOUT = 0.5


@dataclass(frozen=True)
class Metric:
    name: str
    help: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()

    @property
    def kind(self) -> str:
        return "histogram" if self.buckets else "counter"

    @property
    def key(self) -> str:
        return f"{KEY_PREFIX}:{self.name}"


_QUESTION_BUCKETS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, math.inf)

HTTP_REQUESTS = Metric("graphrag_http_requests", "HTTP requests answered, by door and status.", ("door", "status"))
WEBSOCKET_CONNECTIONS = Metric(
    "graphrag_websocket_connections", "Websocket connections accepted, by socket.", ("socket",)
)
WEBSOCKET_DISCONNECTIONS = Metric(
    "graphrag_websocket_disconnections", "Websocket connections ended, by socket.", ("socket",)
)
QUESTIONS = Metric(
    "graphrag_questions", "Questions asked through a door, by door, mode and outcome.", ("door", "mode", "outcome")
)
QUESTION_SECONDS = Metric(
    "graphrag_question_seconds",
    "Seconds from a question to the end of its answer, by mode.",
    ("mode",),
    _QUESTION_BUCKETS,
)
QUESTION_FIRST_TOKEN_SECONDS = Metric(
    "graphrag_question_first_token_seconds",
    "Seconds from a question to the first token of its answer, by mode.",
    ("mode",),
    _QUESTION_BUCKETS,
)
MODEL_CALLS = Metric("graphrag_model_calls", "Model calls answered, by purpose and model kind.", ("purpose", "model"))
MODEL_TOKENS = Metric(
    "graphrag_model_tokens",
    "Model tokens spent, by purpose and direction (prompt, completion).",
    ("purpose", "direction"),
)
MODEL_ERRORS = Metric(
    "graphrag_model_errors",
    "Model calls that failed, each attempt, by purpose and whether it is retried (transient).",
    ("purpose", "transient"),
)
INGEST_TOKENS = Metric("graphrag_ingest_tokens", "Tokens of document text chunked for ingestion.", ())
SWEEPER_TAKEOVERS = Metric(
    "graphrag_sweeper_takeovers",
    "Documents taken over from a run that died: its lease ran out, or its process was found gone.",
    ("how",),
)

METRICS = (
    HTTP_REQUESTS,
    WEBSOCKET_CONNECTIONS,
    WEBSOCKET_DISCONNECTIONS,
    QUESTIONS,
    QUESTION_SECONDS,
    QUESTION_FIRST_TOKEN_SECONDS,
    MODEL_CALLS,
    MODEL_TOKENS,
    MODEL_ERRORS,
    INGEST_TOKENS,
    SWEEPER_TAKEOVERS,
)

_client: redis.Redis | None = None
_resting_until = 0.0
# The writes held by the innermost `one_write` block of this context (None: write at once).
_held: contextvars.ContextVar[list[Callable] | None] = contextvars.ContextVar("metrics_held", default=None)


def _redis() -> redis.Redis:
    global _client
    if _client is None:
        _client = redis.Redis.from_url(
            settings.REDIS_URL, socket_timeout=SOCKET_TIMEOUT, socket_connect_timeout=SOCKET_TIMEOUT
        )
    return _client


def _field(metric: Metric, labels: dict[str, object]) -> str:
    if set(labels) != set(metric.labels):
        raise ValueError(f"{metric.name} takes the labels {metric.labels}, got {tuple(labels)}.")
    return json.dumps([str(labels[name]) for name in metric.labels])


@contextlib.contextmanager
def one_write() -> Iterator[None]:
    """Hold the observations made in the block, in this context and the asyncio tasks it starts,
    and send them to Redis in one round trip at its end. A batch of model calls otherwise waits on
    three round trips per call, on the event loop that the other calls' answers arrive on (5% of a
    worker's samples at the anchor's 200k tokens, decision 0175)."""
    held: list[Callable] = []
    token = _held.set(held)
    try:
        yield
    finally:
        _held.reset(token)
        if held:

            def fill_all(pipe):
                for fill in held:
                    fill(pipe)

            _write(fill_all)


def _write(fill) -> None:
    global _resting_until
    held = _held.get()
    if held is not None:
        held.append(fill)
        return
    if time.monotonic() < _resting_until:
        return
    pipe = _redis().pipeline(transaction=False)
    fill(pipe)
    try:
        pipe.execute()
    except redis.RedisError:
        _resting_until = time.monotonic() + BACKOFF_SECONDS
        logger.warning("metrics: Redis is not answering; observations dropped for %ss", BACKOFF_SECONDS)


def count(metric: Metric, amount: float = 1, **labels) -> None:
    """Add `amount` to a counter."""
    field = _field(metric, labels)
    if amount:
        _write(lambda pipe: pipe.hincrbyfloat(metric.key, field, amount))


def observe(metric: Metric, value: float, **labels) -> None:
    """One observation of a histogram: its bucket (the first bound at or above it), sum and count."""
    field = _field(metric, labels)
    bound = next(bound for bound in metric.buckets if value <= bound)

    def fill(pipe):
        pipe.hincrby(metric.key, f"{field}|{bound}", 1)
        pipe.hincrbyfloat(metric.key, f"{field}|sum", value)
        pipe.hincrby(metric.key, f"{field}|count", 1)

    _write(fill)


@dataclass(frozen=True)
class Sample:
    labels: dict[str, str]
    value: float


@dataclass(frozen=True)
class HistogramSample:
    labels: dict[str, str]
    buckets: list[tuple[str, float]]  # cumulative, as Prometheus reads them: ("0.5", n), ..., ("+Inf", n)
    sum: float


def read() -> Iterator[tuple[Metric, list]]:
    """Every metric with its samples, for the exposition; raises redis.RedisError when Redis is away."""
    pipe = _redis().pipeline(transaction=False)
    for metric in METRICS:
        pipe.hgetall(metric.key)
    for metric, stored in zip(METRICS, pipe.execute(), strict=True):
        fields = {key.decode(): float(value) for key, value in stored.items()}
        yield metric, (_histogram(metric, fields) if metric.buckets else _counter(metric, fields))


def _labels(metric: Metric, field: str) -> dict[str, str]:
    return dict(zip(metric.labels, json.loads(field), strict=True))


def _counter(metric: Metric, fields: dict[str, float]) -> list[Sample]:
    return [Sample(_labels(metric, field), value) for field, value in sorted(fields.items())]


def _histogram(metric: Metric, fields: dict[str, float]) -> list[HistogramSample]:
    by_labels: dict[str, dict[str, float]] = {}
    for field, value in fields.items():
        labels, _, part = field.rpartition("|")
        by_labels.setdefault(labels, {})[part] = value
    samples = []
    for labels, parts in sorted(by_labels.items()):
        running, buckets = 0.0, []
        for bound in metric.buckets:
            running += parts.get(str(bound), 0.0)
            buckets.append(("+Inf" if bound == math.inf else str(bound), running))
        samples.append(HistogramSample(_labels(metric, labels), buckets, parts.get("sum", 0.0)))
    return samples
