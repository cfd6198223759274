"""The MCP server, driven by the official `mcp` client over streamable HTTP against daphne."""

import json
from contextlib import asynccontextmanager

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import sse_within_origin

from knowledge.api.mcp import GET_REFUSED, NOT_A_MEMBER
from tests.knowledge.conftest import ANSWER, QUESTION_TEXT

TOOLS = {"list_workspaces", "ask", "search_entities", "get_entity", "list_documents", "read_chunk"}


@asynccontextmanager
async def connected(served_team, *, token=None, mode="auto"):
    headers = {"Authorization": f"Bearer {token or served_team['token']}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        Client(streamable_http_client(f"{served_team['url']}/mcp", http_client=http), mode=mode) as client,
    ):
        yield client


async def call(client, tool, **arguments):
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.content[0].text
    return result.structured_content


# "legacy" is the initialize handshake of the clients released before the 2026 protocol.
@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_it_lists_its_tools_and_asks_a_workspace(served_team, served_double, mode):
    async with connected(served_team, mode=mode) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        workspaces = await call(client, "list_workspaces")
        answer = await call(client, "ask", workspace="acme", question=QUESTION_TEXT, mode="local", top_k=10)

    assert set(tools) == TOOLS
    assert set(tools["ask"].input_schema["properties"]) == {"workspace", "question", "mode", "top_k", "filters"}
    assert [row["slug"] for row in workspaces["result"]] == ["acme", "empty"]
    assert workspaces["result"][0]["role"] == "owner"
    assert answer["answer"] == ANSWER
    assert answer["answer_engine"] == "llm"
    assert [source["id"] for source in answer["sources"]] == ["S2", "R1"]
    assert answer["usage"]["completion_tokens"] > 0
    answer_call = served_double.chat_requests()[-1]
    assert answer_call.last_user_message == QUESTION_TEXT


async def test_ask_reads_only_the_documents_its_filters_name(served_team, served_double):
    async with connected(served_team) as client:
        nothing = await call(
            client, "ask", workspace="acme", question=QUESTION_TEXT, mode="local", filters={"tags": ["elsewhere"]}
        )
        invalid = await client.call_tool("ask", {"workspace": "acme", "question": "Who?", "filters": {"tag": []}})

    assert nothing["sources"] == []
    assert invalid.content[0].text.endswith("Unknown filter 'tag': 'filters' takes 'tags' and 'documents'.")


async def test_it_searches_entities_and_reads_one_with_its_relations_and_sources(served_team):
    async with connected(served_team) as client:
        found = await call(client, "search_entities", workspace="acme", query="bo")
        bob = await call(client, "get_entity", workspace="acme", entity_id=found["result"][0]["id"])

    assert [row["name"] for row in found["result"]] == ["Bob"]
    assert found["result"][0]["degree"] == 3
    assert found["result"][0]["description"] == "Bob is a person."
    assert bob["name"] == "Bob"
    assert [relation["other_name"] for relation in bob["relations"]] == ["Frank", "Erin", "Carol"]
    assert {source["said"] for source in bob["sources"]} == {"Bob in shared", "Bob in erin"}
    assert bob["sources"][0]["document_title"] == "Team notes"


async def test_it_lists_documents_and_reads_a_chunk(served_team):
    chunk = served_team["chunks"]["erin"]
    async with connected(served_team) as client:
        documents = await call(client, "list_documents", workspace="acme")
        processed = await call(client, "list_documents", workspace="acme", status="processed", query="team")
        read = await call(client, "read_chunk", workspace="acme", chunk_id=chunk.pk)

    assert [row["title"] for row in documents["result"]] == ["Team notes"]
    assert documents["result"][0]["status"] == "processed"
    assert processed["result"] == documents["result"]
    assert read["text"] == "Bob and Erin pair daily."
    assert read["document_title"] == "Team notes"
    assert read["order"] == 2


async def test_every_tool_answers_an_outsider_as_if_the_workspace_did_not_exist(served_team):
    chunk, entity = served_team["chunks"]["erin"], served_team["entities"]["Bob"]
    calls = {
        "ask": {"question": "Who?"},
        "search_entities": {"query": "bo"},
        "get_entity": {"entity_id": entity.pk},
        "list_documents": {},
        "read_chunk": {"chunk_id": chunk.pk},
    }
    async with connected(served_team, token=served_team["stranger_token"]) as client:
        results = {tool: await client.call_tool(tool, {"workspace": "acme", **args}) for tool, args in calls.items()}
        mine = await call(client, "list_workspaces")

    # The SDK puts "Error executing tool <name>: " before the message.
    outcomes = {
        tool: (result.is_error, result.content[0].text.endswith(NOT_A_MEMBER)) for tool, result in results.items()
    }
    assert outcomes == dict.fromkeys(calls, (True, True))
    assert [row["slug"] for row in mine["result"]] == ["hidden"]


