"""The chat websocket: docs/architecture.md, "The websocket protocol".

An adapter over the ask service (knowledge/services/asking.py) that also keeps the conversation: the
question is saved when it is asked, the answer when it ends, with what it was built from.
Every question passes the membership gate and the asker's rate limit (RATE_LIMIT_ASK; the
`error` event then carries `retry_after`, in seconds). One consumer per socket. An answer
streams in its own task so the socket keeps reading (`cancel` must get through while tokens
flow); the consumer owns that task and cancels it on `cancel` and on disconnect, so a closed
tab never leaves a model stream running.
"""

import asyncio
import contextlib
import dataclasses
import json
from contextlib import aclosing
from dataclasses import asdict, dataclass

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.http import Http404

from chat import selectors, services
from chat.models import Conversation
from chat.rendering import render_answer, render_message
from knowledge.models import Answer, Workspace
from knowledge.rag.answer.citations import answer_citations
from knowledge.rag.llm import Usage
from knowledge.rag.retrieval import RetrievalResult
from knowledge.selectors import workspace_for_user
from knowledge.services.asking import (
    ASK_FIELDS,
    ENGINE_EXTRACTIVE,
    AskDenied,
    Asker,
    AskError,
    AskInvalid,
    AskRequest,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    answer_engine,
    ask_request_from_json,
    ask_stream,
    workspace_for_asking,
)
from knowledge.services.ratelimits import RateLimited, rate_limit_check

CLOSE_NOT_LOGGED_IN = 4401
CLOSE_NOT_A_MEMBER = 4403
# The conversation is the history, and a chat answers: the rest of a request may come in `ask`.
CHAT_FIELDS = tuple(name for name in ASK_FIELDS if name not in {"history", "context_only"})


@dataclass
class Turn:
    workspace: Workspace
    conversation: Conversation
    request: AskRequest


class ChatConsumer(AsyncJsonWebsocketConsumer):
    # Answers go to this socket only, so it joins no channel layer: an open chat tab then
    # holds no blocking Redis read.
    channel_layer_alias = None
    workspace: Workspace | None = None
    stream: asyncio.Task | None = None
    closed = False

    async def connect(self):
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
            request = ask_request_from_json(content, fields=CHAT_FIELDS, also=("type", "conversation"))
            await database_sync_to_async(rate_limit_check)(limit="RATE_LIMIT_ASK", user=self.user)
            turn = await self.start_turn(request, content.get("conversation"))
        except RateLimited as limited:
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
        self.stream = asyncio.create_task(self.answer(turn), name=f"chat-answer-{turn.conversation.pk}")

    async def stop_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None and not stream.done():
            stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream

    @database_sync_to_async
    def start_turn(self, request: AskRequest, conversation_id) -> Turn:
        """Pass the gate, find the conversation and save the question, before anything is retrieved."""
        workspace = workspace_for_asking(user=self.user, slug=self.workspace.slug, mode=request.mode)
        conversation = None
        if conversation_id:
            try:
                conversation = selectors.conversation_for_user(
                    workspace=workspace, user=self.user, conversation_id=conversation_id
                )
            except Http404:
                raise AskInvalid(
                    "That conversation does not exist or is not shared with you; start a new one."
                ) from None
        history = selectors.conversation_history(conversation=conversation) if conversation else []
        question = services.question_record(
            conversation=conversation, workspace=workspace, user=self.user, question=request.question, mode=request.mode
        )
        scope = request.scope.as_json() if request.scope.narrowed else {}
        services.conversation_scope_set(conversation=question.conversation, scope=scope)
        return Turn(
            workspace=workspace,
            conversation=question.conversation,
            request=dataclasses.replace(request, history=tuple(history)),
        )

    async def answer(self, turn: Turn) -> None:
        usage = Usage()
        retrieval: RetrievalEvent | None = None
        pieces: list[str] = []
        conversation = turn.conversation.pk
        try:
            asker = Asker(user=self.user, door=Answer.Door.CHAT, conversation_id=turn.conversation.pk)
            stream = ask_stream(workspace=turn.workspace, request=turn.request, usage=usage, asker=asker)
            async with aclosing(stream) as events:
                async for event in events:
                    if isinstance(event, ErrorEvent):
                        await self.send_error(event.message, conversation=conversation)
                        return
                    if isinstance(event, RetrievalEvent):
                        retrieval = event
                        await self.send_json(
                            {"type": "retrieval", "conversation": conversation, **_retrieval_event(event.result)}
                        )
                    elif isinstance(event, TokenEvent):
                        await self.send_json({"type": "token", "text": event.text})
                        # Kept only once sent, so a stopped answer saves exactly what the reader saw.
                        pieces.append(event.text)
        except asyncio.CancelledError:
            await self.finish(turn, retrieval, pieces, usage, stopped=True)
            raise
        await self.finish(turn, retrieval, pieces, usage, stopped=False)

    async def finish(
        self, turn: Turn, retrieval: RetrievalEvent | None, pieces: list[str], usage: Usage, *, stopped: bool
    ) -> None:
        """Save what was streamed (a stopped answer keeps its partial text) and send `done`."""
        content = "".join(pieces)
        extractive = (retrieval.engine if retrieval else answer_engine()) == ENGINE_EXTRACTIVE
        message = None
        # Computed here rather than taken from the DoneEvent: a stopped answer has none.
        citations = await asyncio.to_thread(answer_citations, content, retrieval.result) if retrieval else []
        if retrieval is not None and (content or not stopped):
            result = retrieval.result
            message = await database_sync_to_async(services.answer_record)(
                conversation=turn.conversation,
                content=content,
                mode=turn.request.mode,
                extractive=extractive,
                stopped=stopped,
                keywords=result.keywords.to_json(),
                citations=citations,
                subgraph=result.subgraph,
                usage=asdict(usage),
                answer_id=retrieval.answer_id,
            )
        await self.send_json(
            {
                "type": "done",
                "conversation": turn.conversation.pk,
                "message": message.pk if message else None,
                "html": render_answer(content, citations=citations if retrieval else None),
                "citations": citations,
                # The message as a reload shows it (chat/_message.html), to replace the streamed one.
                "message_html": (
                    await database_sync_to_async(render_message)(message, workspace=turn.workspace) if message else ""
                ),
                "usage": asdict(usage),
                "stopped": stopped,
                "extractive": extractive,
            }
        )

    async def send_json(self, content, close=False):
        if not self.closed:
            await super().send_json(content, close=close)

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
