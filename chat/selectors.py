"""Reads of conversations. Every function starts from a workspace the caller may see."""

from django.db.models import Count, Q, QuerySet
from django.http import Http404

from chat.models import ChatPreferences, Conversation, Message
from knowledge.models import Answer, Entity, Feedback, Relation, Workspace
from knowledge.rag.graph.drawing import graph_edge, graph_node
from knowledge.rag.retrieval.searches import entity_degrees

HISTORY_TURNS = 6


def conversations_for_user(*, workspace: Workspace, user) -> QuerySet[Conversation]:
    """The user's own conversations in the workspace plus those other members shared."""
    return (
        Conversation.objects.filter(workspace=workspace)
        .visible_to(user)
        .select_related("user")
        .annotate(message_count=Count("messages"))
    )


def conversation_for_user(*, workspace: Workspace, user, conversation_id, owned: bool = False) -> Conversation:
    """One conversation the user may read (or, with `owned`, change); 404 otherwise."""
    conversations = Conversation.objects.filter(workspace=workspace).select_related("user")
    conversations = conversations.filter(user=user) if owned else conversations.visible_to(user)
    try:
        return conversations.get(pk=int(conversation_id))
    except (Conversation.DoesNotExist, TypeError, ValueError):
        raise Http404("No such conversation.") from None


def conversation_messages(*, conversation: Conversation) -> list[Message]:
    return list(conversation.messages.order_by("created_at", "id"))


def answer_message_for_user(*, workspace: Workspace, user, message_id) -> Message:
    """One answer in a conversation of this workspace the user may read; 404 otherwise."""
    readable = Conversation.objects.filter(workspace=workspace).visible_to(user).values("pk")
    try:
        return Message.objects.get(pk=int(message_id), role=Message.Role.ASSISTANT, conversation__in=readable)
    except (Message.DoesNotExist, TypeError, ValueError):
        raise Http404("No such answer.") from None


def conversation_history(*, conversation: Conversation, turns: int = HISTORY_TURNS) -> list[dict]:
    """The last answered question-answer pairs, oldest first, as chat messages for the model.

    A question left without an answer (the model failed) is skipped, so the model never sees
    two user turns in a row.
    """
    messages = list(conversation.messages.order_by("-created_at", "-id")[: turns * 2 + 2])
    messages.reverse()
    history: list[dict] = []
    for question, answer in zip(messages, messages[1:], strict=False):
        if question.role == Message.Role.USER and answer.role == Message.Role.ASSISTANT:
            history += [
                {"role": "user", "content": question.content},
                {"role": "assistant", "content": answer.content},
            ]
    return history[-turns * 2 :]


def entity_neighbours(*, workspace: Workspace, entity_id, limit: int = 30) -> dict:
    """An entity, its strongest relations and the entities at their other ends, as a subgraph
    in the shape retrieval gives (so the graph panel merges it as it is)."""
    try:
        entity = Entity.objects.published().get(workspace=workspace, pk=int(entity_id))
    except (Entity.DoesNotExist, TypeError, ValueError):
        raise Http404("No such entity.") from None
    relations = list(
        Relation.objects.published()
        .filter(workspace=workspace)
        .filter(Q(source=entity) | Q(target=entity))
        .order_by("-weight", "pk")[:limit]
    )
    others = {relation.target_id if relation.source_id == entity.pk else relation.source_id for relation in relations}
    entities = [entity, *Entity.objects.published().filter(workspace=workspace, pk__in=others).order_by("name")]
    degrees = entity_degrees(entity_ids=[item.pk for item in entities])
    nodes = [
        graph_node(
            pk=item.pk, name=item.name, type=item.type, degree=degrees.get(item.pk, 0), description=item.description
        )
        for item in entities
    ]
    edges = [
        graph_edge(
            pk=relation.pk,
            source_id=relation.source_id,
            target_id=relation.target_id,
            weight=relation.weight,
            keywords=relation.keywords,
            description=relation.description,
        )
        for relation in relations
    ]
    return {"nodes": nodes, "edges": edges}


def chat_preferences_for(*, user) -> ChatPreferences:
    """The user's saved chat settings, or the defaults (unsaved) for a user who never changed them."""
    return ChatPreferences.objects.filter(user=user).first() or ChatPreferences(user=user)


def answer_for_message(*, workspace: Workspace, user, message_id) -> Answer:
    """The record of an answer in a conversation the user may read; 404 otherwise (also for
    answers saved before answers were recorded, which take no feedback)."""
    try:
        message_id = int(message_id)
    except (TypeError, ValueError):
        raise Http404("No such answer.") from None
    readable = Conversation.objects.filter(workspace=workspace).visible_to(user).values("pk")
    answer = Answer.objects.filter(
        workspace=workspace,
        message_id=message_id,
        conversation_id__in=readable,
    ).first()
    if answer is None:
        raise Http404("No such answer.")
    return answer


def feedback_by_message(*, messages: list[Message], user) -> dict[int, Feedback | None]:
    """For each saved answer that takes feedback, the user's feedback on it (None: not given yet)."""
    ids = [message.pk for message in messages if message.role == Message.Role.ASSISTANT]
    answers = dict(Answer.objects.filter(message_id__in=ids).values_list("pk", "message_id"))
    given = {feedback.answer_id: feedback for feedback in Feedback.objects.filter(answer_id__in=answers, user=user)}
    return {message_id: given.get(answer_id) for answer_id, message_id in answers.items()}


def feedback_of(*, answer: Answer, user) -> Feedback | None:
    return Feedback.objects.filter(answer=answer, user=user).first()


def conversation_for_review(*, workspace: Workspace, conversation_id, until_message_id) -> list[Message]:
    """A conversation's messages up to one answer, for the workspace's owners reviewing an answer
    analytics flagged (the caller checks the owner role: this reads private conversations)."""
    if conversation_id is None or until_message_id is None:
        return []
    return list(
        Message.objects.filter(
            conversation__workspace=workspace, conversation_id=conversation_id, pk__lte=until_message_id
        ).order_by("created_at", "id")
    )
