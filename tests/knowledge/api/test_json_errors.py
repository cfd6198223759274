"""API paths answer errors as JSON in their door's shape, never as the site's HTML pages; the OAuth
discovery paths an MCP host tries tell it the token is not valid."""

import pytest
from django.test import Client

from knowledge.api.errors import NO_OAUTH, SERVER_FAILED
from knowledge.services.api_tokens import api_token_create

pytestmark = pytest.mark.django_db


@pytest.fixture
def client():
    return Client(raise_request_exception=False)


@pytest.fixture
def token(owner):
    return api_token_create(user=owner, name="tests")[1]


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("get", "/.well-known/oauth-protected-resource"),
        ("get", "/.well-known/oauth-protected-resource/mcp"),
        ("get", "/.well-known/oauth-authorization-server"),
        ("get", "/.well-known/openid-configuration"),
        ("post", "/register"),
    ],
)
def test_oauth_discovery_is_told_this_server_takes_tokens_in_oauths_error_shape(client, method, path):
    """An MCP host shows `error_description` where it showed "rejected (HTTP 404): <!doctype html>"."""
    body = {"redirect_uris": ["http://localhost:6274/oauth/callback"], "client_name": "MCP Inspector"}
    response = getattr(client, method)(path, body, content_type="application/json")

    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {"error": "invalid_token", "error_description": NO_OAUTH}


def test_an_unknown_api_path_is_a_json_404(client):
    ollama = client.get("/api/nothing")
    openai = client.get("/v1/nothing")
    mcp = client.get("/mcp/nothing")

    assert (ollama.status_code, ollama.json()) == (404, {"error": "No such endpoint: GET /api/nothing."})
    assert openai.status_code == 404
    assert openai.json()["error"]["message"] == "No such endpoint: GET /v1/nothing."
    assert openai.json()["error"]["type"] == "invalid_request_error"
    assert mcp.json() == {"error": "No such endpoint: GET /mcp/nothing."}


def test_a_wrong_method_is_a_json_405_that_names_the_right_one(client):
    openai = client.get("/v1/chat/completions")
    ollama = client.post("/api/tags")

    assert openai.status_code == 405
    assert openai["Allow"] == "POST"
    assert openai.json()["error"]["message"] == "GET is not allowed on /v1/chat/completions; use POST."
    assert (ollama.status_code, ollama.json()) == (405, {"error": "POST is not allowed on /api/tags; use GET."})


def test_a_failure_inside_an_api_view_is_a_json_500(client, token, monkeypatch):
    def fail(user):
        raise RuntimeError("the database went away")

    monkeypatch.setattr("knowledge.api.ollama.workspaces_with_tags", fail)

    response = client.get("/api/tags", headers={"Authorization": f"Bearer {token}"})

    assert response.status_code == 500
    assert response.json() == {"error": SERVER_FAILED}


def test_pages_keep_their_html_error_pages(client):
    response = client.get("/no-such-page/")

    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")
