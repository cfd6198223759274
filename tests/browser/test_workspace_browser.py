"""The workspace pages in a real browser: live document rows over the websocket, the graph view,
uploads, and a cited chunk opened inside its document."""

import json
import random
import re
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.urls import reverse
from playwright.sync_api import expect

from knowledge.models import Document, Entity, EntitySource, Relation, Role
from knowledge.services.events import workspace_group
from knowledge.web.palette import type_slot
from tests.browser.conftest import ARTIFACTS, console_errors, label_boxes, log_in, overlapping
from tests.factories import make_chunk, make_document, make_entity, make_relation, make_user, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def team(transactional_db):
    owner = make_user("owner", password="owner-pass-1")
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER})
    text = "Opening words. " * 200 + "The cited sentence is here." + " Closing words." * 200
    document = make_document(workspace, title="Report", text=text)
    document.status = "pending"
    document.save()
    start = text.index("The cited")
    chunk = make_chunk(document, text="The cited sentence is here.")
    chunk.char_start, chunk.char_end = start, start + len("The cited sentence is here.")
    chunk.save()
    ada = make_entity(workspace, "Ada", type="person", description="Wrote the first published algorithm.")
    babbage = make_entity(workspace, "Babbage", type="person")
    engine = make_entity(workspace, "Engine", type="technology")
    make_relation(ada, babbage, keywords="collaboration", description="Ada worked with Babbage.")
    make_relation(ada, engine, keywords="algorithm", description="Ada wrote a program for the Engine.")
    EntitySource.objects.create(entity=ada, chunk=chunk, name="Ada", description="Ada, as the report says.")
    return {"owner": owner, "workspace": workspace, "document": document, "chunk": chunk, "ada": ada}


def _log_in(page, server):
    log_in(page, server, "owner", "owner-pass-1")


def send(workspace, event: dict) -> None:
    # Playwright's sync API keeps an event loop in this thread, so the channel layer runs in another.
    with ThreadPoolExecutor(1) as pool:
        pool.submit(async_to_sync(get_channel_layer().group_send), workspace_group(workspace.pk), event).result()


def _publish_until(page, workspace, document: dict, selector: str, text: str) -> None:
    """Publish until the page shows it: the socket may still be connecting when we start."""
    for _ in range(50):
        send(workspace, {"type": "document.progress", "document": document})
        time.sleep(0.2)
        if text in (page.text_content(selector, timeout=1000) or ""):
            return
    raise AssertionError(f"{selector} never showed {text!r}")


def _row(document, **changes) -> dict:
    return {
        "id": document.pk,
        "title": document.title,
        "status": "processing",
        "chunks_done": 3,
        "chunk_count": 8,
        "entity_count": 5,
        "relation_count": 4,
        "prompt_tokens": 100,
        "completion_tokens": 20,
        "error": "",
        **changes,
    }


def test_the_document_list_updates_live_and_takes_in_new_documents(team, daphne_server, browser_page):
    page, workspace, document = browser_page, team["workspace"], team["document"]
    errors = console_errors(page)
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:documents', args=['acme'])}")
    assert "pending" in page.text_content(f"#document-{document.pk}")

    _publish_until(page, workspace, _row(document), f"#document-{document.pk}", "3/8")
    assert "processing" in page.text_content(f"#document-{document.pk}")

    # With the pipeline's stage and time left, the row says them.
    staged = _row(
        document,
        stage="extracting",
        stage_label="Extracting",
        stage_done=5,
        stage_total=8,
        eta_seconds=150,
        eta_label="about 2 min left",
    )
    _publish_until(page, workspace, staged, f"#document-{document.pk}", "Extracting 5/8")
    expect(page.locator(f"#document-{document.pk} .eta")).to_have_text("about 2 min left")
    assert page.locator(f"#document-{document.pk} progress").get_attribute("value") == "5"

    newcomer = _row(document, id=document.pk + 1000, title="Uploaded by a colleague", status="pending")
    send(workspace, {"type": "document.progress", "document": newcomer})
    page.wait_for_selector(f"#document-rows #document-{document.pk + 1000}", timeout=5000)
    assert page.locator("#document-rows tr").count() == 2

    send(workspace, {"type": "document.deleted", "document": {"id": document.pk + 1000}})
    page.wait_for_selector(f"#document-{document.pk + 1000}", state="detached", timeout=5000)
    # A deletion of a row this page never showed is not an error either.
    send(workspace, {"type": "document.deleted", "document": {"id": document.pk + 2000}})
    page.wait_for_timeout(300)
    page.screenshot(path=str(ARTIFACTS / "documents.png"))
    assert errors == []


