"""Writes of conversations and messages (chat/services.py)."""

import pytest

from chat.services import question_record
from knowledge.models import Role
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