async def test_ids_from_another_workspace_are_not_found_in_yours(served_team):
    chunk = served_team["chunks"]["erin"]
    async with connected(served_team) as client:
        result = await client.call_tool("read_chunk", {"workspace": "empty", "chunk_id": chunk.pk})
        refused = await client.call_tool("ask", {"workspace": "empty", "question": "Who?"})
        invalid = await client.call_tool("ask", {"workspace": "acme", "question": "Who?", "top_k": 0})

    assert result.is_error
    assert result.content[0].text.endswith(f"No chunk {chunk.pk} in empty.")
    assert refused.content[0].text.endswith(
        "This workspace has no documents yet. Upload one on the workspace page, then ask again."
    )
    assert invalid.content[0].text.endswith("'top_k' must be a whole number from 1 to 200, got 0.")


@pytest.mark.parametrize("authorization", [None, "Bearer grt_mistyped", "Basic abc"])
def test_it_refuses_requests_without_a_valid_token_with_401(served_team, authorization):
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    if authorization:
        headers["Authorization"] = authorization
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}

    response = httpx.post(f"{served_team['url']}/mcp", headers=headers, content=json.dumps(body))

    assert response.status_code == 401
    assert response.json()["error"]
    assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_a_read_token_reads_but_cannot_ask(served_team):
    from asgiref.sync import sync_to_async

    from knowledge.services.api_tokens import SCOPE_READ, api_token_create

    owner = await sync_to_async(lambda: served_team["workspace"].memberships.get().user)()
    _, reader = await sync_to_async(api_token_create)(user=owner, name="reader", scope=SCOPE_READ)
    async with connected(served_team, token=reader) as client:
        workspaces = await call(client, "list_workspaces")
        refused = await client.call_tool("ask", {"workspace": "acme", "question": QUESTION_TEXT})

    assert [row["slug"] for row in workspaces["result"]] == ["acme", "empty"]
    assert refused.is_error
    assert "does not allow asking questions" in refused.content[0].text


async def test_the_question_limit_spent_on_other_doors_refuses_the_ask_tool(served_team, settings):
    from asgiref.sync import sync_to_async

    from knowledge.services.ratelimits import RateLimited, rate_limit_check
    from tests.knowledge.conftest import SERVED_ASK_LIMIT

    settings.RATE_LIMIT_ASK = SERVED_ASK_LIMIT
    # Counted in the served process's cache keys (each test of this process has a prefix of its own).
    settings.CACHES = {"default": {**settings.CACHES["default"], "KEY_PREFIX": "cache"}}
    owner = await sync_to_async(lambda: served_team["workspace"].memberships.get().user)()
    allowed, _period = SERVED_ASK_LIMIT
    # The budget spent through the other doors, counted where they count it.
    with pytest.raises(RateLimited):
        await sync_to_async(rate_limit_check)(limit="RATE_LIMIT_ASK", user=owner, count=allowed + 1)
    async with connected(served_team) as client:
        refused = await client.call_tool("ask", {"workspace": "acme", "question": QUESTION_TEXT})

    assert refused.is_error
    assert "Too many questions for now" in refused.content[0].text


@pytest.mark.parametrize("state", ["revoked", "expired"])
def test_it_refuses_a_revoked_or_expired_token_with_401(served_team, state):
    from datetime import timedelta

    from django.utils import timezone

    from knowledge.models import ApiToken
    from knowledge.services.api_tokens import api_token_authenticate

    token = api_token_authenticate(served_team["token"])
    changes = {"revoked_at": timezone.now()} if state == "revoked" else {"expires_at": timezone.now() - timedelta(1)}
    ApiToken.objects.filter(pk=token.pk).update(**changes)
    headers = {
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "Authorization": f"Bearer {served_team['token']}",
    }
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}

    response = httpx.post(f"{served_team['url']}/mcp", headers=headers, content=json.dumps(body))

    assert response.status_code == 401
    assert "not valid" in response.json()["error"]


async def test_the_clients_event_stream_get_is_answered_405_at_once(served_team):
    """The mcp package's own GET for server messages (mcp-remote and the Inspector send the same):
    a stateless server offers no stream, and says so with the status the spec allows, rather than
    holding the request without headers until a ping."""
    headers = {"Authorization": f"Bearer {served_team['token']}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=120) as http,
        sse_within_origin(http, f"{served_team['url']}/mcp") as events,
    ):
        response = events.response
        # Asserted before reading: a held stream would never end.
        assert response.status_code == 405
        body = await response.aread()

    assert json.loads(body) == {"error": GET_REFUSED}
    assert response.headers["Allow"] == "POST, DELETE"


def test_a_raw_get_is_answered_405_and_without_a_token_401(served_team):
    url, accept = f"{served_team['url']}/mcp", {"Accept": "text/event-stream"}
    with httpx.stream("GET", url, headers={**accept, "Authorization": f"Bearer {served_team['token']}"}) as got:
        status, content_type = got.status_code, got.headers["Content-Type"]
    anonymous = httpx.get(url, headers=accept)

    assert (status, content_type) == (405, "application/json")
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
