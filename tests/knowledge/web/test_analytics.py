"""The analytics page: its numbers are the database's, its CSV says the same, its query count does
not grow with the number of questions, and a flagged answer opens its conversation."""

import csv
import io
import re
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from chat.models import Conversation, Message
from knowledge.models import Answer, Feedback, Role
from knowledge.services.analytics import analytics_report
from tests.factories import make_document, make_user, make_workspace


@pytest.fixture
def team(db, owner, settings):
    settings.MODEL_PRICES = {"gpt-test": (1.0, 4.0)}
    viewer = make_user("viewer")
    workspace = make_workspace(slug="acme", name="Acme", members={owner: Role.OWNER, viewer: Role.VIEWER})
    return workspace, viewer


def _answer(workspace, user, *, days_ago=0, mode="mix", model="gpt-test", outcome="answered", documents=(), **extra):
    when = timezone.now().replace(hour=12, minute=0) - timedelta(days=days_ago)
    return Answer.objects.create(
        uuid=uuid.uuid4(),
        workspace=workspace,
        user=user,
        door=extra.pop("door", "api"),
        question=extra.pop("question", f"Question {uuid.uuid4().hex[:6]}?"),
        mode=mode,
        model=model,
        outcome=outcome,
        source_count=len(documents),
        cited_documents=list(documents),
        created_at=when,
        **extra,
    )


def _seed(workspace, viewer):
    """Two days of questions whose every figure is known."""
    handbook, faq = make_document(workspace, title="Handbook"), make_document(workspace, title="FAQ")
    make_document(workspace, title="Old memo")
    today = [
        _answer(
            workspace,
            viewer,
            documents=[handbook.pk],
            prompt_tokens=1000,
            completion_tokens=200,
            llm_calls=2,
            first_token_ms=100,
        ),
        _answer(
            workspace,
            viewer,
            documents=[handbook.pk, faq.pk],
            prompt_tokens=3000,
            completion_tokens=100,
            llm_calls=2,
            first_token_ms=300,
        ),
        _answer(
            workspace,
            viewer,
            mode="local",
            prompt_tokens=500,
            completion_tokens=50,
            llm_calls=2,
            first_token_ms=200,
            question="What is the refund policy?",
        ),
        _answer(workspace, viewer, mode="naive", outcome="failed", llm_calls=1, question="Why did it fail?"),
    ]
    yesterday = [
        _answer(workspace, viewer, days_ago=1, model="extractive", documents=[faq.pk], first_token_ms=50),
        _answer(
            workspace,
            viewer,
            days_ago=1,
            documents=[handbook.pk],
            prompt_tokens=2000,
            completion_tokens=0,
            llm_calls=1,
            first_token_ms=400,
            question="Who signs expenses?",
        ),
    ]
    Feedback.objects.create(answer=today[0], user=viewer, rating=1)
    Feedback.objects.create(answer=yesterday[1], user=viewer, rating=-1, comment="It is the manager, not HR.")
    return today, yesterday


def test_the_page_shows_the_database_s_numbers(client, team, owner):
    workspace, viewer = team
    _seed(workspace, viewer)
    client.force_login(owner)

    page = client.get(reverse("knowledge:analytics", args=["acme"])).content.decode()

    figures = dict(re.findall(r'data-figure="(\w+)">([^<]*)<', page))
    assert figures["questions"] == "6"
    assert figures["answered"] == "5"
    assert figures["no_source"] == "1"
    assert figures["failed"] == "1"
    assert figures["feedback"] == "1 / 1"
    # Five timed answers: 50, 100, 200, 300, 400 ms.
    assert figures["first_token"] == "200 / 380 ms"
    assert figures["llm_calls"] == "8"
    assert figures["tokens"] == "6,500 / 350"
    # (6,500 × $1 + 350 × $4) per million tokens.
    assert figures["cost"] == "$0.01"
    unanswered = page.split('id="unanswered-title"')[1].split("</section>")[0]
    assert "What is the refund policy?" in unanswered
    assert "Why did it fail?" in unanswered
    assert "Who signs expenses?" in unanswered
    assert "It is the manager, not HR." in unanswered
    assert re.search(r"Handbook</a> <span class=\"muted\">3 answers", page)
    never = page.split('id="never-title"')[1].split("</section>")[0]
    assert "Old memo" in never
    assert "Handbook" not in never


