"""Every API answer is recorded with an id the client gets back, and feedback comes back by it:
the OpenAI API through the `openai` package's stored-completion calls, the Ollama API through
POST /api/feedback, the HTTP API through its answers' feedback path. Real clients, real daphne."""

import httpx
import openai
import pytest

from knowledge.models import Answer, Feedback
from tests.knowledge.conftest import ANSWER, QUESTION_TEXT


def _openai(served_team, token=None):
    return openai.OpenAI(base_url=f"{served_team['url']}/v1", api_key=token or served_team["token"], max_retries=0)


def _headers(served_team, token=None):
    return {"Authorization": f"Bearer {token or served_team['token']}"}


def test_an_openai_completion_is_recorded_and_rated_through_the_stored_completion_calls(served_team):
    client = _openai(served_team)
    completion = client.chat.completions.create(
        model="acme:local", messages=[{"role": "user", "content": QUESTION_TEXT}]
    )

    updated = client.chat.completions.update(completion.id, metadata={"rating": "down", "comment": "Missed Dave."})
    stored = client.chat.completions.retrieve(completion.id)

    answer = Answer.objects.get()
    assert completion.id == f"chatcmpl-{answer.uuid.hex}"
    assert (answer.door, answer.mode, answer.model, answer.outcome) == ("openai", "local", "double-chat", "answered")
    assert (answer.question, answer.text) == (QUESTION_TEXT, ANSWER)
    assert [source["id"] for source in answer.sources] == ["R1", "S2"]
    assert answer.source_count == 2
    assert answer.cited_documents
    assert answer.completion_tokens > 0
    assert answer.first_token_ms is not None
    assert updated.metadata == {"rating": "down", "comment": "Missed Dave."}
    assert stored.choices[0].message.content == ANSWER
    feedback = Feedback.objects.get()
    assert (feedback.answer, feedback.rating, feedback.comment) == (answer, -1, "Missed Dave.")


def test_a_streamed_openai_answer_carries_the_recorded_id_in_every_chunk(served_team):
    chunks = list(
        _openai(served_team).chat.completions.create(
            model="acme", messages=[{"role": "user", "content": QUESTION_TEXT}], stream=True
        )
    )

    assert {chunk.id for chunk in chunks} == {f"chatcmpl-{Answer.objects.get().uuid.hex}"}
    assert Answer.objects.get().outcome == "answered"


def test_openai_feedback_is_refused_for_someone_else_s_answer_and_for_bad_metadata(served_team):
    completion = _openai(served_team).chat.completions.create(
        model="acme", messages=[{"role": "user", "content": QUESTION_TEXT}]
    )

    with pytest.raises(openai.NotFoundError):
        _openai(served_team, served_team["stranger_token"]).chat.completions.update(
            completion.id, metadata={"rating": "up"}
        )
    with pytest.raises(openai.BadRequestError, match="'rating' must be"):
        _openai(served_team).chat.completions.update(completion.id, metadata={"rating": "meh"})
    with pytest.raises(openai.BadRequestError, match="Unknown field 'stars'"):
        _openai(served_team).chat.completions.update(completion.id, metadata={"rating": "up", "stars": "5"})
    with pytest.raises(openai.NotFoundError):
        _openai(served_team).chat.completions.retrieve("chatcmpl-not-an-id")
    assert not Feedback.objects.exists()


def test_an_ollama_reply_carries_its_id_and_takes_feedback_by_it(served_team):
    reply = httpx.post(
        f"{served_team['url']}/api/chat",
        json={"model": "acme:latest", "messages": [{"role": "user", "content": QUESTION_TEXT}], "stream": False},
        headers=_headers(served_team),
        timeout=60,
    ).json()

    given = httpx.post(
        f"{served_team['url']}/api/feedback",
        json={"id": reply["id"], "rating": "up", "comment": ""},
        headers=_headers(served_team),
        timeout=10,
    )
    again = httpx.post(
        f"{served_team['url']}/api/feedback",
        json={"id": reply["id"], "rating": "down", "comment": "On reflection, no."},
        headers=_headers(served_team),
        timeout=10,
    )
    stranger = httpx.post(
        f"{served_team['url']}/api/feedback",
        json={"id": reply["id"], "rating": "up"},
        headers=_headers(served_team, served_team["stranger_token"]),
        timeout=10,
    )

    answer = Answer.objects.get()
    assert reply["id"] == str(answer.uuid)
    assert answer.door == "ollama"
    assert given.json() == {"answer_id": reply["id"], "rating": "up", "comment": ""}
    assert again.json()["rating"] == "down"
    assert stranger.status_code == 404
    assert [(f.rating, f.comment) for f in Feedback.objects.all()] == [(-1, "On reflection, no.")]


def test_the_http_api_answer_carries_its_id_and_takes_feedback_by_it(served_team):
    url = f"{served_team['url']}/api/workspaces/acme"
    answer = httpx.post(
        f"{url}/query", json={"question": QUESTION_TEXT, "mode": "naive"}, headers=_headers(served_team), timeout=60
    ).json()

    given = httpx.post(
        f"{url}/answers/{answer['answer_id']}/feedback",
        json={"rating": "down", "comment": "x" * 2001},
        headers=_headers(served_team),
        timeout=10,
    )
    fixed = httpx.post(
        f"{url}/answers/{answer['answer_id']}/feedback",
        json={"rating": "down", "comment": "Wrong year."},
        headers=_headers(served_team),
        timeout=10,
    )
    elsewhere = httpx.post(
        f"{served_team['url']}/api/workspaces/empty/answers/{answer['answer_id']}/feedback",
        json={"rating": "up"},
        headers=_headers(served_team),
        timeout=10,
    )

    assert Answer.objects.get(uuid=answer["answer_id"]).door == "api"
    assert given.status_code == 400
    assert "too long" in given.json()["error"]
    assert fixed.json() == {"answer_id": answer["answer_id"], "rating": "down", "comment": "Wrong year."}
    assert elsewhere.status_code == 404
    assert Feedback.objects.get().comment == "Wrong year."
