"""Feedback on the chat page: thumbs up or down with a comment, by the chat message's id."""

import uuid

import pytest
from django.urls import reverse

from chat.models import Conversation, Message
from chat.services import conversation_delete
from knowledge.models import Answer, Feedback, Role
from tests.factories import make_user, make_workspace


@pytest.fixture
def team(db, owner):
    viewer = make_user("viewer")
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER, viewer: Role.VIEWER})
    return workspace, viewer


def _answered(workspace, user, *, shared=False):
    conversation = Conversation.objects.create(workspace=workspace, user=user, title="About Ada", shared=shared)
    Message.objects.create(conversation=conversation, role="user", content="Who wrote it?", mode="mix")
    message = Message.objects.create(conversation=conversation, role="assistant", content="Ada [S1].", mode="mix")
    Answer.objects.create(
        uuid=uuid.uuid4(),
        workspace=workspace,
        user=user,
        door="chat",
        question="Who wrote it?",
        mode="mix",
        model="extractive",
        outcome="answered",
        text="Ada [S1].",
        conversation_id=conversation.pk,
        message_id=message.pk,
    )
    return conversation, message


def _url(workspace, message):
    return reverse("chat:feedback", args=[workspace.slug, message.pk])


def test_a_reloaded_answer_offers_feedback_and_keeps_what_was_given(client, team):
    workspace, viewer = team
    conversation, message = _answered(workspace, viewer)
    client.force_login(viewer)

    client.post(_url(workspace, message), {"rating": "down"}, headers={"HX-Request": "true"})
    saved = client.post(
        _url(workspace, message), {"rating": "down", "comment": "It was Babbage."}, headers={"HX-Request": "true"}
    )
    page = client.get(reverse("chat:conversation", args=[workspace.slug, conversation.pk])).content.decode()

    assert saved.status_code == 200
    assert "What was wrong or missing?" in saved.content.decode()
    feedback = Feedback.objects.get()
    assert (feedback.rating, feedback.comment, feedback.user) == (-1, "It was Babbage.", viewer)
    assert feedback.answer.message_id == message.pk
    assert 'value="down" class="feedback-rate feedback-down" aria-pressed="true"' in page
    assert "It was Babbage.</textarea>" in page


def test_a_plain_form_post_comes_back_to_the_conversation(client, team):
    workspace, viewer = team
    conversation, message = _answered(workspace, viewer)
    client.force_login(viewer)

    response = client.post(_url(workspace, message), {"rating": "up"})

    assert response.status_code == 302
    assert response.url == reverse("chat:conversation", args=[workspace.slug, conversation.pk])
    assert Feedback.objects.get().rating == 1


def test_a_bad_rating_is_refused(client, team):
    workspace, viewer = team
    _, message = _answered(workspace, viewer)
    client.force_login(viewer)

    response = client.post(_url(workspace, message), {"rating": "sideways"}, headers={"HX-Request": "true"})

    assert response.status_code == 400
    assert "must be" in response.content.decode()
    assert not Feedback.objects.exists()


def test_members_rate_shared_answers_but_not_private_ones(client, team, owner):
    workspace, viewer = team
    _, private = _answered(workspace, viewer)
    _, shared = _answered(workspace, viewer, shared=True)
    client.force_login(owner)

    assert client.post(_url(workspace, private), {"rating": "up"}).status_code == 404
    assert client.post(_url(workspace, shared), {"rating": "up"}).status_code == 302
    assert Feedback.objects.get().user == owner


def test_a_deleted_conversation_takes_its_words_out_of_the_record_and_keeps_the_counts(team):
    workspace, viewer = team
    conversation, _ = _answered(workspace, viewer)
    Answer.objects.update(prompt_tokens=120)
    Feedback.objects.create(answer=Answer.objects.get(), user=viewer, rating=-1, comment="It was Babbage.")

    conversation_delete(conversation=conversation)

    answer = Answer.objects.get()
    assert (answer.question, answer.text, answer.message_id, answer.prompt_tokens) == ("", "", None, 120)
    assert (Feedback.objects.get().rating, Feedback.objects.get().comment) == (-1, "")
