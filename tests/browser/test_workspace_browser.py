"""The workspace pages in a real browser: live document rows over the websocket, the graph view,
and a cited chunk opened inside its document."""

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.urls import reverse

from knowledge.events import workspace_group
from knowledge.models import EntitySource, Role
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
    ada, babbage, engine = (make_entity(workspace, name) for name in ("Ada", "Babbage", "Engine"))
    make_relation(ada, babbage)
    make_relation(ada, engine)
    EntitySource.objects.create(entity=ada, chunk=chunk, name="Ada")
    return {"owner": owner, "workspace": workspace, "document": document, "chunk": chunk}


def _log_in(page, server):
    page.goto(f"{server}{reverse('login')}")
    page.fill("input[name=username]", "owner")
    page.fill("input[name=password]", "owner-pass-1")
    page.click("button[type=submit], input[type=submit]")
    page.wait_for_url(f"{server}/")


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
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:documents', args=['acme'])}")
    assert "pending" in page.text_content(f"#document-{document.pk}")

    _publish_until(page, workspace, _row(document), f"#document-{document.pk}", "3/8")
    assert "processing" in page.text_content(f"#document-{document.pk}")

    newcomer = _row(document, id=document.pk + 1000, title="Uploaded by a colleague", status="pending")
    send(workspace, {"type": "document.progress", "document": newcomer})
    page.wait_for_selector(f"#document-rows #document-{document.pk + 1000}", timeout=5000)
    assert page.locator("#document-rows tr").count() == 2

    send(workspace, {"type": "document.deleted", "document": {"id": document.pk + 1000}})
    page.wait_for_selector(f"#document-{document.pk + 1000}", state="detached", timeout=5000)


def test_the_graph_view_draws_the_top_entities(team, daphne_server, browser_page):
    page = browser_page
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:graph', args=['acme'])}")

    page.wait_for_function("document.getElementById('graph-status').textContent.includes('entities')")
    assert page.text_content("#graph-status") == "3 entities, 2 relations."
    assert page.locator("#graph canvas").count() > 0


def test_a_cited_chunk_opens_highlighted_and_in_view(team, daphne_server, browser_page):
    page, document, chunk = browser_page, team["document"], team["chunk"]
    _log_in(page, daphne_server)
    page.goto(f"{daphne_server}{reverse('knowledge:document', args=['acme', document.pk])}?chunk={chunk.pk}")

    mark = page.locator(f"mark#chunk-{chunk.pk}")
    assert mark.text_content() == "The cited sentence is here."
    page.wait_for_function(
        f"(() => {{ const r = document.getElementById('chunk-{chunk.pk}').getBoundingClientRect();"
        " return r.top >= 0 && r.bottom <= window.innerHeight; })()"
    )
