"""Open WebUI's calls to an Ollama connection, replayed as its backend sends them (0.12.4,
routers/ollama.py): the key of OLLAMA_API_CONFIGS as a bearer token, the model list (`/api/tags`),
the loaded models (`/api/ps`, on every model refresh), the version, and a streamed chat. It runs in
Docker and reaches us as host.docker.internal, which no browser opens: source links are built
from PUBLIC_BASE_URL."""

import json

import httpx
import pytest

from knowledge.api.ollama import OLLAMA_VERSION
from tests.knowledge.conftest import QUESTION_TEXT
from tests.processes import daphne, process_env

PUBLIC = "https://knowledge.example.com"


@pytest.fixture(scope="module")
def served(served_model, django_db_setup):
    """This module's daphne: the knowledge conftest's, with the public base URL set."""
    env = process_env(
        LLM_BASE_URL=served_model.base_url,
        LLM_API_KEY="test-key",
        LLM_MODEL="double-chat",
        EMBEDDING_BASE_URL=served_model.base_url,
        EMBEDDING_API_KEY="test-key",
        EMBEDDING_MODEL="double-embed",
        LLM_RETRY_BACKOFF=0,
        LLM_MAX_RETRIES=0,
        PUBLIC_BASE_URL=PUBLIC,
    )
    with daphne(env) as process:
        yield process


def open_webui(served_team) -> httpx.Client:
    """Open WebUI's request headers for a connection whose key is the token."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {served_team['token']}"}
    return httpx.Client(base_url=served_team["url"], headers=headers, timeout=60)


def test_open_webuis_model_refresh_gets_ollamas_answers_in_json(served_team):
    with open_webui(served_team) as client:
        tags = client.get("/api/tags")
        ps = client.get("/api/ps")
        version = client.get("/api/version")

    assert tags.status_code == ps.status_code == version.status_code == 200
    assert "acme:latest" in [model["model"] for model in tags.json()["models"]]
    assert ps.json() == {"models": []}
    assert version.json() == {"version": OLLAMA_VERSION}


def test_open_webuis_streamed_chat_links_its_sources_to_the_public_base_url(served_team):
    payload = {
        "model": "acme:latest",
        "messages": [{"role": "user", "content": QUESTION_TEXT}],
        "stream": True,
        "options": {"temperature": 0.8},
    }
    with open_webui(served_team) as client, client.stream("POST", "/api/chat", content=json.dumps(payload)) as reply:
        lines = [json.loads(line) for line in reply.iter_lines() if line]

    assert reply.status_code == 200
    last = lines[-1]
    assert last["done"] is True
    links = [source["url"] for source in last["sources"] if source["url"]]
    assert links
    assert all(link.startswith(f"{PUBLIC}/workspaces/acme/documents/") for link in links)
    assert f"<{PUBLIC}/workspaces/acme/documents/" in "".join(line["message"]["content"] for line in lines)
