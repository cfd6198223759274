"""The OpenAI-compatible API, driven by the official `openai` client against daphne."""

import threading

import openai
import pytest

from knowledge.api.protocols import SOURCES_HEADING
from knowledge.models import Document
from knowledge.rag.retrieval import MODES
from tests.knowledge.conftest import ANSWER, QUESTION_TEXT


def client(served_team, token=None, **options) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{served_team['url']}/v1", api_key=token or served_team["token"], max_retries=0, **options
    )


def ask(served_team, question=QUESTION_TEXT, model="acme", **options):
    return client(served_team).chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}], **options
    )


def test_it_lists_the_workspaces_a_token_may_use_as_models_with_one_per_document_tag(served_team):
    Document.objects.filter(workspace=served_team["workspace"]).update(tags=["team", "notes"])

    models = client(served_team).models.list()

    ids = [model.id for model in models]
    assert ids == [
        "acme",
        *(f"acme:{mode}" for mode in MODES),
        "acme/notes",
        "acme/team",
        "empty",
        *(f"empty:{mode}" for mode in MODES),
    ]
    assert {model.owned_by for model in models} == {"Acme", "Empty"}
    assert "hidden" not in ids


def test_it_answers_from_the_workspace_with_usage_and_its_sources(served_team, served_double):
    completion = client(served_team).chat.completions.create(
        model="acme:mix",
        messages=[
            {"role": "system", "content": "You are a pirate."},
            {"role": "user", "content": [{"type": "text", "text": QUESTION_TEXT}]},
        ],
    )

    content = completion.choices[0].message.content
    answer, sources = content.split(SOURCES_HEADING)
    assert answer == ANSWER
    assert completion.choices[0].finish_reason == "stop"
    assert completion.model == "acme:mix"
    extra = completion.model_extra
    assert [source["id"] for source in extra["sources"]] == ["S2", "R1"]
    passage = extra["sources"][0]
    assert passage["document_title"] == "Team notes"
    assert passage["sentence"] == "Alice, Bob and Carol met Dave."
    assert passage["url"].startswith(f"{served_team['url']}/workspaces/acme/documents/")
    assert sources.splitlines()[0] == f"1. [S2] Team notes <{passage['url']}>"
    assert sources.splitlines()[1].startswith("2. [R1] Bob – Carol")
    assert extra["answer_engine"] == "llm"
    assert completion.usage.completion_tokens > 0
    assert completion.usage.total_tokens == completion.usage.prompt_tokens + completion.usage.completion_tokens
    answer_call = served_double.chat_requests()[-1]
    # Our instructions with the mix context, not the client's system prompt.
    assert "pirate" not in str(answer_call.messages)
    assert "-----Entities-----" in answer_call.messages[0]["content"]
    assert answer_call.last_user_message == QUESTION_TEXT


