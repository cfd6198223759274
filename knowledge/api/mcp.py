"""The MCP server at /mcp (streamable HTTP): tools that let agents ask a workspace and read its graph.

Built on the official `mcp` package (MCPServer, its streamable-HTTP session manager), served by
daphne next to Django (config/asgi.py routes /mcp here). Every request carries an API token
(`Authorization: Bearer`), read by knowledge.api.auth like every other token endpoint; each tool
acts as the token's user and reaches only workspaces that user is a member of
(`workspace_for_user`), answering "No such workspace, or you are not a member of it." otherwise,
as the HTTP API's 404 does.

Stateless: every request stands alone, so any daphne process behind a load balancer can serve
any request, and nothing is held between an agent's calls.
"""

import asyncio
import json
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

from channels.db import database_sync_to_async
from django.conf import settings
from django.db import connection
from django.http import Http404
from django.http.request import split_domain_port, validate_host
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.transport_security import TransportSecuritySettings

from knowledge.api.auth import CHALLENGE, abearer_user, out_of_scope
from knowledge.api.metrics import count_request
from knowledge.api.protocols import cited_sources
from knowledge.models import Answer, Chunk, Document
from knowledge.rag.retrieval import DEFAULT_MODE, DEFAULT_TOP_K
from knowledge.selectors import (
    documents_browse,
    entities_browse,
    entity_provenance,
    relations_of_entity,
    workspace_for_user,
    workspaces_for_user,
)
from knowledge.services.api_tokens import SCOPE_ASK, SCOPE_READ
from knowledge.services.asking import (
    Asker,
    AskError,
    DoneEvent,
    ErrorEvent,
    ask_request,
    ask_stream,
    workspace_for_asking,
)

MCP_PATH = "/mcp"
NOT_A_MEMBER = "No such workspace, or you are not a member of it."
# Enough rows for an agent to choose from without flooding its context.
LIST_MAX = 200
ENTITY_ROWS_MAX = 100
GET_REFUSED = "This MCP server sends no event stream: POST each JSON-RPC message to /mcp."

server = MCPServer(
    "graphrag-teams",
    instructions=(
        "Ask questions of a team's knowledge workspaces and read their knowledge graph. "
        "Call list_workspaces first: every other tool takes a workspace slug. `ask` answers with "
        "citations ([S1] passages, [E1] entities, [R1] relations); read_chunk shows a cited passage."
    ),
)


def _user(ctx: Context):
    return ctx.request_context.request.scope["user"]


def _require(ctx: Context, scope: str) -> None:
    token = ctx.request_context.request.scope["api_token"]
    if not token.allows(scope):
        raise ToolError(out_of_scope(token, scope))


async def _read(function: Callable, *args, **kwargs):
    """Run a database read on a pool thread, as the ask service runs retrieval, never on asgiref's
    shared thread; the thread's connection is closed after, since the pool's threads are many."""

    def read():
        try:
            return function(*args, **kwargs)
        finally:
            connection.close()

    return await database_sync_to_async(read, thread_sensitive=False)()


def _workspace(user, slug: str):
    try:
        return workspace_for_user(user, slug)
    except Http404:
        raise ToolError(NOT_A_MEMBER) from None


@server.tool()
async def list_workspaces(ctx: Context) -> list[dict[str, Any]]:
    """The workspaces you may use: slug (what the other tools take), name, your role, and counts."""

    def read(user):
        return [
            {
                "slug": workspace.slug,
                "name": workspace.name,
                "description": workspace.description,
                "role": workspace.role,
            }
            for workspace in workspaces_for_user(user).order_by("slug")
        ]

    return await _read(read, _user(ctx))


