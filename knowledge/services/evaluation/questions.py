"""Evaluation sets: the paper's question generation with prompts of our own.

Describe the corpus from a sample, imagine users, for each user their tasks, and for each
(user, task) questions that need the whole corpus rather than one passage.
"""

import re

from django.db import transaction
from django.db.models import Count

from knowledge.models import Chunk, Entity, EvaluationQuestion, EvaluationSet, Workspace
from knowledge.rag import llm
from knowledge.rag.tokens import count_tokens, decode, encode
from knowledge.services.evaluation.judging import extract_json
from knowledge.services.evaluation.prompts import (
    DESCRIBE_SYSTEM,
    DESCRIBE_USER,
    QUESTIONS_USER,
    TASKS_USER,
    USERS_USER,
)

SAMPLE_CHUNKS = 12
SAMPLE_CHUNK_TOKENS = 350
SAMPLE_ENTITIES = 40
_LIST_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])\s+(.+?)\s*$")


class EvaluationError(Exception):
    """The evaluation cannot go on; the message says what to do."""


def require_chat_model(what: str) -> None:
    if not llm.chat_model_configured():
        raise EvaluationError(
            f"{what} needs a chat model, and none is configured. Connect one on the Models page (/models/), "
            "or set LLM_BASE_URL (and LLM_API_KEY), or LLM_API_KEY alone for OpenAI; see docs/models.md."
        )


def corpus_sample(*, workspace: Workspace) -> tuple[str, str]:
    """Excerpts spread evenly over the workspace's chunks, and the most mentioned entities with descriptions."""
    chunk_ids = list(
        Chunk.objects.filter(workspace=workspace).order_by("document_id", "order").values_list("pk", flat=True)
    )
    if not chunk_ids:
        raise EvaluationError(f"Workspace {workspace.slug!r} has no processed documents to ask questions about.")
    step = max(1, len(chunk_ids) // SAMPLE_CHUNKS)
    picked = chunk_ids[::step][:SAMPLE_CHUNKS]
    texts = Chunk.objects.filter(pk__in=picked).order_by("document_id", "order").values_list("text", flat=True)
    excerpts = "\n\n".join(decode(encode(text)[:SAMPLE_CHUNK_TOKENS]).strip() for text in texts)
    entities = (
        Entity.objects.filter(workspace=workspace)
        .annotate(mentions=Count("sources"))
        .order_by("-mentions", "name")
        .values_list("name", "type", "description")[:SAMPLE_ENTITIES]
    )
    names = "\n".join(
        f"- {name} ({kind}): {' '.join(description.split())[:200]}" for name, kind, description in entities
    )
    return excerpts, names or "(none extracted yet)"


def parse_list(reply: str, *, count: int) -> list[str]:
    """A JSON array of strings from the reply, or failing that its bulleted or numbered lines; at most `count`."""
    data = extract_json(reply)
    if isinstance(data, dict):
        data = next((value for value in data.values() if isinstance(value, list)), None)
    if isinstance(data, list):
        items = [item if isinstance(item, str) else _describe_item(item) for item in data]
    else:
        items = [match.group(1) for line in reply.splitlines() if (match := _LIST_ITEM.match(line))]
    return [" ".join(item.split()) for item in items if item and item.strip()][:count]


def _describe_item(item) -> str:
    # Some models answer [{"user": "...", "description": "..."}]: keep all of its text.
    if isinstance(item, dict):
        return "; ".join(str(value) for value in item.values() if value)
    return str(item)


def _user_message(content: str) -> list[dict]:
    return [{"role": "user", "content": content}]


def _lists(prompts: list[str], *, count: int, stage: str, usage: llm.Usage) -> list[list[str]]:
    replies = llm.complete_many([_user_message(prompt) for prompt in prompts], kind="eval-generate", usage=usage)
    lists = []
    for reply in replies:
        if isinstance(reply, llm.LLMError):
            raise EvaluationError(f"Generating {stage} failed: {reply}")
        items = parse_list(reply, count=count)
        if not items:
            raise EvaluationError(f"The chat model's reply listing {stage} held no list: {reply[:300]!r}")
        lists.append(items)
    return lists


def evaluation_set_generate(
    *,
    workspace: Workspace,
    name: str,
    users: int = 5,
    tasks: int = 5,
    questions: int = 5,
    created_by=None,
) -> EvaluationSet:
    """Imagine users x tasks x questions for the workspace's corpus and store them as an evaluation set."""
    require_chat_model("Generating questions")
    if EvaluationSet.objects.filter(workspace=workspace, name=name).exists():
        raise EvaluationError(f"Workspace {workspace.slug!r} already has an evaluation set named {name!r}.")
    if min(users, tasks, questions) < 1:
        raise EvaluationError("users, tasks and questions must each be at least 1.")
    usage = llm.Usage()
    excerpts, entities = corpus_sample(workspace=workspace)
    description = llm.complete(
        [
            {"role": "system", "content": DESCRIBE_SYSTEM},
            {"role": "user", "content": DESCRIBE_USER.format(excerpts=excerpts, entities=entities)},
        ],
        kind="eval-generate",
        usage=usage,
    ).strip()
    personas = _lists(
        [USERS_USER.format(description=description, count=users)], count=users, stage="users", usage=usage
    )[0]
    task_lists = _lists(
        [TASKS_USER.format(description=description, persona=persona, count=tasks) for persona in personas],
        count=tasks,
        stage="tasks",
        usage=usage,
    )
    pairs = [
        (persona, task) for persona, persona_tasks in zip(personas, task_lists, strict=True) for task in persona_tasks
    ]
    question_lists = _lists(
        [
            QUESTIONS_USER.format(description=description, persona=persona, task=task, count=questions)
            for persona, task in pairs
        ],
        count=questions,
        stage="questions",
        usage=usage,
    )
    with transaction.atomic():
        evaluation_set = EvaluationSet.objects.create(
            workspace=workspace,
            name=name,
            corpus_description=description,
            generation={
                "model": llm.chat_model_name(),
                "users": users,
                "tasks": tasks,
                "questions": questions,
                "prompt_tokens": usage.prompt_tokens,
                "completion_tokens": usage.completion_tokens,
                "llm_calls": usage.calls,
                "sample_tokens": count_tokens(excerpts),
            },
            created_by=created_by,
        )
        EvaluationQuestion.objects.bulk_create(
            EvaluationQuestion(
                evaluation_set=evaluation_set, order=order, persona=persona[:500], task=task[:500], text=text
            )
            for order, (persona, task, text) in enumerate(
                (persona, task, text)
                for (persona, task), texts in zip(pairs, question_lists, strict=True)
                for text in texts
            )
        )
    return evaluation_set
