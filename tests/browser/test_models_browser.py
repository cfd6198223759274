"""A chat model connected in the browser answers the next question, without a restart of the server."""

import pytest
from django.test import override_settings
from django.urls import reverse
from playwright.sync_api import expect

from knowledge.models import Role
from knowledge.services.ingestion import document_create, document_ingest
from tests.browser.conftest import ARTIFACTS, console_errors, log_in
from tests.browser.test_chat_browser import HANDBOOK
from tests.chat.conftest import ChatScript
from tests.factories import make_user, make_workspace
from tests.openai_double import CHAT_PATH, OpenAIDouble

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

KEY = "sk-proj-BROWSERkey0123456789abcdef"
WRONG_KEY = "sk-proj-TYPOkey0123456789abcdef"
ANSWER = "The connected model says Ada Lovelace wrote the first published algorithm [S1]."


@pytest.fixture
def model_server(settings):
    """The default install (no chat model in the environment) and a server to connect."""
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    double = OpenAIDouble().start()
    double.api_key = KEY
    script = ChatScript()
    script.answer = ANSWER
    double.reply(script)
    yield double
    double.stop()


@pytest.fixture
def admin(transactional_db):
    user = make_user("admin", password="admin-pass-1", is_staff=True)
    workspace = make_workspace(slug="acme", name="Acme research", members={user: Role.OWNER})
    with override_settings(LLM_BASE_URL="", LLM_API_KEY=""):
        document = document_create(
            workspace=workspace, user=user, filename="handbook.txt", text=HANDBOOK, title="Handbook", enqueue=False
        )
        document = document_ingest(document_id=document.pk)
    assert document.status == document.Status.PROCESSED, document.error
    return user


def _ask(page, server, question: str, answers: int = 1) -> str:
    page.goto(f"{server}{reverse('chat:new', args=['acme'])}")
    page.wait_for_function("() => document.getElementById('chat-status').textContent === 'Ready.'")
    page.fill("#ask-question", question)
    page.keyboard.press("Enter")
    page.wait_for_function(
        "() => document.querySelectorAll('.message-assistant[data-answer]:not([data-answer=\"\"])').length >= 1"
        " && document.getElementById('chat-status').textContent.startsWith('Done')",
        timeout=30_000,
    )
    return page.locator(".message-assistant").last.inner_text()


def test_a_chat_model_added_in_the_browser_answers_the_next_question(model_server, admin, daphne_server, browser_page):
    page = browser_page
    errors = console_errors(page)
    log_in(page, daphne_server, "admin", "admin-pass-1")
    try:
        # The server has read the settings already: no chat model, extractive answers.
        _ask(page, daphne_server, "Who wrote the first published algorithm?")
        assert model_server.chat_requests() == []
        page.click("#needs-chat-model")
        expect(page.locator("h1")).to_have_text("Models")

        page.fill("#id_name", "Team server")
        page.select_option("#id_kind", "openai")
        page.fill("#id_base_url", model_server.base_url)
        page.fill("#id_api_key", WRONG_KEY)
        page.click("#add-endpoint button")
        expect(page.locator(".messages .error")).to_contain_text("refused the API key (401)")
        expect(page.locator(".key-state")).to_have_text("key set")
        assert WRONG_KEY not in page.content()

        card = page.locator("article.endpoint")
        card.locator("input[name=api_key]").fill(KEY)
        card.get_by_role("button", name="Replace key").click()
        expect(page.locator(".messages .success")).to_contain_text("serves 2 model(s)")
        page.locator("article.endpoint select[name=model]").select_option("double-chat")
        page.get_by_role("button", name="Use for chat").click()
        expect(page.locator("#chat-in-use")).to_contain_text("double-chat at Team server")
        assert KEY not in page.content()

        answer = _ask(page, daphne_server, "Who wrote the first published algorithm?")

        assert "The connected model says Ada Lovelace wrote the first published algorithm" in answer
        streamed = [request for request in model_server.chat_requests() if request.body.get("stream")]
        assert streamed[-1].body["model"] == "double-chat"
        assert errors == []
    except Exception:
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "models-browser.png"), full_page=True)
        raise
    assert model_server.requests_to(CHAT_PATH)