@server.tool()
async def ask(
    workspace: str,
    question: str,
    ctx: Context,
    mode: str = DEFAULT_MODE,
    top_k: int = DEFAULT_TOP_K,
    filters: dict[str, list] | None = None,
) -> dict[str, Any]:
    """Ask a workspace a question. The answer cites its sources as [S1] (passages), [E1]
    (entities) and [R1] (relations); `sources` lists the cited rows with their documents.
    mode: mix (default: graph and passages), hybrid, local (entities), global (relations),
    naive (passages only) or bypass (no retrieval). top_k: graph rows per search, 1-200.
    filters: read only some documents, {"tags": ["handbook"], "documents": [12]} (either list
    may be left out); documents carrying any of the tags or named by id."""
    _require(ctx, SCOPE_ASK)
    try:
        request = ask_request(question=question, mode=mode, top_k=top_k, filters=filters)
        found = await _read(workspace_for_asking, user=_user(ctx), slug=workspace, mode=request.mode)
    except AskError as refused:
        raise ToolError(str(refused)) from None
    asker = Asker(user=_user(ctx), door=Answer.Door.MCP)
    async with aclosing(ask_stream(workspace=found, request=request, asker=asker)) as events:
        async for event in events:
            if isinstance(event, ErrorEvent):
                raise ToolError(event.message)
            if isinstance(event, DoneEvent):
                usage = event.usage
                return {
                    "answer_id": str(event.answer_id),
                    "answer": event.answer,
                    "answer_engine": event.engine,
                    "sources": cited_sources(
                        answer=event.answer,
                        citations=event.citations,
                        base_url=_base_url(ctx),
                        workspace_slug=found.slug,
                    ),
                    "usage": {"prompt_tokens": usage.prompt_tokens, "completion_tokens": usage.completion_tokens},
                }
    raise ToolError("The answer ended before it was complete; try again.")


def _base_url(ctx: Context) -> str:
    request = ctx.request_context.request
    return f"{request.url.scheme}://{request.headers.get('host', request.url.netloc)}"


@server.tool()
async def search_entities(
    workspace: str, query: str, ctx: Context, type: str = "", limit: int = 20
) -> list[dict[str, Any]]:
    """Entities of a workspace's graph whose name or alias contains `query` (any case), best
    connected first: id (for get_entity), name, type, degree, how many documents mention it, and
    the start of its description. `type` keeps one entity type (person, organization, ...)."""

    def read(user):
        found = _workspace(user, workspace)
        rows = entities_browse(workspace=found, query=query.strip(), type=type)[: max(1, min(limit, LIST_MAX))]
        return [
            {
                "id": entity.pk,
                "name": entity.name,
                "type": entity.type,
                "degree": entity.degree,
                "documents": entity.document_count,
                "description": _opening(entity.description),
            }
            for entity in rows
        ]

    return await _read(read, _user(ctx))


def _opening(text: str, words: int = 60) -> str:
    parts = text.split()
    return " ".join(parts[:words]) + (" …" if len(parts) > words else "")


@server.tool()
async def get_entity(workspace: str, entity_id: int, ctx: Context) -> dict[str, Any]:
    """One entity with its whole description, aliases, relations (strongest first, with the entity
    at the other end) and sources (the passages it was extracted from, with what each said)."""

    def read(user):
        found = _workspace(user, workspace)
        entity = found.entities.published().filter(pk=entity_id).defer("embedding").first()
        if entity is None:
            raise ToolError(f"No entity {entity_id} in {workspace}; search_entities finds ids.")
        relations = relations_of_entity(entity=entity)
        sources = list(entity_provenance(entity=entity)[:ENTITY_ROWS_MAX])
        return {
            "id": entity.pk,
            "name": entity.name,
            "type": entity.type,
            "description": entity.description,
            "aliases": sorted(entity.aliases.values_list("name", flat=True)),
            "relations": [
                {
                    "id": relation.pk,
                    "other_id": relation.other.pk,
                    "other_name": relation.other.name,
                    "keywords": relation.keywords,
                    "description": relation.description,
                    "weight": relation.weight,
                }
                for relation in relations[:ENTITY_ROWS_MAX]
            ],
            "relation_count": len(relations),
            "sources": [
                {
                    "chunk_id": source.chunk_id,
                    "document_id": source.chunk.document_id,
                    "document_title": source.chunk.document.title,
                    "section": source.chunk.section,
                    "location": source.chunk.location,
                    "said": source.description,
                }
                for source in sources
            ],
        }

    return await _read(read, _user(ctx))