def test_the_csv_says_what_the_page_says(client, team, owner):
    workspace, viewer = team
    _seed(workspace, viewer)
    client.force_login(owner)

    response = client.get(reverse("knowledge:analytics_csv", args=["acme"]) + "?days=7")

    assert response["Content-Type"].startswith("text/csv")
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert len(rows) == 8
    today, yesterday, total = rows[-2], rows[-3], rows[-1]
    assert (today["questions"], today["mode_mix"], today["mode_local"], today["mode_naive"]) == ("4", "2", "1", "1")
    assert (today["no_source"], today["failed"], today["thumbs_up"]) == ("1", "1", "1")
    assert (today["first_token_ms_p50"], today["first_token_ms_p95"]) == ("200", "290")
    assert today["estimated_cost_usd"] == f"{(4500 * 1 + 350 * 4) / 1e6:.4f}"
    assert (yesterday["questions"], yesterday["thumbs_down"], yesterday["prompt_tokens"]) == ("2", "1", "2000")
    assert (total["date"], total["questions"], total["model_calls"]) == ("total", "6", "8")
    assert total["estimated_cost_usd"] == f"{(6500 * 1 + 350 * 4) / 1e6:.4f}"


def test_an_unpriced_model_leaves_the_cost_open_and_says_so(client, team, owner, settings):
    workspace, viewer = team
    settings.MODEL_PRICES = {}
    _answer(workspace, viewer, prompt_tokens=10, completion_tokens=5)
    client.force_login(owner)

    page = client.get(reverse("knowledge:analytics", args=["acme"])).content.decode()

    assert 'data-figure="cost">–<' in page
    assert "No price is set for gpt-test" in page


def test_the_query_count_does_not_grow_with_the_questions(team, owner):
    workspace, viewer = team
    _seed(workspace, viewer)
    with CaptureQueriesContext(connection) as few:
        analytics_report(workspace=workspace)
    for number in range(60):
        answer = _answer(workspace, viewer, days_ago=number % 20, mode=("mix", "local", "global")[number % 3])
        Feedback.objects.create(answer=answer, user=viewer, rating=-1, comment=f"Wrong {number}")

    with CaptureQueriesContext(connection) as many:
        report = analytics_report(workspace=workspace)

    assert len(few) == len(many) == 9
    assert report.unanswered_count == 63
    assert len(report.unanswered) == 50


def test_a_flagged_answer_opens_its_conversation_for_the_owner(client, team, owner):
    workspace, viewer = team
    conversation = Conversation.objects.create(workspace=workspace, user=viewer, title="Private")
    Message.objects.create(conversation=conversation, role="user", content="Earlier question?", mode="mix")
    Message.objects.create(conversation=conversation, role="assistant", content="Earlier answer.", mode="mix")
    Message.objects.create(conversation=conversation, role="user", content="Who signs expenses?", mode="mix")
    message = Message.objects.create(conversation=conversation, role="assistant", content="Nobody knows.", mode="mix")
    answer = _answer(
        workspace,
        viewer,
        door="chat",
        question="Who signs expenses?",
        text="Nobody knows.",
        conversation_id=conversation.pk,
        message_id=message.pk,
    )
    client.force_login(owner)

    listed = client.get(reverse("knowledge:analytics", args=["acme"])).content.decode()
    review = client.get(reverse("knowledge:analytics_answer", args=["acme", answer.pk])).content.decode()

    assert reverse("knowledge:analytics_answer", args=["acme", answer.pk]) in listed
    assert "Earlier question?" in review
    assert "Nobody knows." in review
    assert "None: the answer cites no source." in review


def test_another_workspace_s_answer_is_not_found(client, team, owner):
    workspace, viewer = team
    other = make_workspace(slug="other", members={viewer: Role.OWNER})
    answer = _answer(other, viewer)
    client.force_login(owner)

    assert client.get(reverse("knowledge:analytics_answer", args=["acme", answer.pk])).status_code == 404