def test_the_document_list_filters_by_status_and_title(team, more_documents, daphne_server, browser_page):
    page, workspace = browser_page, team["workspace"]
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:documents', args=['acme'])}")
    assert page.locator("#document-rows tr").count() == 4

    page.select_option("select[name=status]", "failed")
    expect(page.locator("#document-rows tr")).to_have_count(1)
    expect(page.locator("#document-rows")).to_contain_text("Broken scan")
    assert "status=failed" in page.url

    page.select_option("select[name=status]", "")
    page.fill("input[name=q]", "minutes")
    expect(page.locator("#document-rows tr")).to_have_count(2)
    # A live row that does not match the filter stays out of the filtered list.
    send(workspace, {"type": "document.progress", "document": _row(team["document"], id=99999, title="Other")})
    page.wait_for_timeout(500)
    expect(page.locator("#document-rows tr")).to_have_count(2)


@pytest.fixture
def more_documents(team):
    for title, status in (
        ("Board minutes 2024", "processed"),
        ("Board minutes 2025", "pending"),
        ("Broken scan", "failed"),
    ):
        document = make_document(team["workspace"], title=title, text=f"{title} text.")
        Document.objects.filter(pk=document.pk).update(status=status)


def test_an_upload_takes_dropped_files_and_folders_with_progress_and_one_outcome_each(
    team, daphne_server, browser_page, tmp_path, settings
):
    page = browser_page
    errors = console_errors(page)
    (tmp_path / "handbook" / "guides").mkdir(parents=True)
    (tmp_path / "handbook" / "guides" / "report.txt").write_text("Ada Lovelace wrote the first program.")
    (tmp_path / "handbook" / "report.md").write_text("# Report\n\nCharles Babbage designed the Analytical Engine.")
    (tmp_path / "handbook" / "empty.txt").write_text("")
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:upload', args=['acme'])}")
    expect(page.locator("#dropzone")).to_be_visible()

    # A folder, as the folder picker gives it (the same paths a dropped folder has).
    page.set_input_files("#folder-input", str(tmp_path / "handbook"))
    expect(page.locator("#upload-queue li.success, #upload-queue li.error")).to_have_count(3, timeout=20_000)
    # Then a file dropped on the zone.
    page.evaluate(
        """() => { const transfer = new DataTransfer();
                   const text = 'Grace Hopper wrote a compiler.';
                   transfer.items.add(new File([text], 'report.txt', { type: 'text/plain' }));
                   document.getElementById('dropzone').dispatchEvent(
                       new DragEvent('drop', { dataTransfer: transfer, bubbles: true, cancelable: true })); }"""
    )
    expect(page.locator("#upload-queue li.success, #upload-queue li.error")).to_have_count(4, timeout=20_000)

    outcomes = page.locator("#upload-queue .outcome").all_inner_texts()
    assert len(outcomes) == 4
    assert sum("queued as" in outcome for outcome in outcomes) == 3
    assert sum("empty" in outcome for outcome in outcomes) == 1
    assert page.locator("#upload-queue progress").evaluate_all("bars => bars.map(bar => bar.value)") == [100] * 4
    assert page.locator(".messages li").count() == 0
    expect(page.locator("#upload-summary")).to_contain_text("3 queued for ingestion, 1 refused.")
    page.screenshot(path=str(ARTIFACTS / "upload.png"))

    page.goto(f"{daphne_server}{reverse('knowledge:documents', args=['acme'])}")
    titles = page.locator("#document-rows tr").evaluate_all("rows => rows.map(row => row.dataset.title)")
    assert {"handbook/guides/report.txt", "handbook/report.md", "report.txt"} <= set(titles)
    assert page.locator(".messages li").count() == 0
    assert [error for error in errors if "empty.txt" not in error] == []


