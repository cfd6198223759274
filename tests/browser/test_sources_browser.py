"""A saved answer with a big retrieved subgraph and citations carrying sections, pages and cited
sentences (as the retrieval service will send them): the panels show what it cites first, and
every page passes axe-core without serious or critical violations."""

import re

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from chat.models import Conversation, Message
from knowledge.models import EntitySource, Role
from tests.browser.conftest import ARTIFACTS, axe_violations, console_errors, label_boxes, log_in, overlapping
from tests.factories import make_chunk, make_document, make_entity, make_relation, make_user, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

TEXT = (
    "Engines of the nineteenth century. "
    "Charles Babbage designed the Analytical Engine in London. "
    "Ada Lovelace wrote the first published algorithm for it in 1843. "
    "The engine was never finished."
)
TYPES = ["person", "organization", "location", "event", "concept", "technology"]
NODES = 143


def _citation(row_id, kind, label, document, chunk, **extra):
    return {
        "id": row_id,
        "kind": kind,
        "label": label,
        "document_id": document.pk,
        "document_title": document.title,
        "chunk_id": chunk.pk,
        "char_start": chunk.char_start,
        "char_end": chunk.char_end,
        "excerpt": f"What the sources say about {label}.",
        **extra,
    }


@pytest.fixture
def saved_answer(transactional_db):
    user = make_user("reader", password="reader-pass-1")
    workspace = make_workspace(slug="acme", name="Acme research", members={user: Role.EDITOR})
    document = make_document(workspace, title="Handbook", text=TEXT)
    chunk = make_chunk(document, text=TEXT)
    ada = make_entity(workspace, "Ada Lovelace", type="person", description="Wrote the first published algorithm.")
    engine = make_entity(workspace, "Analytical Engine", type="technology")
    make_relation(ada, engine, keywords="algorithm", description="Ada wrote a program for the engine.")
    EntitySource.objects.create(entity=ada, chunk=chunk, name="Ada Lovelace", description="Ada wrote it.")

    sentence = "Ada Lovelace wrote the first published algorithm for it in 1843."
    start = TEXT.index(sentence)
    nodes = [
        {"id": str(n), "label": f"Entity number {n}", "type": TYPES[n % len(TYPES)], "degree": 40 - n % 40, "row": None}
        for n in range(1, NODES + 1)
    ]
    for n in range(1, 61):
        nodes[n - 1]["row"] = f"E{n}"
    # As retrieval returns them: stars around a few well-connected entities, some joined.
    hubs = range(1, 7)
    edges = [
        {"id": f"r{n}", "source": str(hubs[n % 6]), "target": str(n), "weight": 1 + n % 5,
         "keywords": "linked", "row": f"R{n}" if n <= 40 else None}
        for n in range(7, NODES + 1)
    ] + [
        {"id": f"r{1000 + hub}", "source": str(hub), "target": str(hub % 6 + 1), "weight": 3, "keywords": "linked",
         "row": None}
        for hub in hubs
    ]  # fmt: skip
    citations = [
        _citation(
            "S1", "source", "Handbook", document, chunk,
            section="Handbook > History > Engines", location="p. 4", sentence=sentence,
            sentence_start=start, sentence_end=start + len(sentence),
        ),
        _citation("S2", "source", "Handbook", document, chunk, location="p. 7"),
        _citation("S3", "source", "Handbook", document, chunk),
        *(_citation(f"E{n}", "entity", f"Entity number {n}", document, chunk) for n in range(1, 61)),
        *(_citation(f"R{n}", "relation", f"Entity number {n} – another", document, chunk) for n in range(1, 41)),
    ]  # fmt: skip
    conversation = Conversation.objects.create(workspace=workspace, user=user, title="Who wrote the algorithm?")
    Message.objects.create(conversation=conversation, role="user", content="Who wrote the first algorithm?\nAnd when?")
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        mode="mix",
        content="Ada Lovelace wrote it in 1843 [S1] [E5]. Babbage designed the engine [R9] [S2].",
        subgraph={"nodes": nodes, "edges": edges},
        citations=citations,
        keywords={"low_level": ["Ada Lovelace"], "high_level": ["early computing"]},
    )
    return {"workspace": workspace, "conversation": conversation, "document": document, "entity": ada}


