"""Writes of conversations and messages. Each service does one user-visible thing."""

from uuid import UUID

from django.db import transaction

from chat.models import ChatPreferences, Conversation, Message
from knowledge.models import Workspace
from knowledge.services import answers

TITLE_MAX_CHARS = 80
DEFAULT_TITLE = Conversation._meta.get_field("title").default


def _title_from(question: str) -> str:
    title = " ".join(question.split())
    if len(title) > TITLE_MAX_CHARS:
        title = title[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return title or DEFAULT_TITLE


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
        conversation = conversation_create(workspace=workspace, user=user, title=_title_from(question))
    elif conversation.title == DEFAULT_TITLE:
        conversation.title = _title_from(question)
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


def chat_preferences_save(*, user, mode: str, top_k: int, chunk_top_k: int, response_type: str) -> ChatPreferences:
    """Remember the user's chat settings for every conversation they start or continue."""
    preferences, _ = ChatPreferences.objects.update_or_create(
        user=user,
        defaults={"mode": mode, "top_k": top_k, "chunk_top_k": chunk_top_k, "response_type": response_type},
    )
    return preferences


def conversation_scope_set(*, conversation: Conversation, scope: dict) -> None:
    """Remember the scope the conversation's last question was asked in, for the picker on reload."""
    if conversation.scope != scope:
        Conversation.objects.filter(pk=conversation.pk).update(scope=scope)
        conversation.scope = scope