@pytest.fixture
def processed_source(team):
    """A processed document in which Ada is named: sources are served from processed documents only."""
    notes = make_document(team["workspace"], title="Notes", text="Ada wrote the notes.")
    chunk = make_chunk(notes, text="Ada wrote the notes.")
    EntitySource.objects.create(entity=team["ada"], chunk=chunk, name="Ada", description="Ada, in the notes.")


def test_the_graph_view_explains_a_node_beside_the_graph_and_finds_by_name(
    team, processed_source, daphne_server, browser_page
):
    page = browser_page
    errors = console_errors(page)
    _log_in(page, daphne_server)
    graph_url = f"{daphne_server}{reverse('knowledge:graph', args=['acme'])}"
    page.goto(graph_url)

    page.wait_for_function("() => document.getElementById('graph-status').textContent.includes('entities')")
    assert page.text_content("#graph-status") == "3 entities, 2 relations."
    assert page.locator("#graph canvas").count() > 0
    # The legend shows each type with its count, in the colours every page uses.
    legend = page.locator("#graph-legend button").evaluate_all(
        "buttons => buttons.map(button => button.innerText.replace(/\\s+/g, ' ').trim())"
    )
    assert legend == ["person 2", "technology 1"]
    slots = page.evaluate(
        "types => types.map(type => EntityPalette.slotOf(type))", ["person", "Technology", "gene", "", "other", "ship"]
    )
    assert slots == [type_slot(name) for name in ("person", "Technology", "gene", "", "other", "ship")]

    # Enter in the find box highlights and centres the match, and opens it in the panel, on this page.
    page.fill("#graph-search", "babb")
    page.keyboard.press("Enter")
    page.wait_for_function("() => document.getElementById('graph-status').textContent.startsWith('1 match')")
    assert page.url == graph_url
    assert page.evaluate("graphView.cy().nodes('.match').map(node => node.data('label'))") == ["Babbage"]
    page.wait_for_timeout(400)  # the centring animation
    offset = page.evaluate(
        """() => { const cy = graphView.cy(); const at = cy.nodes('.match').renderedPosition();
                   return Math.hypot(at.x - cy.width() / 2, at.y - cy.height() / 2); }"""
    )
    assert offset < 60
    expect(page.locator("#entity-panel h2")).to_have_text("Babbage")

    # A click shows the node's description, relations and sources in the panel.
    page.evaluate("graphView.cy().fit(undefined, 120)")
    x, y = page.evaluate(
        """(id) => { const node = graphView.cy().getElementById(String(id)); const at = node.renderedPosition();
                   const box = document.getElementById('graph').getBoundingClientRect();
                   return [box.left + at.x, box.top + at.y]; }""",
        team["ada"].pk,
    )
    page.mouse.click(x, y)
    expect(page.locator("#entity-panel h2")).to_have_text("Ada")
    panel = page.locator("#entity-panel")
    expect(panel).to_contain_text("Wrote the first published algorithm.")
    expect(panel).to_contain_text("Relations (2)")
    expect(panel).to_contain_text("Notes, chunk 1")
    assert page.url == graph_url
    page.screenshot(path=str(ARTIFACTS / "graph.png"))

    # A relation's far end opens in the panel too.
    panel.locator("a[data-entity]", has_text="Engine").click()
    expect(page.locator("#entity-panel h2")).to_have_text("Engine")
    assert page.url == graph_url

    # Filters: hide a type from the legend, or the nodes under a degree.
    visible = "graphView.cy().nodes(':visible').map(node => node.data('label')).sort().join()"
    page.click("#graph-legend button[data-type=technology]")
    page.wait_for_function(f"() => {visible} === 'Ada,Babbage'")
    page.click("#graph-legend button[data-type=technology]")
    page.wait_for_function(f"() => {visible} === 'Ada,Babbage,Engine'")
    page.locator("#graph-min-degree").fill("2")
    page.wait_for_function(f"() => {visible} === 'Ada'")
    expect(page.locator("#graph-status")).to_have_text("1 of 3 entities, 2 relations.")
    assert errors == []