def test_a_big_subgraph_shows_what_the_answer_cites_first_readably(saved_answer, daphne_server, browser_page):
    page = browser_page
    errors = console_errors(page)
    log_in(page, daphne_server, "reader", "reader-pass-1")
    page.goto(f"{daphne_server}{reverse('chat:conversation', args=['acme', saved_answer['conversation'].pk])}")
    page.wait_for_function("() => window.chatGraph() && window.chatGraph().nodes().length > 0")

    # About thirty nodes by default, the cited ones among them; "show all" expands.
    drawn = page.evaluate("window.chatGraph().nodes().map(node => node.data('row'))")
    assert len(drawn) == 30
    assert "E5" in drawn
    # E5 itself, and both ends of R9 (hub 4 and entity 9), get the ring.
    ringed = page.evaluate("window.chatGraph().nodes('.cited').map(node => String(node.data('entity')))")
    assert sorted(ringed) == ["4", "5", "9"]
    expect(page.locator("#graph-summary")).to_have_text(
        "30 of 143 entities · " + page.evaluate("String(window.chatGraph().edges().length)") + " relations"
    )
    # Every node inside the panel; labels 12 px on screen, none over another, the cited ones among them.
    outside = page.evaluate(
        """() => { const cy = window.chatGraph();
                   return cy.nodes().filter(n => { const b = n.renderedBoundingBox({ includeLabels: false });
                       return b.x1 < 0 || b.y1 < 0 || b.x2 > cy.width() || b.y2 > cy.height(); }).length; }"""
    )
    assert outside == 0
    page.wait_for_function("() => window.chatGraph().nodes('.labelled').length > 0")
    labels = label_boxes(page, "window.chatGraph()")
    assert {"4", "5", "9"} <= {str(label["entity"]) for label in labels}
    assert all(abs(label["px"] - 12) < 0.01 for label in labels)
    assert overlapping(labels) == []
    overlaps = page.evaluate(
        """() => { const boxes = window.chatGraph().nodes().map(n => n.renderedBoundingBox({ includeLabels: false }));
                   let overlaps = 0;
                   for (let i = 0; i < boxes.length; i++) for (let j = i + 1; j < boxes.length; j++) {
                       const a = boxes[i], b = boxes[j];
                       if (a.x1 < b.x2 && b.x1 < a.x2 && a.y1 < b.y2 && b.y1 < a.y2) overlaps += 1; }
                   return overlaps; }"""
    )
    assert overlaps == 0
    page.screenshot(path=str(ARTIFACTS / "chat-subgraph.png"))
    page.click("#graph-show-all")
    assert page.evaluate("window.chatGraph().nodes().length") == NODES
    page.click("#graph-show-all")
    assert page.evaluate("window.chatGraph().nodes().length") == 30

    # Sources first, with section, page and the cited sentence; the rest folded with its count.
    cited = page.locator("#cited > li")
    assert cited.evaluate_all("items => items.map(item => item.dataset.cite)") == ["S1", "S2", "E5", "R9"]
    first = page.locator("#cite-S1")
    expect(first).to_contain_text("Handbook")
    expect(first).to_contain_text("Handbook > History > Engines · p. 4")
    expect(first.locator("blockquote")).to_have_text("Ada Lovelace wrote the first published algorithm for it in 1843.")
    href = first.locator("a").get_attribute("href")
    assert "start=" in href
    assert "end=" in href
    expect(page.locator("#retrieved summary")).to_have_text(f"Everything retrieved ({3 + 60 + 40 - 4})")
    assert page.locator("#retrieved").evaluate("details => details.open") is False
    # The server-rendered message lists the same sources, with the same links.
    assert page.locator(".answer-sources li a").first.get_attribute("href") in href

    # Hovering a citation marks its nodes; hovering a node marks its citations.
    page.hover("#cite-E5")
    assert page.evaluate("window.chatGraph().nodes('.hovered').map(node => node.data('row'))") == ["E5"]
    # (The real mouse over a node is in test_chat_browser.py; here the node is told directly,
    # since where it lands in this random layout decides what the pointer crosses on its way.)
    page.evaluate("window.chatGraph().nodes().filter(n => n.data('row') === 'E5').emit('mouseover')")
    expect(page.locator("#cite-E5")).to_have_class(re.compile(r"\bhover-linked\b"))
    page.evaluate("window.chatGraph().nodes().filter(n => n.data('row') === 'E5').emit('mouseout')")

    # A larger view on demand; Escape closes it.
    page.click("#graph-enlarge")
    box = page.locator("#graph-panel").bounding_box()
    assert box["width"] > 1300
    assert box["height"] > 800
    page.screenshot(path=str(ARTIFACTS / "chat-graph-enlarged.png"))
    page.keyboard.press("Escape")
    assert page.locator("#graph-panel").bounding_box()["width"] < 800

    # The user's question keeps its line break, as when it was asked live.
    assert page.locator(".message-user .message-body").inner_text() == "Who wrote the first algorithm?\nAnd when?"

    with page.context.expect_page() as opened:
        first.locator("a").click()
    document_page = opened.value
    document_page.wait_for_load_state()
    expect(document_page.locator("#cited-sentence")).to_have_text(
        "Ada Lovelace wrote the first published algorithm for it in 1843."
    )
    assert errors == []