@server.tool()
async def list_documents(
    workspace: str, ctx: Context, status: str = "", query: str = "", limit: int = 50
) -> list[dict[str, Any]]:
    """A workspace's documents, newest first: id, title, file name, status (pending, processing,
    processed, failed), the error of a failed one, and counts. `query` matches title or file
    name; `status` keeps one status."""
    if status and status not in Document.Status.values:
        raise ToolError(f"Unknown status {status!r}: use one of {', '.join(Document.Status.values)}.")

    def read(user):
        found = _workspace(user, workspace)
        rows = documents_browse(workspace=found, status=status, query=query.strip())[: max(1, min(limit, LIST_MAX))]
        return [
            {
                "id": document.pk,
                "title": document.title,
                "filename": document.original_filename,
                "status": document.status,
                "error": document.error,
                "chunks": document.chunk_count,
                "entities": document.entity_count,
                "relations": document.relation_count,
                "tokens": document.token_count,
                "language": document.language,
                "created_at": document.created_at.isoformat(),
            }
            for document in rows
        ]

    return await _read(read, _user(ctx))


@server.tool()
async def read_chunk(workspace: str, chunk_id: int, ctx: Context) -> dict[str, Any]:
    """One passage (chunk) of a document: its text, document, section, page and position. Answers
    and entities name chunk ids in their sources."""

    def read(user):
        found = _workspace(user, workspace)
        chunk = (
            Chunk.objects.filter(workspace=found, pk=chunk_id)
            .select_related("document")
            .defer("embedding", "document__text", "document__structure")
            .first()
        )
        if chunk is None:
            raise ToolError(f"No chunk {chunk_id} in {workspace}.")
        return {
            "id": chunk.pk,
            "document_id": chunk.document_id,
            "document_title": chunk.document.title,
            "order": chunk.order,
            "section": chunk.section,
            "location": chunk.location,
            "char_start": chunk.char_start,
            "char_end": chunk.char_end,
            "text": chunk.text,
        }

    return await _read(read, _user(ctx))


# The SDK's own origin checks are off: the token is what authenticates (a web page cannot read
# one), and the host is checked against ALLOWED_HOSTS below, as Django checks it.
server.streamable_http_app(
    stateless_http=True,
    json_response=True,
    transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
)


class McpApp:
    """The ASGI app of /mcp: the host and the token checked, then the SDK's session manager.

    daphne sends no ASGI lifespan events, so the session manager (whose task group serves every
    request) is started by the first request, on this process's event loop, and runs until the
    process exits.
    """

    def __init__(self):
        self._running: asyncio.Event | None = None
        # The event loop holds tasks weakly; this reference keeps the manager's task alive.
        self._task: asyncio.Task | None = None

    async def __call__(self, scope, receive, send):
        async def counted(message):
            if message["type"] == "http.response.start":
                count_request(MCP_PATH, message["status"])
            await send(message)

        await self._answer(scope, receive, counted)

    async def _answer(self, scope, receive, send):
        headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        domain, _port = split_domain_port(headers.get("host", ""))
        if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
            await _json(send, 400, {"error": "This host is not in ALLOWED_HOSTS."})
            return
        client = scope.get("client") or (None, None)
        # Any live token may connect and read; each tool that does more checks its own scope.
        bearer = await abearer_user(headers.get("authorization", ""), scope=SCOPE_READ, ip=client[0])
        if bearer.user is None:
            extra = [(b"www-authenticate", CHALLENGE.encode())] if bearer.status == 401 else []
            if bearer.retry_after is not None:
                extra.append((b"retry-after", str(bearer.retry_after).encode()))
            await _json(send, bearer.status, {"error": bearer.error}, extra)
            return
        if scope["method"] == "GET":
            # A stateless server has no stream of its own to offer; the SDK would hold the GET
            # open with no header until its first ping (15 s), past the patience of MCP hosts.
            # The spec lets a server answer 405 instead, which clients take as "no stream here".
            await _json(send, 405, {"error": GET_REFUSED}, [(b"allow", b"POST, DELETE")])
            return
        await self._start()
        await server.session_manager.handle_request(
            {**scope, "user": bearer.user, "api_token": bearer.token}, receive, send
        )

    async def _start(self) -> None:
        if self._running is None:
            self._running = asyncio.Event()
            self._task = asyncio.get_running_loop().create_task(self._run())
        await self._running.wait()

    async def _run(self) -> None:
        async with server.session_manager.run():
            self._running.set()
            await asyncio.Future()


async def _json(send, status: int, body: dict, headers: list | None = None) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), *(headers or [])],
        }
    )
    await send({"type": "http.response.body", "body": json.dumps(body).encode()})


mcp_app = McpApp()