def test_it_streams_server_sent_events_with_the_sources_and_usage_at_the_end(served_team):
    stream = ask(served_team, stream=True, stream_options={"include_usage": True})

    chunks = list(stream)
    contents = [chunk.choices[0].delta.content for chunk in chunks if chunk.choices and chunk.choices[0].delta.content]
    assert len(contents) > 2
    text = "".join(contents)
    assert text.startswith(ANSWER + SOURCES_HEADING)
    finished = [chunk for chunk in chunks if chunk.choices and chunk.choices[0].finish_reason == "stop"]
    assert [source["id"] for source in finished[0].model_extra["sources"]] == ["S2", "R1"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage.completion_tokens > 0
    assert len({chunk.id for chunk in chunks}) == 1


def test_it_streams_each_token_as_the_model_sends_it(served_team, served_double):
    served_double.hold_last_token = hold = threading.Event()
    # Were the answer buffered, nothing would arrive while the model holds its last token, and
    # the read would time out.
    stream = client(served_team, timeout=30).chat.completions.create(
        model="acme", messages=[{"role": "user", "content": QUESTION_TEXT}], stream=True
    )

    received = ""
    for chunk in stream:
        received += chunk.choices[0].delta.content or "" if chunk.choices else ""
        if received == ANSWER.rsplit(" ", 1)[0] + " ":
            hold.set()
    assert hold.is_set()
    assert received.startswith(ANSWER + SOURCES_HEADING)


def test_it_passes_earlier_turns_as_history_without_their_sources(served_team, served_double):
    earlier = ask(served_team).choices[0].message.content
    assert SOURCES_HEADING in earlier

    client(served_team).chat.completions.create(
        model="acme",
        messages=[
            {"role": "user", "content": QUESTION_TEXT},
            {"role": "assistant", "content": earlier},
            {"role": "user", "content": "And what does Bob do?"},
        ],
    )

    messages = served_double.chat_requests()[-1].messages
    assert messages[1:] == [
        {"role": "user", "content": QUESTION_TEXT},
        {"role": "assistant", "content": ANSWER},
        {"role": "user", "content": "And what does Bob do?"},
    ]


def test_a_lightrag_prefix_chooses_the_mode_for_one_question(served_team, served_double):
    ask(served_team, f"/naive {QUESTION_TEXT}", model="acme:local")
    naive_call = served_double.chat_requests()[-1]
    context = ask(served_team, f"/context {QUESTION_TEXT}").choices[0].message.content

    assert "-----Entities-----" not in naive_call.messages[0]["content"]
    assert "-----Sources-----" in naive_call.messages[0]["content"]
    assert naive_call.last_user_message == QUESTION_TEXT
    assert context.startswith("-----Entities-----")
    # The context was the reply: no answer call after the naive question's.
    assert len([r for r in served_double.chat_requests() if r.body.get("stream")]) == 1


def test_it_refuses_bad_tokens_with_openai_errors(served_team):
    for token in ["not-a-token", "grt_mistyped"]:
        with pytest.raises(openai.AuthenticationError) as refused:
            client(served_team, token=token).models.list()

        assert refused.value.status_code == 401
        assert refused.value.body["type"] == "invalid_request_error"
        assert refused.value.body["code"] == "invalid_api_key"


def test_it_hides_workspaces_the_token_may_not_use_as_missing_models(served_team):
    stranger = client(served_team, token=served_team["stranger_token"])

    for model in ["acme", "acme:local", "nowhere", "hidden:deep"]:
        with pytest.raises(openai.NotFoundError) as hidden:
            stranger.chat.completions.create(model=model, messages=[{"role": "user", "content": "Hi"}])

        assert hidden.value.body["code"] == "model_not_found"
        assert hidden.value.body["message"] == f"The model {model!r} does not exist or you do not have access to it."


@pytest.mark.parametrize(
    ("messages", "message"),
    [
        ([], "'messages' must be a non-empty list"),
        ([{"role": "assistant", "content": "Hi"}], "The last message must be the user's question"),
        ([{"role": "user", "content": "  "}], "'question' is required"),
        ([{"role": "user", "content": "x" * 8001}], "'question' is too long"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "must be text"),
    ],
)
def test_it_rejects_bad_requests_with_the_ask_services_messages(served_team, messages, message):
    with pytest.raises(openai.BadRequestError) as refused:
        client(served_team).chat.completions.create(model="acme", messages=messages)

    assert message in refused.value.body["message"]


def test_it_passes_our_answer_options_through_the_extra_body(served_team):
    with pytest.raises(openai.BadRequestError) as refused:
        ask(served_team, extra_body={"top_k": 500})

    assert refused.value.body["message"] == "'top_k' must be a whole number from 1 to 200, got 500."


def test_it_refuses_a_workspace_without_documents_with_409(served_team):
    with pytest.raises(openai.ConflictError) as refused:
        ask(served_team, model="empty")

    assert refused.value.body["code"] == "workspace_not_ready"


def test_a_failing_model_is_a_502_before_the_answer_and_an_error_event_during_it(served_team, served_double):
    served_double.fail(1, status=503)
    with pytest.raises(openai.InternalServerError) as failed:
        ask(served_team)
    assert failed.value.status_code == 502

    ask(served_team)  # the keywords are cached now, so the next failure hits the answer
    served_double.fail(1, status=503)
    with pytest.raises(openai.APIError) as midway:
        list(ask(served_team, stream=True))
    assert midway.value.body["type"] == "server_error"