def test_the_pages_pass_axe_without_serious_violations(saved_answer, daphne_server, browser_page):
    page = browser_page
    log_in(page, daphne_server, "reader", "reader-pass-1")
    pages = {
        "chat": reverse("chat:conversation", args=["acme", saved_answer["conversation"].pk]),
        "graph": reverse("knowledge:graph", args=["acme"]),
        "documents": reverse("knowledge:documents", args=["acme"]),
        "upload": reverse("knowledge:upload", args=["acme"]),
        "entities": reverse("knowledge:entities", args=["acme"]),
        "entity": reverse("knowledge:entity", args=["acme", saved_answer["entity"].pk]),
    }
    found = {}
    for name, path in pages.items():
        page.goto(f"{daphne_server}{path}")
        page.wait_for_load_state("networkidle")
        found[name] = axe_violations(page, name)
        if name in ("entities", "entity"):
            page.screenshot(path=str(ARTIFACTS / f"{name}.png"))
    assert found == {name: [] for name in pages}


PHONE = {"width": 390, "height": 844}


def test_the_main_pages_fit_a_phone_without_sideways_scrolling(saved_answer, daphne_server, browser_page):
    page = browser_page
    log_in(page, daphne_server, "reader", "reader-pass-1")
    page.set_viewport_size(PHONE)
    pages = {
        "chat": reverse("chat:conversation", args=["acme", saved_answer["conversation"].pk]),
        "documents": reverse("knowledge:documents", args=["acme"]),
        "graph": reverse("knowledge:graph", args=["acme"]),
        "upload": reverse("knowledge:upload", args=["acme"]),
    }
    widths, found = {}, {}
    for name, path in pages.items():
        page.goto(f"{daphne_server}{path}")
        page.wait_for_load_state("networkidle")
        widths[name] = page.evaluate("document.scrollingElement.scrollWidth")
        page.screenshot(path=str(ARTIFACTS / f"phone-{name}.png"), full_page=True)
        found[name] = axe_violations(page, f"phone-{name}")
    # The chat's menus, open, stay on the screen too.
    page.goto(f"{daphne_server}{pages['chat']}")
    for menu in (".conversation-picker", ".conversation-actions"):
        page.click(f"{menu} summary")
        bounds = page.evaluate(
            f"[...document.querySelectorAll('{menu} *')].map(e => e.getBoundingClientRect())"
            ".filter(r => r.width).reduce((b, r) => [Math.min(b[0], r.left), Math.max(b[1], r.right)], [1e9, 0])"
        )
        widths[menu] = (
            bounds[0] >= 0,
            bounds[1] <= PHONE["width"],
            page.evaluate("document.scrollingElement.scrollWidth"),
        )
        page.click(f"{menu} summary")

    assert widths == {
        **dict.fromkeys(pages, PHONE["width"]),
        **dict.fromkeys((".conversation-picker", ".conversation-actions"), (True, True, PHONE["width"])),
    }
    assert found == {name: [] for name in pages}
