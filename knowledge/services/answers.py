"""The record of every question asked through a door, and feedback on its answer.

The ask service (knowledge/services/asking.py) starts a record when a question passes the gate
and completes it when the answer's stream ends, however it ends (answered, stopped, failed), so
analytics count every question once, whichever door it came through, and an API client gets the
answer's id to give feedback by. Feedback is one rating per member and answer, with a comment.
"""

import uuid
from dataclasses import dataclass, field

from django.db import transaction

from knowledge import metrics
from knowledge.models import Answer, Feedback, Workspace
from knowledge.rag import llm
from knowledge.rag.answer.citations import cited_ids

COMMENT_MAX_CHARS = 2000
RATINGS = {"up": Feedback.Rating.UP, "down": Feedback.Rating.DOWN, 1: Feedback.Rating.UP, -1: Feedback.Rating.DOWN}


class FeedbackInvalid(Exception):
    """Feedback that cannot be stored as given; the message says what to send instead."""


@dataclass(frozen=True)
class Asker:
    """Who asks, and through which door (Answer.Door): the ask service records their question."""

    user: object
    door: str
    conversation_id: int | None = None


@dataclass
class Tally:
    """What the ask service notes about one answer while it streams."""

    answer_id: uuid.UUID
    started: float
    door: str = ""
    mode: str = ""
    first_token: float | None = None
    pieces: list[str] = field(default_factory=list)
    outcome: str = Answer.Outcome.STOPPED
    citations: list[dict] = field(default_factory=list)


def answer_start(*, workspace: Workspace, asker: Asker, question: str, mode: str, model: str) -> Answer:
    return Answer.objects.create(
        uuid=uuid.uuid4(),
        workspace=workspace,
        user=asker.user,
        door=asker.door,
        question=question,
        mode=mode,
        model=model,
        conversation_id=asker.conversation_id,
    )


def cited_rows(answer: str, citations: list[dict]) -> list[dict]:
    """The rows an answer cites, in the order it first cites them, as stored with the answer."""
    by_id = {citation["id"]: citation for citation in citations}
    keep = ("id", "kind", "label", "document_id", "document_title", "chunk_id", "section", "location", "sentence")
    return [{key: by_id[row_id].get(key) for key in keep} for row_id in cited_ids(answer) if row_id in by_id]


def answer_finish(*, tally: Tally, usage, ended: float) -> None:
    """Complete the record: outcome, text, what it cites, what it cost and how long it took."""
    text = "".join(tally.pieces)
    sources = cited_rows(text, tally.citations)
    documents = sorted({row["document_id"] for row in sources if row.get("document_id") is not None})
    Answer.objects.filter(uuid=tally.answer_id).update(
        outcome=tally.outcome,
        text=text,
        sources=sources,
        source_count=len(sources),
        cited_documents=documents,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        llm_calls=usage.calls,
        first_token_ms=None if tally.first_token is None else round((tally.first_token - tally.started) * 1000),
        total_ms=round((ended - tally.started) * 1000),
    )
    metrics.count(metrics.QUESTIONS, door=tally.door, mode=tally.mode, outcome=tally.outcome)
    metrics.observe(metrics.QUESTION_SECONDS, ended - tally.started, mode=tally.mode)
    if tally.first_token is not None:
        metrics.observe(metrics.QUESTION_FIRST_TOKEN_SECONDS, tally.first_token - tally.started, mode=tally.mode)


def answer_link_message(*, answer_id: uuid.UUID, message_id: int) -> None:
    """The chat saved this answer as a message: feedback on the chat page finds the record by it."""
    Answer.objects.filter(uuid=answer_id).update(message_id=message_id)


def answers_forget_conversation(*, conversation_id: int) -> None:
    """A deleted conversation's questions leave the record (its words go; the counts stay, so the
    cost of the past does not change when someone tidies their chats)."""
    Feedback.objects.filter(answer__conversation_id=conversation_id).update(comment="")
    Answer.objects.filter(conversation_id=conversation_id).update(
        question="", text="", sources=[], message_id=None, conversation_id=None
    )


def check_rating(value: object) -> int:
    if isinstance(value, str):
        value = value.strip().lower()
    if isinstance(value, bool) or value not in RATINGS:
        raise FeedbackInvalid(f'\'rating\' must be "up" or "down" (or 1 or -1), got {value!r}.')
    return RATINGS[value]


def check_comment(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise FeedbackInvalid("'comment' must be text.")
    if len(value.strip()) > COMMENT_MAX_CHARS:
        raise FeedbackInvalid(
            f"'comment' is too long ({len(value.strip()):,} characters; at most {COMMENT_MAX_CHARS:,})."
        )
    return value.strip()


@transaction.atomic
def feedback_give(*, answer: Answer, user, rating: object, comment: object = None) -> Feedback:
    """Store (or change) this member's rating of the answer, with an optional comment."""
    feedback, _ = Feedback.objects.update_or_create(
        answer=answer, user=user, defaults={"rating": check_rating(rating), "comment": check_comment(comment)}
    )
    # The caller has the answer already; an async door must not fetch it again lazily.
    feedback.answer = answer
    return feedback


def model_name(engine: str) -> str:
    """What answered, as the record names it: the chat model, or "extractive"."""
    return "extractive" if engine == "extractive" else llm.chat_model_name()
