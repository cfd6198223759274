"""The Models page: staff add, test and pick; everyone else reads; the key never comes back."""

import pytest
from django.urls import reverse

from knowledge.models import ModelChoice, ModelEndpoint, Reembedding
from knowledge.rag.llm import servers
from tests.factories import make_user
from tests.openai_double import OpenAIDouble

pytestmark = pytest.mark.django_db

KEY = "sk-proj-PAGEkey0123456789abcdef"
WRONG_KEY = "sk-proj-WRONGpage9876543210zyx"
PAGE = reverse("knowledge:models")


@pytest.fixture
def server(settings, monkeypatch):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    settings.LLM_RETRY_BACKOFF = 0.0
    double = OpenAIDouble(dim=384).start()
    double.api_key = KEY
    double.reply("OK")
    # No Ollama on this machine's default port during these tests, whatever runs there.
    monkeypatch.setattr(servers, "OLLAMA_DEFAULT_URL", double.root_url)
    yield double
    double.stop()


@pytest.fixture
def staff_client(client, db):
    client.force_login(make_user("admin", is_staff=True))
    return client


def _add(client, server, key):
    return client.post(
        reverse("knowledge:model_endpoint_add"),
        {"name": "Team server", "kind": "openai", "base_url": server.base_url, "api_key": key},
        follow=True,
    )


def test_a_wrong_key_shows_a_clear_message_on_the_page_and_never_the_key(staff_client, server):
    page = _add(staff_client, server, WRONG_KEY).content.decode()

    assert "refused the API key (401)" in page
    assert "key set" in page
    assert WRONG_KEY not in page
    assert ModelEndpoint.objects.get().api_key_encrypted not in page


def test_staff_add_an_endpoint_and_pick_its_chat_model(staff_client, server):
    _add(staff_client, server, KEY)
    endpoint = ModelEndpoint.objects.get()

    page = staff_client.post(
        reverse("knowledge:model_chat_pick"), {"endpoint": endpoint.pk, "model": "double-chat"}, follow=True
    ).content.decode()

    assert ModelChoice.objects.get(purpose="chat").model == "double-chat"
    assert "double-chat answers from now on." in page
    assert '<option value="double-embed">' in page
    assert KEY not in page
    assert endpoint.api_key_encrypted not in page


def test_a_pick_without_a_model_is_refused(staff_client, server):
    _add(staff_client, server, KEY)
    endpoint = ModelEndpoint.objects.get()

    page = staff_client.post(reverse("knowledge:model_chat_pick"), {"endpoint": endpoint.pk}, follow=True)

    assert "Pick one of the endpoint&#x27;s models." in page.content.decode()
    assert not ModelChoice.objects.exists()


def test_an_invalid_address_keeps_the_form_without_the_key(staff_client, server):
    response = staff_client.post(
        reverse("knowledge:model_endpoint_add"),
        {"name": "Bad", "kind": "openai", "base_url": "file:///etc/passwd", "api_key": KEY},
    )

    assert response.status_code == 400
    assert "is not an http:// or https:// address" in response.content.decode()
    assert KEY not in response.content.decode()
    assert not ModelEndpoint.objects.exists()


def test_members_read_which_models_answer_but_change_nothing(client, server):
    client.force_login(make_user("member"))

    page = client.get(PAGE).content.decode()

    assert "ask an administrator" in page
    assert "Add an endpoint" not in page
    response = client.post(
        reverse("knowledge:model_endpoint_add"),
        {"name": "Mine", "kind": "openai", "base_url": server.base_url, "api_key": KEY},
    )
    assert response.status_code == 403
    assert not ModelEndpoint.objects.exists()


def test_a_local_ollama_is_offered_and_connected(staff_client, server):
    server.ollama_version = "0.6.2"

    page = staff_client.get(PAGE).content.decode()
    assert "Ollama found on this machine" in page
    assert "double-chat, double-embed" in page

    page = staff_client.post(reverse("knowledge:model_ollama_connect"), follow=True).content.decode()
    endpoint = ModelEndpoint.objects.get()
    assert (endpoint.kind, endpoint.base_url) == ("ollama", server.root_url)
    assert "serves 2 model(s)" in page
    assert "Ollama found on this machine" not in page


def test_the_chat_hint_links_to_the_models_page(client, owner, workspace, server):
    client.force_login(owner)

    chat = client.get(reverse("chat:new", args=[workspace.slug])).content.decode()
    overview = client.get(reverse("knowledge:workspace", args=[workspace.slug])).content.decode()

    assert f'href="{PAGE}"' in chat
    assert f'href="{PAGE}"' in overview


def test_the_re_embedding_progress_polls_while_running_and_stops_when_done(staff_client, server):
    running = Reembedding.objects.create(model="double-embed at Team server", dimensions=384, total=40, done=10)
    progress = reverse("knowledge:model_reembedding")

    page = staff_client.get(progress).content.decode()
    assert 'value="10"' in page
    assert 'hx-trigger="every 2s"' in page

    Reembedding.objects.filter(pk=running.pk).update(status=Reembedding.Status.FINISHED, done=40)
    page = staff_client.get(progress).content.decode()
    assert "Re-embedded 40 rows with double-embed at Team server" in page
    assert "hx-trigger" not in page


INSTALLATION_URLS = [
    ("knowledge:models", (), "get"),
    ("knowledge:model_endpoint_add", (), "post"),
    ("knowledge:model_ollama_connect", (), "post"),
    ("knowledge:model_endpoint_check", (1,), "post"),
    ("knowledge:model_endpoint_key", (1,), "post"),
    ("knowledge:model_endpoint_delete", (1,), "post"),
    ("knowledge:model_chat_pick", (), "post"),
    ("knowledge:model_embedding_pick", (), "post"),
    ("knowledge:model_reembedding", (), "get"),
    ("knowledge:model_reembedding_retry", (1,), "post"),
]


@pytest.mark.parametrize(("name", "args", "method"), INSTALLATION_URLS)
def test_every_models_url_sends_visitors_to_log_in_and_refuses_changes_from_non_staff(client, name, args, method):
    url = reverse(name, args=args)

    visitor = getattr(client, method)(url)
    assert visitor.status_code == 302
    assert "/login" in visitor["Location"]
    client.force_login(make_user("member"))
    member = getattr(client, method)(url)
    assert member.status_code == (200 if method == "get" else 403)
