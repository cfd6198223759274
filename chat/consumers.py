"""The chat websocket: docs/architecture.md, "The websocket protocol".

An adapter over the conversation service (chat/services.py: `turn_start`, `turn_answer`), which
saves the question when it is asked and the answer when it ends. Every question passes the
membership gate and the asker's rate limit (RATE_LIMIT_ASK; the `error` event then carries
`retry_after`, in seconds). One consumer per socket. An answer streams in its own task so the
socket keeps reading (`cancel` must get through while tokens flow); the consumer owns that task
and cancels it on `cancel` and on disconnect, so a closed tab never leaves a model stream running.
"""

import asyncio
import contextlib
import json

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from chat import services
from chat.forms import AskForm
from chat.models import Message
from chat.rendering import render_message, render_sources, render_turn
from knowledge import metrics
from knowledge.models import Workspace
from knowledge.rag.retrieval import RetrievalResult
from knowledge.selectors import workspace_for_user
from knowledge.services.asking import (
    ASK_FIELDS,
    AskDenied,
    AskError,
    AskLimited,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    ask_request_from_json,
)

CLOSE_NOT_LOGGED_IN = 4401
CLOSE_NOT_A_MEMBER = 4403
# The conversation is the history, and a chat answers: the rest of a request may come in `ask`.
CHAT_FIELDS = tuple(name for name in ASK_FIELDS if name not in {"history", "context_only"})


class ChatConsumer(AsyncJsonWebsocketConsumer):
    # Answers go to this socket only, so it joins no channel layer: an open chat tab then
    # holds no blocking Redis read.
    channel_layer_alias = None
    workspace: Workspace | None = None
    turn: services.Turn | None = None
    page = False
    stream: asyncio.Task | None = None
    closed = False

    async def connect(self):
        metrics.count(metrics.WEBSOCKET_CONNECTIONS, socket="chat")
        # Accept before closing: a refused handshake reaches the browser as a bare 1006,
        # while a close frame carries the code the page turns into "log in again".
        await self.accept()
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=CLOSE_NOT_LOGGED_IN)
            return
        try:
            self.workspace = await database_sync_to_async(workspace_for_user)(
                user, self.scope["url_route"]["kwargs"]["slug"]
            )
        except Http404:
            await self.close(code=CLOSE_NOT_A_MEMBER)
            return
        self.user = user

    async def disconnect(self, code):
        metrics.count(metrics.WEBSOCKET_DISCONNECTIONS, socket="chat")
        self.closed = True
        await self.stop_stream()

    async def receive(self, text_data=None, bytes_data=None, **kwargs):
        if self.workspace is None:
            return
        try:
            content = json.loads(text_data or bytes_data or "")
        except ValueError:
            await self.send_error('Messages must be JSON objects such as {"type": "ask", "question": "..."}.')
            return
        if not isinstance(content, dict):
            await self.send_error("Messages must be JSON objects.")
            return
        await self.receive_json(content)

    async def receive_json(self, content, **kwargs):
        kind = content.get("type")
        if kind == "ask":
            await self.ask(content)
        elif kind == "cancel":
            await self.stop_stream()
        else:
            await self.send_error(f'Unknown message type {kind!r}; send "ask" or "cancel".')

    async def ask(self, content: dict) -> None:
        if self.stream is not None and not self.stream.done():
            await self.send_error("Still answering your previous question: wait for it, or press Stop first.")
            return
        try:
            # The chat page's form comes through htmx's websocket extension, which adds its
            # HEADERS: the page is then sent the partials it swaps in, besides the events.
            self.page = "HEADERS" in content
            if self.page:
                request, conversation_id = AskForm(content).ask_request()
            else:
                request = ask_request_from_json(content, fields=CHAT_FIELDS, also=("type", "conversation"))
                conversation_id = content.get("conversation")
            # The gate counts the asker's question limit, as on every door (AskLimited).
            self.turn = await database_sync_to_async(services.turn_start)(
                user=self.user, slug=self.workspace.slug, request=request, conversation_id=conversation_id
            )
        except AskLimited as limited:
            await self.send_error(str(limited), retry_after=limited.retry_after)
            return
        except AskDenied as denied:
            # Removed from the workspace since the socket opened: this question is the last.
            self.workspace = None
            await self.send_error(str(denied))
            await self.close(code=CLOSE_NOT_A_MEMBER)
            return
        except AskError as refusal:
            await self.send_error(str(refusal))
            return
        if self.page:
            await self.send_html(
                render_turn,
                workspace=self.turn.workspace,
                conversation=self.turn.conversation,
                question=request.question,
                mode=request.mode,
                user=self.user,
                new_conversation=self.turn.titled,
            )
        self.stream = asyncio.create_task(
            services.turn_answer(self.turn, emit=self.emit), name=f"chat-answer-{self.turn.conversation.pk}"
        )

    async def stop_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None and not stream.done():
            stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream

    async def emit(self, event: services.TurnEvent) -> None:
        """One event of the turn as the socket's message."""
        if isinstance(event, TokenEvent):
            await self.send_json({"type": "token", "text": event.text})
        elif isinstance(event, RetrievalEvent):
            if self.page:
                retrieved = Message(
                    citations=event.result.citations,
                    subgraph=event.result.subgraph,
                    keywords=event.result.keywords.to_json(),
                )
                await self.send_html(render_sources, message=retrieved, workspace=self.turn.workspace)
            conversation = self.turn.conversation.pk
            await self.send_json({"type": "retrieval", "conversation": conversation, **_retrieval_event(event.result)})
        elif isinstance(event, ErrorEvent):
            await self.send_error(event.message, conversation=self.turn.conversation.pk)
        else:
            await self.send_done(event)

    async def send_done(self, done: services.TurnDone) -> None:
        if self.page and done.message is not None:
            # The answer as a reload shows it (chat/_message.html) replaces the open one, its sources the panel.
            await self.send_html(render_message, done.message, workspace=self.turn.workspace, html=done.html)
            await self.send_html(render_sources, message=done.message, workspace=self.turn.workspace)
        await self.send_json(
            {
                "type": "done",
                "conversation": done.conversation.pk,
                "message": done.message.pk if done.message else None,
                "html": done.html,
                "citations": done.citations,
                "usage": done.usage,
                "stopped": done.stopped,
                "extractive": done.extractive,
            }
        )

    async def send_json(self, content, close=False):
        if not self.closed:
            await super().send_json(content, close=close)

    async def send_html(self, render, *args, **kwargs) -> None:
        if not self.closed:
            await self.send(text_data=await database_sync_to_async(render)(*args, **kwargs))

    async def send_error(self, message: str, **extra) -> None:
        await self.send_json({"type": "error", "message": message, **extra})


def _retrieval_event(result: RetrievalResult) -> dict:
    return {
        "subgraph": result.subgraph,
        "citations": result.citations,
        "keywords": result.keywords.to_json(),
        "timings": result.stats["timings"],
        "sql_queries": result.stats["sql_queries"],
    }