@pytest.fixture
def big_graph(team):
    """Two thousand entities in forty clusters shaped like extracted graphs: in each, every entity
    links to an earlier one, mostly to the first few (hubs), and sixty bridges join clusters."""
    workspace = team["workspace"]
    types = ["person", "organization", "location", "event", "concept", "technology"]
    entities = Entity.objects.bulk_create(
        Entity(workspace=workspace, name=f"Entity {n}", key=f"entity {n}", type=types[n % len(types)], published=True)
        for n in range(2000)
    )
    clusters, rng = 40, random.Random(7)
    pairs = set()
    for n in range(clusters, len(entities)):
        cluster, earlier = n % clusters, (n - n % clusters) // clusters
        hub = cluster + clusters * int(rng.random() * rng.random() * earlier)
        pairs.add(tuple(sorted((entities[n].pk, entities[hub].pk))))
    for _ in range(60):
        a, b = rng.sample(range(clusters), 2)
        pairs.add(tuple(sorted((entities[a].pk, entities[b].pk))))
    Relation.objects.bulk_create(
        Relation(workspace=workspace, source_id=a, target_id=b, weight=1.0, published=True) for a, b in pairs
    )
    return workspace


def test_the_graph_view_labels_what_fits_readably_and_finds_the_exact_name(big_graph, daphne_server, browser_page):
    page = browser_page
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:graph', args=['acme'])}?limit=300")
    page.wait_for_function("() => window.graphView && graphView.stats.layoutMs !== undefined", timeout=60_000)
    page.wait_for_function("() => graphView.cy().nodes('.labelled').length > 0")

    # At the default zoom: every shown label 12 px on screen, none over another, hubs first.
    labels = label_boxes(page, "graphView.cy()")
    assert len(labels) >= 40, len(labels)
    assert all(abs(label["px"] - 12) < 0.01 for label in labels)
    assert overlapping(labels) == []
    hub = page.evaluate("graphView.cy().nodes().max(n => n.data('degree')).ele.data('label')")
    assert hub in {label["label"] for label in labels}
    page.screenshot(path=str(ARTIFACTS / "graph-300-labels.png"))
    # Zooming in makes room: more labels, still 12 px and apart.
    page.evaluate("graphView.cy().zoom({ level: graphView.cy().zoom() * 2.5, renderedPosition: { x: 400, y: 300 } })")
    page.wait_for_function(f"() => graphView.cy().nodes('.labelled').length !== {len(labels)}")
    closer = label_boxes(page, "graphView.cy()")
    assert overlapping(closer) == []
    assert all(abs(label["px"] - 12) < 0.01 for label in closer)

    # Find prefers the exact name over the names that contain it, centres it, opens its panel and
    # zooms no further than a reader needs.
    page.fill("#graph-search", "entity 1")
    page.keyboard.press("Enter")
    expect(page.locator("#entity-panel h2")).to_have_text("Entity 1")
    status = page.text_content("#graph-status")
    assert re.fullmatch(r"\d+ matches for “entity 1”: showing Entity 1\.", status), status
    page.wait_for_timeout(500)  # the animation
    found = page.evaluate(
        """() => { const cy = graphView.cy(); const node = cy.nodes('.selected-entity');
                   const at = node.renderedPosition();
                   return { label: node.data('label'), zoom: cy.zoom(), labelled: node.hasClass('labelled'),
                            offset: Math.hypot(at.x - cy.width() / 2, at.y - cy.height() / 2) }; }"""
    )
    assert found["label"] == "Entity 1"
    assert found["labelled"]
    assert found["offset"] < 60
    assert found["zoom"] <= 1.5


