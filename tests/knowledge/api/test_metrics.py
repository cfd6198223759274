"""/metrics: scraped from daphne and parsed with prometheus_client's own parser, after work done
in daphne (a question, an MCP request, a websocket) and in this process (a takeover of a dead
run's document): the counters every process keeps in Redis come back in one scrape."""

import json
import socket

import httpx
import pytest
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from knowledge.models import Document
from knowledge.services.ingestion.runs import release_dead_leases
from tests.knowledge.conftest import QUESTION_TEXT
from tests.processes import daphne, process_env

METRICS_TOKEN = "metrics-secret-for-tests"  # noqa: S105 - the tests' own


@pytest.fixture(scope="module")
def served(served_model, django_db_setup):
    """This module's daphne: the knowledge conftest's, with metrics on."""
    env = process_env(
        LLM_BASE_URL=served_model.base_url,
        LLM_API_KEY="test-key",
        LLM_MODEL="double-chat",
        EMBEDDING_BASE_URL=served_model.base_url,
        EMBEDDING_API_KEY="test-key",
        EMBEDDING_MODEL="double-embed",
        LLM_RETRY_BACKOFF=0,
        LLM_MAX_RETRIES=0,
        METRICS_TOKEN=METRICS_TOKEN,
    )
    with daphne(env) as process:
        yield process


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample of a scrape by name and sorted labels."""
    response = httpx.get(f"{url}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"})
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain; version=")
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def grew(before: dict, after: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted((k, str(v)) for k, v in labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_a_scrape_counts_what_the_web_process_and_this_one_did(served_team):
    url, token = served_team["url"], served_team["token"]
    workspace = served_team["workspace"]
    team_document = Document.objects.values_list("status", "stage").get()
    before = scrape(url)

    asked = httpx.post(
        f"{url}/api/chat",
        headers={"Authorization": f"Bearer {token}"},
        content=json.dumps(
            {"model": "acme:local", "messages": [{"role": "user", "content": QUESTION_TEXT}], "stream": False}
        ),
        timeout=60,
    )
    mcp = httpx.get(f"{url}/mcp", headers={"Authorization": f"Bearer {token}"})
    # Not logged in: accepted, then closed with 4401; counted as one connection and its end.
    events = url.replace("http", "ws", 1) + "/ws/workspaces/acme/events/"
    with pytest.raises(ConnectionClosed), connect(events, origin=url) as ws:
        ws.recv(timeout=30)
    # A run on this host whose process is gone: the next worker takes its document over.
    Document.objects.create(
        workspace=workspace, title="Orphan", status=Document.Status.PROCESSING, lease_owner=f"{socket.gethostname()}:0"
    )
    assert release_dead_leases() == 1
    after = scrape(url)

    assert asked.status_code == 200
    assert mcp.status_code == 405
    assert grew(before, after, "graphrag_http_requests_total", door="api", status=200) == 1
    assert grew(before, after, "graphrag_http_requests_total", door="mcp", status=405) == 1
    assert grew(before, after, "graphrag_questions_total", door="ollama", mode="local", outcome="answered") == 1
    assert grew(before, after, "graphrag_question_seconds_count", mode="local") == 1
    assert grew(before, after, "graphrag_question_seconds_bucket", mode="local", le="+Inf") == 1
    assert grew(before, after, "graphrag_model_calls_total", purpose="answer", model="llm") == 1
    assert grew(before, after, "graphrag_model_calls_total", purpose="keywords", model="llm") == 1
    assert grew(before, after, "graphrag_model_tokens_total", purpose="answer", direction="completion") > 0
    assert grew(before, after, "graphrag_websocket_connections_total", socket="events") == 1
    assert grew(before, after, "graphrag_websocket_disconnections_total", socket="events") == 1
    assert grew(before, after, "graphrag_sweeper_takeovers_total", how="process_gone") == 1
    assert after[("graphrag_metrics_redis_up", ())] == 1
    documents = {labels: value for (name, labels), value in after.items() if name == "graphrag_documents"}
    assert documents == {
        (("stage", "queued"), ("status", "processing")): 1,
        (("stage", team_document[1]), ("status", team_document[0])): 1,
    }
    assert after[("graphrag_queue_depth", (("queue", "documents"),))] == 1


def test_a_scrape_without_the_token_is_refused(served_team):
    response = httpx.get(f"{served_team['url']}/metrics", headers={"Authorization": "Bearer guessed"})

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.django_db
def test_metrics_are_off_without_a_token(settings):
    settings.METRICS_TOKEN = ""

    assert Client().get("/metrics", headers={"Authorization": "Bearer "}).status_code == 404
