"""Versions, sources, tags and scopes in the browser: the document list and page, the sources
pages, the upload form and the chat's scope picker, each without console errors and axe-clean."""

import pytest
from django.urls import reverse
from django.utils import timezone
from playwright.sync_api import expect

from chat.models import Conversation
from knowledge.models import Document, Role, Source
from tests.browser.conftest import ARTIFACTS, axe_violations, console_errors, log_in
from tests.factories import make_chunk, make_document, make_user, make_workspace

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def library(db):
    owner = make_user("keeper", password="keeper-pass-1")
    workspace = make_workspace(slug="acme", name="Acme", members={owner: Role.OWNER})
    source = Source.objects.create(
        workspace=workspace,
        name="Handbook site",
        kind="web",
        location="https://handbook.example.org/sitemap.xml",
        tags=["policies"],
        last_sync_at=timezone.now(),
        counts={"added": 1, "updated": 1, "unchanged": 4, "waiting": 0, "missing": 1, "removed": 0, "failed": 0},
        last_error="https://handbook.example.org/private/: robots.txt asks not to fetch it.",
    )
    old = make_document(workspace, title="Leave policy", text="Ten days of leave.")
    current = make_document(workspace, title="Leave policy", text="Twelve days of leave.")
    make_chunk(current, text="Twelve days of leave.")
    Document.objects.filter(pk=current.pk).update(
        version=2, replaces=old, tags=["policies", "people"], source=source, source_key="leave.html"
    )
    Document.objects.filter(pk=old.pk).update(superseded_by=current, superseded_at=timezone.now())
    minutes = make_document(workspace, title="Minutes")
    Document.objects.filter(pk=minutes.pk).update(enabled=False)
    conversation = Conversation.objects.create(
        workspace=workspace, user=owner, title="Leave", scope={"tags": ["policies"], "documents": []}
    )
    return {"old": old, "current": current, "source": source, "conversation": conversation}


def test_versions_sources_tags_and_scope_show_and_pass_axe(library, daphne_server, browser_page):
    page = browser_page
    errors = console_errors(page)
    log_in(page, daphne_server, "keeper", "keeper-pass-1")
    found = {}

    page.goto(daphne_server + reverse("knowledge:documents", args=["acme"]))
    row = page.locator(f"#document-{library['current'].pk}")
    expect(row).to_contain_text("v2")
    expect(row).to_contain_text("policies")
    expect(page.locator(f"#document-{library['old'].pk}")).to_have_count(0)
    expect(page.locator("#document-rows")).to_contain_text("disabled")
    found["documents-versions"] = axe_violations(page, "documents-versions")

    page.goto(daphne_server + reverse("knowledge:document", args=["acme", library["current"].pk]))
    expect(page.locator("h2")).to_contain_text("version 2")
    history = page.locator(".document-history")
    expect(history).to_contain_text("current")
    expect(page.locator("#id_tags")).to_have_value("policies, people")
    expect(page.get_by_role("button", name="Replace")).to_be_visible()
    found["document-history"] = axe_violations(page, "document-history")
    page.screenshot(path=str(ARTIFACTS / "document-history.png"), full_page=True)
    history.get_by_role("link", name="1").click()
    expect(page.get_by_role("status")).to_contain_text("This is an older version")
    found["document-old-version"] = axe_violations(page, "document-old-version")

    page.goto(daphne_server + reverse("knowledge:sources", args=["acme"]))
    expect(page.locator("table.sources")).to_contain_text("Handbook site")
    expect(page.locator("#id_kind")).to_be_visible()
    found["sources"] = axe_violations(page, "sources")
    page.get_by_role("link", name="Handbook site").click()
    expect(page.locator("#sync-counts")).to_contain_text("1 updated")
    expect(page.locator("#sync-problems")).to_contain_text("robots.txt asks not to fetch it")
    expect(page.get_by_role("button", name="Sync now")).to_be_visible()
    found["source"] = axe_violations(page, "source")
    page.screenshot(path=str(ARTIFACTS / "source.png"), full_page=True)

    page.goto(daphne_server + reverse("knowledge:upload", args=["acme"]))
    expect(page.locator("#id_tags")).to_be_visible()
    found["upload-tags"] = axe_violations(page, "upload-tags")

    page.goto(daphne_server + reverse("chat:conversation", args=["acme", library["conversation"].pk]))
    picker = page.locator("#ask-scope")
    expect(picker).to_have_attribute("open", "")
    expect(picker.locator("input[value=policies]")).to_be_checked()
    expect(page.locator("#scope-summary")).to_have_text("1 tag, 0 documents")
    picker.get_by_label("people").check()
    expect(page.locator("#scope-summary")).to_have_text("2 tags, 0 documents")
    expect(picker.get_by_label("Minutes (disabled)")).to_be_disabled()
    found["chat-scope"] = axe_violations(page, "chat-scope")
    page.screenshot(path=str(ARTIFACTS / "chat-scope.png"))

    assert found == {name: [] for name in found}
    assert errors == []
