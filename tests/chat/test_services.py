"""Writes of conversations and messages (chat/services.py)."""

import pytest

from chat.forms import AskForm
from chat.models import Conversation
from chat.services import question_record, turn_start
from knowledge.models import Role
from knowledge.rag.retrieval import Scope
from knowledge.services.asking import AskInvalid
from tests.factories import make_user, make_workspace

pytestmark = pytest.mark.django_db


def test_two_conversations_started_with_the_same_question_get_distinct_titles():
    user, other = make_user("asker"), make_user("other")
    workspace = make_workspace(slug="acme", members={user: Role.VIEWER, other: Role.VIEWER})
    asked = "Who wrote the first program?"

    def start(asker):
        return question_record(conversation=None, workspace=workspace, user=asker, question=asked, mode="mix")

    titles = [start(user).conversation.title for _ in range(3)]
    others = start(other)

    assert titles == [asked, f"{asked} (2)", f"{asked} (3)"]
    # Titles are told apart within one person's list; another's list is theirs.
    assert others.conversation.title == asked


def test_the_chat_forms_scope_is_asked_in_and_remembered_by_its_conversation(handbook_workspace, viewer):
    # As htmx's websocket extension sends ticked checkboxes: one value a string, several a list.
    sent = {"HEADERS": {}, "type": "ask", "question": "Who wrote it?", "conversation": ""}
    scoped = AskForm({**sent, "scope_tag": "People", "scope_document": ["7", "9"]}).ask_request()[0]
    everything = AskForm(sent).ask_request()[0]

    turn = turn_start(user=viewer, slug=handbook_workspace.slug, request=scoped)
    again = turn_start(
        user=viewer, slug=handbook_workspace.slug, request=everything, conversation_id=turn.conversation.pk
    )

    assert scoped.scope == Scope(tags=("people",), documents=(7, 9))
    assert turn.conversation.scope == {"tags": ["people"], "documents": [7, 9]}
    assert Conversation.objects.get(pk=turn.conversation.pk).scope == {}  # the last question's scope
    assert again.request.scope == Scope()
    with pytest.raises(AskInvalid, match="scope list"):
        AskForm({**sent, "scope_document": "x"}).ask_request()
