"""Writes of conversations and messages. Each service does one user-visible thing.

A chat turn is the conversation use case: `turn_start` passes the gate, finds the conversation,
reads its history and saves the question (titling a new conversation after it); `turn_answer`
asks the ask service (knowledge/services/asking.py) and saves the answer as it was streamed,
stopped or not. The chat socket (chat/consumers.py) only turns their events into messages.
"""

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from dataclasses import asdict, dataclass
from uuid import UUID

from channels.db import database_sync_to_async
from django.db import transaction
from django.http import Http404

from chat import selectors
from chat.models import ChatPreferences, Conversation, Message
from chat.rendering import render_answer
from knowledge.models import Answer, Workspace
from knowledge.rag.answer.citations import answer_citations
from knowledge.rag.llm import Usage
from knowledge.services import answers
from knowledge.services.asking import (
    ENGINE_EXTRACTIVE,
    AskInvalid,
    AskRequest,
    DoneEvent,
    ErrorEvent,
    RetrievalEvent,
    TokenEvent,
    answer_engine,
    ask_stream,
    workspace_for_asking,
)

TITLE_MAX_CHARS = 80
DEFAULT_TITLE = Conversation._meta.get_field("title").default


def _title_from(question: str) -> str:
    title = " ".join(question.split())
    if len(title) > TITLE_MAX_CHARS:
        title = title[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return title or DEFAULT_TITLE


def _distinct_title(workspace: Workspace, user, title: str) -> str:
    """`title`, or with " (2)", " (3)" when the user already has a conversation so titled here,
    so two conversations started with the same question can be told apart in the list."""
    taken = set(
        Conversation.objects.filter(workspace=workspace, user=user, title__startswith=title).values_list(
            "title", flat=True
        )
    )
    candidate, number = title, 1
    while candidate in taken:
        number += 1
        candidate = f"{title} ({number})"
    return candidate


def conversation_create(*, workspace: Workspace, user, title: str = "") -> Conversation:
    return Conversation.objects.create(workspace=workspace, user=user, title=title.strip() or DEFAULT_TITLE)


def conversation_rename(*, conversation: Conversation, title: str) -> Conversation:
    conversation.title = title.strip()[:200] or DEFAULT_TITLE
    conversation.save(update_fields=["title", "updated_at"])
    return conversation


def conversation_set_shared(*, conversation: Conversation, shared: bool) -> Conversation:
    conversation.shared = shared
    conversation.save(update_fields=["shared", "updated_at"])
    return conversation


@transaction.atomic
def conversation_delete(*, conversation: Conversation) -> None:
    answers.answers_forget_conversation(conversation_id=conversation.pk)
    conversation.delete()


@transaction.atomic
def question_record(
    *, conversation: Conversation | None, workspace: Workspace, user, question: str, mode: str
) -> Message:
    """Save a question, starting a conversation titled after it when there is none yet."""
    if conversation is None:
        title = _distinct_title(workspace, user, _title_from(question))
        conversation = conversation_create(workspace=workspace, user=user, title=title)
    elif conversation.title == DEFAULT_TITLE:
        conversation.title = _distinct_title(workspace, user, _title_from(question))
    # Saving also bumps updated_at, so the conversation moves to the top of the list.
    conversation.save()
    return Message.objects.create(conversation=conversation, role=Message.Role.USER, content=question, mode=mode)


def answer_record(
    *,
    conversation: Conversation,
    content: str,
    mode: str,
    extractive: bool,
    stopped: bool,
    keywords: dict,
    citations: list,
    subgraph: dict,
    usage: dict,
    answer_id: UUID | None = None,
) -> Message:
    """Save an answer exactly as it was streamed, with what it was built from, and tie it to the
    ask service's record of the question (`answer_id`), which feedback on the chat page finds."""
    message = Message.objects.create(
        conversation=conversation,
        role=Message.Role.ASSISTANT,
        content=content,
        mode=mode,
        extractive=extractive,
        stopped=stopped,
        keywords=keywords,
        citations=citations,
        subgraph=subgraph,
        usage=usage,
    )
    if answer_id is not None:
        answers.answer_link_message(answer_id=answer_id, message_id=message.pk)
    return message


def chat_preferences_save(
    *,
    user,
    mode: str | None = None,
    top_k: int | None = None,
    chunk_top_k: int | None = None,
    response_type: str | None = None,
) -> ChatPreferences:
    """Remember the chat settings a user changed for every conversation they start or continue;
    a setting given as None keeps its saved value (or its default)."""
    changed = {"mode": mode, "top_k": top_k, "chunk_top_k": chunk_top_k, "response_type": response_type}
    preferences, _ = ChatPreferences.objects.update_or_create(
        user=user, defaults={name: value for name, value in changed.items() if value is not None}
    )
    return preferences


@dataclass(frozen=True)
class Turn:
    """One question of a conversation, saved, with its history, ready to be answered."""

    workspace: Workspace
    user: object
    conversation: Conversation
    request: AskRequest
    # The question started the conversation, or titled one that had no title yet.
    titled: bool = False


@dataclass(frozen=True)
class TurnDone:
    """The end of a turn: the saved answer (None when a stop came before the first token), its
    citations with the sentences it cites and its HTML, each computed once, here."""

    conversation: Conversation
    message: Message | None
    html: str
    citations: list[dict]
    usage: dict
    stopped: bool
    extractive: bool


TurnEvent = RetrievalEvent | TokenEvent | TurnDone | ErrorEvent


def turn_start(*, user, slug: str, request: AskRequest, conversation_id: object = None) -> Turn:
    """Pass the gate, find the conversation and save the question, before anything is retrieved.
    Raises the ask service's AskError subclasses, with a message for the asker."""
    workspace = workspace_for_asking(user=user, slug=slug, mode=request.mode)
    conversation = None
    if conversation_id:
        try:
            conversation = selectors.conversation_for_user(
                workspace=workspace, user=user, conversation_id=conversation_id
            )
        except Http404:
            raise AskInvalid("That conversation does not exist or is not shared with you; start a new one.") from None
    history = selectors.conversation_history(conversation=conversation) if conversation else []
    titled = conversation is None or conversation.title == DEFAULT_TITLE
    question = question_record(
        conversation=conversation, workspace=workspace, user=user, question=request.question, mode=request.mode
    )
    conversation_scope_set(
        conversation=question.conversation, scope=request.scope.as_json() if request.scope.narrowed else {}
    )
    return Turn(
        workspace=workspace,
        user=user,
        conversation=question.conversation,
        request=dataclasses.replace(request, history=tuple(history)),
        titled=titled,
    )


async def turn_answer(turn: Turn, *, emit: Callable[[TurnEvent], Awaitable[None]]) -> None:
    """Answer a turn, handing each event to `emit` as it comes: a RetrievalEvent, TokenEvents,
    then a TurnDone, or an ErrorEvent where it failed. Cancelling the caller stops the model's
    stream; the answer is then saved as far as it was emitted, and a stopped TurnDone emitted."""
    usage = Usage()
    retrieval: RetrievalEvent | None = None
    done: DoneEvent | None = None
    pieces: list[str] = []
    try:
        asker = answers.Asker(user=turn.user, door=Answer.Door.CHAT, conversation_id=turn.conversation.pk)
        stream = ask_stream(workspace=turn.workspace, request=turn.request, usage=usage, asker=asker)
        async with aclosing(stream) as events:
            async for event in events:
                if isinstance(event, DoneEvent):
                    done = event
                    continue
                await emit(event)
                if isinstance(event, ErrorEvent):
                    return
                if isinstance(event, RetrievalEvent):
                    retrieval = event
                elif isinstance(event, TokenEvent):
                    # Kept only once emitted, so a stopped answer saves exactly what the reader saw.
                    pieces.append(event.text)
    except asyncio.CancelledError:
        await emit(await _turn_finish(turn, retrieval, "".join(pieces), usage, citations=None))
        raise
    await emit(await _turn_finish(turn, retrieval, "".join(pieces), usage, citations=done.citations if done else None))


async def _turn_finish(
    turn: Turn, retrieval: RetrievalEvent | None, content: str, usage: Usage, *, citations: list[dict] | None
) -> TurnDone:
    """Save what was streamed; `citations` are the ask service's, None for a stopped answer."""
    stopped = citations is None
    extractive = (retrieval.engine if retrieval else answer_engine()) == ENGINE_EXTRACTIVE
    if retrieval is None:
        return TurnDone(turn.conversation, None, render_answer(content), [], asdict(usage), stopped, extractive)
    if stopped:
        # The ask service cites only a finished answer; a stopped one cites its partial text.
        citations = await asyncio.to_thread(answer_citations, content, retrieval.result)
    message = None
    if content or not stopped:
        result = retrieval.result
        message = await database_sync_to_async(answer_record)(
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
    html = render_answer(content, citations=citations)
    return TurnDone(turn.conversation, message, html, citations, asdict(usage), stopped, extractive)


def conversation_scope_set(*, conversation: Conversation, scope: dict) -> None:
    """Remember the scope the conversation's last question was asked in, for the picker on reload."""
    if conversation.scope != scope:
        Conversation.objects.filter(pk=conversation.pk).update(scope=scope)
        conversation.scope = scope
