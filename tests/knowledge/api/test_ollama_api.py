"""The Ollama-compatible API, driven by the `ollama` client against daphne."""

import json
import threading

import httpx
import ollama
import pytest

from knowledge.api.ollama import OLLAMA_VERSION
from knowledge.api.protocols import SOURCES_HEADING
from knowledge.models import Document
from knowledge.rag.retrieval import MODES
from tests.knowledge.conftest import ANSWER, QUESTION_TEXT
from tests.knowledge.team_graph import ask as retrieve_team


def client(served_team, token=None, **options) -> ollama.Client:
    headers = {"Authorization": f"Bearer {token or served_team['token']}"}
    return ollama.Client(host=served_team["url"], headers=headers, **options)


def chat(served_team, content=QUESTION_TEXT, model="acme:latest", **options):
    return client(served_team).chat(model=model, messages=[{"role": "user", "content": content}], **options)


def test_it_lists_the_workspaces_a_token_may_use_as_tagged_models(served_team):
    Document.objects.filter(workspace=served_team["workspace"]).update(tags=["team"])

    models = client(served_team).list().models

    names = [model.model for model in models]
    assert names == [
        "acme:latest",
        *(f"acme:{mode}" for mode in MODES),
        "acme/team:latest",
        "empty:latest",
        *(f"empty:{mode}" for mode in MODES),
    ]
    assert models[0].details.family == "graphrag-teams"


def test_it_tells_its_version_to_a_token_holder(served_team):
    response = httpx.get(
        f"{served_team['url']}/api/version", headers={"Authorization": f"Bearer {served_team['token']}"}
    )

    assert response.json() == {"version": OLLAMA_VERSION}


def test_it_streams_a_chat_answer_as_ndjson_with_the_sources_last(served_team):
    parts = list(chat(served_team, stream=True))

    assert len(parts) > 2
    assert all(not part.done for part in parts[:-1])
    assert parts[-1].done
    assert parts[-1].done_reason == "stop"
    text = "".join(part.message.content for part in parts)
    answer, sources = text.split(SOURCES_HEADING)
    assert answer == ANSWER
    assert sources.startswith("1. [S2] Team notes <http://")
    assert parts[-1].eval_count > 0


def test_it_streams_each_token_as_the_model_sends_it(served_team, served_double):
    served_double.hold_last_token = hold = threading.Event()
    # Were the answer buffered, nothing would arrive while the model holds its last token, and
    # the read would time out.
    parts = client(served_team, timeout=30).chat(
        model="acme:latest", messages=[{"role": "user", "content": QUESTION_TEXT}], stream=True
    )

    received = ""
    for part in parts:
        received += part.message.content
        if received == ANSWER.rsplit(" ", 1)[0] + " ":
            hold.set()
    assert hold.is_set()
    assert received.startswith(ANSWER + SOURCES_HEADING)


def test_it_answers_a_chat_whole_when_not_streaming_and_reports_its_sources_in_a_field(served_team):
    response = httpx.post(
        f"{served_team['url']}/api/chat",
        headers={"Authorization": f"Bearer {served_team['token']}"},
        json={"model": "acme", "messages": [{"role": "user", "content": QUESTION_TEXT}], "stream": False},
    )

    data = response.json()
    assert data["done"] is True
    assert data["message"]["content"].startswith(ANSWER + SOURCES_HEADING)
    assert [source["id"] for source in data["sources"]] == ["S2", "R1"]
    assert data["model"] == "acme"


def test_generate_answers_the_prompt_from_the_workspace(served_team, served_double):
    whole = client(served_team).generate(model="acme:latest", prompt=QUESTION_TEXT, stream=False)
    pieces = list(client(served_team).generate(model="acme:latest", prompt=QUESTION_TEXT, stream=True))

    assert whole.response.startswith(ANSWER + SOURCES_HEADING)
    assert "".join(piece.response for piece in pieces) == whole.response
    assert served_double.chat_requests()[-1].last_user_message == QUESTION_TEXT


