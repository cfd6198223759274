"""/metrics for Prometheus, and the count of the HTTP requests every process answers.

The counters and histograms every process records in Redis (knowledge/metrics.py) are read back
whole at each scrape; the gauges (documents by status and stage, the ingestion backlog) are
counted in the database at that moment, so any web process answers a scrape with the same
numbers (decision 0112). Off unless METRICS_TOKEN is set; then a scrape sends it as a bearer
token (Prometheus: `authorization: {credentials: ...}`).
"""

import secrets
from collections.abc import Callable

import redis
from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.http import Http404, HttpResponse
from django.utils.decorators import sync_and_async_middleware
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily

from knowledge import metrics
from knowledge.selectors import documents_by_status_and_stage, ingestion_backlog

# The door of a request, by the start of its path; anything else is a page.
DOORS = (
    ("/v1/", "openai"),
    ("/api/", "api"),
    ("/mcp", "mcp"),
    ("/admin/", "admin"),
    ("/static/", "static"),
    ("/metrics", "metrics"),
    ("/healthz", "health"),
)


def door_of(path: str) -> str:
    return next((door for prefix, door in DOORS if path.startswith(prefix)), "pages")


def count_request(path: str, status: int) -> None:
    metrics.count(metrics.HTTP_REQUESTS, door=door_of(path), status=status)


@sync_and_async_middleware
def count_requests(get_response: Callable):
    """Counts every response, error pages included (it sits outside the middleware that make them)."""
    if iscoroutinefunction(get_response):

        async def middleware(request):
            response = await get_response(request)
            count_request(request.path, response.status_code)
            return response

    else:

        def middleware(request):
            response = get_response(request)
            count_request(request.path, response.status_code)
            return response

    return middleware


class _Collector:
    def collect(self):
        up = GaugeMetricFamily(
            "graphrag_metrics_redis_up", "1 when the counters kept in Redis could be read for this scrape."
        )
        try:
            recorded = list(metrics.read())
        except redis.RedisError:
            recorded = []
        up.add_metric([], 1 if recorded else 0)
        yield up
        for metric, samples in recorded:
            yield _family(metric, samples)
        documents = GaugeMetricFamily(
            "graphrag_documents", "Documents by status and ingestion stage.", labels=["status", "stage"]
        )
        for status, stage, count in documents_by_status_and_stage():
            documents.add_metric([status, stage], count)
        yield documents
        backlog = GaugeMetricFamily(
            "graphrag_queue_depth",
            "Work waiting for a worker: documents not processed that no live run holds, graph rebuilds.",
            labels=["queue"],
        )
        for queue, count in ingestion_backlog().items():
            backlog.add_metric([queue], count)
        yield backlog


def _family(metric: metrics.Metric, samples: list):
    if metric.buckets:
        family = HistogramMetricFamily(metric.name, metric.help, labels=list(metric.labels))
        for sample in samples:
            labels = [sample.labels[name] for name in metric.labels]
            family.add_metric(labels, buckets=sample.buckets, sum_value=sample.sum)
        return family
    family = CounterMetricFamily(metric.name, metric.help, labels=list(metric.labels))
    for sample in samples:
        family.add_metric([sample.labels[name] for name in metric.labels], sample.value)
    return family


def _authorized(request) -> bool:
    scheme, _, secret = request.headers.get("Authorization", "").partition(" ")
    return scheme.casefold() == "bearer" and secrets.compare_digest(secret.strip(), settings.METRICS_TOKEN)


@require_GET
def scrape(request):
    if not settings.METRICS_TOKEN:
        raise Http404("Metrics are off: set METRICS_TOKEN to turn them on.")
    if not _authorized(request):
        response = HttpResponse("Send METRICS_TOKEN as 'Authorization: Bearer <token>'.\n", status=401)
        response["Content-Type"] = "text/plain"
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