def test_the_graph_view_draws_two_thousand_nodes_with_the_fast_layout(big_graph, daphne_server, browser_page):
    page = browser_page
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:graph', args=['acme'])}?limit=2000")
    page.wait_for_function("() => window.graphView && graphView.stats.layoutMs !== undefined", timeout=60_000)

    stats = page.evaluate("graphView.stats")
    assert stats["nodes"] == 2000
    assert stats["layout"] == "fcose/draft"
    # Work done, not time: every node placed, and each cluster together, apart from the others
    # (the mean distance between clusters well above the mean distance inside one).
    layout = page.evaluate(
        """() => { const nodes = graphView.cy().nodes();
                   const cluster = (n) => Number(n.data('label').split(' ')[1]) % 40;
                   const placed = nodes.filter(n => Number.isFinite(n.position('x'))).length;
                   let inside = 0, insideN = 0, across = 0, acrossN = 0;
                   for (let i = 0; i < nodes.length; i += 7) for (let j = i + 1; j < nodes.length; j += 5) {
                       const a = nodes[i].position(), b = nodes[j].position(), d = Math.hypot(a.x - b.x, a.y - b.y);
                       if (cluster(nodes[i]) === cluster(nodes[j])) { inside += d; insideN += 1; }
                       else { across += d; acrossN += 1; } }
                   return { placed, separation: (across / acrossN) / (inside / insideN) }; }"""
    )
    assert layout["placed"] == 2000
    assert layout["separation"] > 2
    page.screenshot(path=str(ARTIFACTS / "graph-2000.png"))
    # Measured with the browser's clock and reported, never asserted: frames drawn while the
    # reader zooms in with the wheel.
    page.evaluate(
        """() => { window.frameCount = { frames: 0, started: performance.now() };
                   const tick = () => { frameCount.frames += 1; frameCount.ms = performance.now() - frameCount.started;
                                        if (frameCount.ms < 1500) requestAnimationFrame(tick); };
                   requestAnimationFrame(tick); }"""
    )
    box = page.locator("#graph").bounding_box()
    page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    for _ in range(10):
        page.mouse.wheel(0, -120)
        page.wait_for_timeout(100)
    page.wait_for_function("() => frameCount.ms >= 1500")
    frames = page.evaluate("({ frames: frameCount.frames, ms: Math.round(frameCount.ms) })")

    # Thinned out by degree, what is left is laid out again with the full pass.
    page.locator("#graph-min-degree").fill("3")
    page.wait_for_function("() => graphView.stats.layout === 'fcose/default'", timeout=60_000)
    shown = page.evaluate("graphView.cy().nodes(':visible').length")
    assert 0 < shown <= 400
    page.screenshot(path=str(ARTIFACTS / "graph-2000-degree-3.png"))
    (ARTIFACTS / "graph-2000.json").write_text(
        json.dumps({**stats, **layout, "wheel_zoom": frames, "shown_from_degree_3": shown}, indent=2)
    )


def test_a_cited_chunk_opens_highlighted_and_in_view(team, daphne_server, browser_page):
    page, document, chunk = browser_page, team["document"], team["chunk"]
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:document', args=['acme', document.pk])}?chunk={chunk.pk}")

    mark = page.locator(f"mark#chunk-{chunk.pk}")
    assert mark.text_content() == "The cited sentence is here."
    page.wait_for_function(
        f"() => {{ const r = document.getElementById('chunk-{chunk.pk}').getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; }"
    )


def test_a_cited_sentence_alone_is_marked(team, daphne_server, browser_page):
    page, document, chunk = browser_page, team["document"], team["chunk"]
    start = chunk.char_start + len("The cited ")
    end = start + len("sentence")
    _log_in(page, daphne_server)
    page.goto(
        f"{daphne_server}{reverse('knowledge:document', args=['acme', document.pk])}"
        f"?chunk={chunk.pk}&start={start}&end={end}"
    )

    # Only the sentence is marked; the chunk keeps its anchor for links to the passage.
    expect(page.locator("mark#cited-sentence")).to_have_text("sentence")
    assert page.locator("mark.cited").count() == 0
    assert page.locator(f"span#chunk-{chunk.pk}").count() == 1
    expect(page.locator("#cited-sentence")).to_be_in_viewport()
    page.screenshot(path=str(ARTIFACTS / "document-sentence.png"))