@pytest.mark.parametrize(
    ("prefix", "model", "mode"),
    [
        ("/naive ", "acme:latest", "naive"),
        ("/local ", "acme:naive", "local"),
        ("/global ", "acme:latest", "global"),
        ("/hybrid ", "acme:latest", "hybrid"),
        ("/mix ", "acme:naive", "mix"),
        ("", "acme:local", "local"),
        ("", "acme:latest", "mix"),
    ],
)
def test_the_prefix_or_else_the_model_chooses_the_mode(served_team, served_double, prefix, model, mode):
    chat(served_team, prefix + QUESTION_TEXT, model=model, stream=False)

    prompt = served_double.chat_requests()[-1].messages[0]["content"]
    assert retrieve_team(served_team["workspace"], mode=mode).context in prompt
    assert served_double.chat_requests()[-1].last_user_message == QUESTION_TEXT


def test_the_context_prefixes_return_the_context_and_bypass_skips_retrieval(served_team, served_double):
    context = chat(served_team, "/context " + QUESTION_TEXT, stream=False).message.content
    local_context = chat(served_team, "/localcontext " + QUESTION_TEXT, stream=False).message.content
    answer_calls = [request for request in served_double.chat_requests() if request.body.get("stream")]
    bypassed = chat(served_team, "/bypass Say hello.", stream=False).message.content

    assert context.startswith(retrieve_team(served_team["workspace"], mode="mix").context + SOURCES_HEADING)
    assert local_context.startswith(retrieve_team(served_team["workspace"], mode="local").context + SOURCES_HEADING)
    assert answer_calls == []
    assert bypassed.startswith(ANSWER)
    assert served_double.chat_requests()[-1].last_user_message == "Say hello."


def test_open_webui_background_tasks_go_to_the_model_without_retrieval(served_team, served_double):
    task = "### Task:\nGenerate a concise title.\n### Chat History:\n<chat_history>\nUSER: Who is Bob?\n</chat_history>"

    chat(served_team, task, stream=False)

    prompt = served_double.chat_requests()[-1].messages[0]["content"]
    assert "-----Entities-----" not in prompt
    assert len(served_double.chat_requests()) == 1


def test_it_refuses_bad_tokens_and_hides_other_workspaces(served_team):
    with pytest.raises(ollama.ResponseError) as bad_token:
        client(served_team, token="grt_mistyped").list()
    with pytest.raises(ollama.ResponseError) as hidden:
        client(served_team, token=served_team["stranger_token"]).chat(
            model="acme:latest", messages=[{"role": "user", "content": "Hi"}], stream=False
        )
    anonymous = httpx.get(f"{served_team['url']}/api/tags")

    assert bad_token.value.status_code == 401
    assert "not valid" in bad_token.value.error
    assert hidden.value.status_code == 404
    assert hidden.value.error == "model 'acme:latest' not found, or you do not have access to it"
    assert anonymous.status_code == 401
    assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    ("body", "status", "message"),
    [
        ({"model": "acme:deep", "messages": [{"role": "user", "content": "Hi"}]}, 404, "model 'acme:deep' not found"),
        ({"model": "acme", "messages": [{"role": "assistant", "content": "Hi"}]}, 400, "The last message must be"),
        (
            {"model": "acme", "messages": [{"role": "user", "content": "Hi"}], "options": {"chunk_top_k": 0}},
            400,
            "'chunk_top_k' must be a whole number from 1 to 200",
        ),
        ({"model": "acme", "messages": [{"role": "user", "content": "Hi"}], "stream": "no"}, 400, "'stream' must be"),
        ({"model": "empty", "messages": [{"role": "user", "content": "Hi"}]}, 409, "no documents yet"),
    ],
)
def test_it_refuses_bad_requests_with_an_error_ollama_clients_read(served_team, body, status, message):
    response = httpx.post(
        f"{served_team['url']}/api/chat",
        headers={"Authorization": f"Bearer {served_team['token']}"},
        content=json.dumps(body),
    )

    assert response.status_code == status
    assert message in response.json()["error"]


def test_ollamas_sampling_top_k_is_not_our_graph_rows_per_search(served_team, served_double):
    reply = chat(served_team, stream=False, options={"top_k": 1})

    assert reply.message.content.startswith(ANSWER)
    prompt = served_double.chat_requests()[-1].messages[0]["content"]
    assert retrieve_team(served_team["workspace"], mode="mix").context in prompt


def test_a_model_failing_midway_is_an_error_line_the_client_raises(served_team, served_double):
    chat(served_team, stream=False)  # the keywords are cached now, so the next failure hits the answer
    served_double.fail(1, status=503)

    with pytest.raises(ollama.ResponseError) as failed:
        list(chat(served_team, stream=True))

    assert failed.value.error
