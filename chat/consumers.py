"""The chat websocket: DESIGN.md, "The websocket protocol".

One consumer per socket. An answer streams in its own task so the socket keeps reading
(`cancel` must get through while tokens flow); the consumer owns that task and cancels it
on `cancel` and on disconnect, so a closed tab never leaves a model stream running.
"""

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import asdict, dataclass, field

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.db import connection
from django.http import Http404

from chat import selectors, services
from chat.forms import AskForm
from chat.models import Conversation
from chat.rendering import render_answer
from knowledge.answer import answer_is_extractive, astream_answer
from knowledge.llm import LLMError, Usage
from knowledge.models import Chunk, Document, Workspace
from knowledge.retrieval import DEFAULT_TOP_K, RetrievalResult, retrieve
from knowledge.selectors import workspace_for_user

logger = logging.getLogger(__name__)

CLOSE_NOT_LOGGED_IN = 4401
CLOSE_NOT_A_MEMBER = 4403


class Refusal(Exception):
    """An `ask` that cannot be answered; the message tells the user what to do instead."""


@dataclass
class Turn:
    conversation: Conversation
    question: str
    mode: str
    top_k: int
    history: list[dict] = field(default_factory=list)


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
        form = AskForm(data=content)
        if not form.is_valid():
            await self.send_error(form.first_error())
            return
        try:
            turn = await self.start_turn(form.cleaned_data)
        except Refusal as refusal:
            await self.send_error(str(refusal))
            return
        self.stream = asyncio.create_task(self.answer(turn), name=f"chat-answer-{turn.conversation.pk}")

    async def stop_stream(self) -> None:
        stream, self.stream = self.stream, None
        if stream is not None and not stream.done():
            stream.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stream

    async def answer(self, turn: Turn) -> None:
        usage = Usage()
        result = None
        pieces: list[str] = []
        try:
            # Retrieval blocks on SQL and embeddings; outside the shared thread so one
            # slow question does not hold up every other socket of this process.
            started = time.perf_counter()
            result = await database_sync_to_async(self.retrieve, thread_sensitive=False)(turn, usage)
            result.stats["timings"]["total"] = round((time.perf_counter() - started) * 1000, 2)
            await self.send_json(
                {"type": "retrieval", "conversation": turn.conversation.pk, **_retrieval_event(result)}
            )
            async for piece in astream_answer(question=turn.question, result=result, history=turn.history, usage=usage):
                await self.send_json({"type": "token", "text": piece})
                # Kept only once sent, so a stopped answer saves exactly what the reader saw.
                pieces.append(piece)
        except asyncio.CancelledError:
            await self.finish(turn, result, pieces, usage, stopped=True)
            raise
        except LLMError as err:
            await self.send_error(str(err), conversation=turn.conversation.pk)
            return
        except Exception:
            logger.exception("Answering in conversation %s failed", turn.conversation.pk)
            await self.send_error(
                "Something went wrong while answering; the error was logged. Try again, or try another mode.",
                conversation=turn.conversation.pk,
            )
            return
        await self.finish(turn, result, pieces, usage, stopped=False)

    async def finish(self, turn: Turn, result, pieces: list[str], usage: Usage, *, stopped: bool) -> None:
        """Save what was streamed (a stopped answer keeps its partial text) and send `done`."""
        content = "".join(pieces)
        message = None
        if result is not None and (content or not stopped):
            message = await database_sync_to_async(services.answer_record)(
                conversation=turn.conversation,
                content=content,
                mode=turn.mode,
                extractive=answer_is_extractive(),
                stopped=stopped,
                keywords=result.keywords.to_json(),
                citations=result.citations,
                subgraph=result.subgraph,
                usage=asdict(usage),
            )
        await self.send_json(
            {
                "type": "done",
                "conversation": turn.conversation.pk,
                "message": message.pk if message else None,
                "html": render_answer(content),
                "usage": asdict(usage),
                "stopped": stopped,
                "extractive": answer_is_extractive(),
            }
        )

    def retrieve(self, turn: Turn, usage: Usage) -> RetrievalResult:
        try:
            return retrieve(
                workspace=self.workspace,
                question=turn.question,
                mode=turn.mode,
                top_k=turn.top_k,
                history=turn.history,
                usage=usage,
            )
        finally:
            # Runs on a pool thread, of which there are many: a connection left open there
            # would idle until the process exits.
            connection.close()

    @database_sync_to_async
    def start_turn(self, data: dict) -> Turn:
        conversation = None
        if data.get("conversation"):
            try:
                conversation = selectors.conversation_for_user(
                    workspace=self.workspace, user=self.user, conversation_id=data["conversation"]
                )
            except Http404:
                raise Refusal("That conversation does not exist or is not shared with you; start a new one.") from None
        if data["mode"] != "bypass" and not Chunk.objects.filter(workspace=self.workspace).exists():
            raise Refusal(_no_documents_message(self.workspace))
        history = selectors.conversation_history(conversation=conversation) if conversation else []
        question = services.question_record(
            conversation=conversation,
            workspace=self.workspace,
            user=self.user,
            question=data["question"],
            mode=data["mode"],
        )
        return Turn(
            conversation=question.conversation,
            question=data["question"],
            mode=data["mode"],
            top_k=data.get("top_k") or DEFAULT_TOP_K,
            history=history,
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


def _no_documents_message(workspace: Workspace) -> str:
    if Document.objects.filter(
        workspace=workspace, status__in=[Document.Status.PENDING, Document.Status.PROCESSING]
    ).exists():
        return "Your documents are still being processed; ask again when they show as processed."
    return "This workspace has no documents yet. Upload one on the workspace page, then ask again."
