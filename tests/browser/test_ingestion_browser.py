"""Uploads as a team sees them: a real worker, the live document list, and turns that keep a small
document from waiting behind a large one."""

import pytest
from django.urls import reverse
from playwright.sync_api import expect

from knowledge.models import Document, Role
from tests.factories import make_user, make_workspace
from tests.knowledge.ingest_helpers import meetings, parts, small_chunks
from tests.processes import ARTIFACTS, celery_worker, daphne, process_env, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_a_small_upload_behind_a_large_one_is_processed_first_with_stages_shown(openai_double, browser_page, tmp_path):
    openai_double.reply(lambda body: meetings(body, delay=0.3))
    owner = make_user("owner", password="owner-pass-1")
    workspace = small_chunks(make_workspace(slug="acme", members={owner: Role.OWNER}))
    large, small = tmp_path / "minutes.txt", tmp_path / "memo.txt"
    large.write_text(parts())
    small.write_text("Part 99: Person Z99 meets Shared Person.")
    # One worker process: without turns, the memo would wait for all of the minutes.
    env = process_env(INGEST_SLICE_SECONDS=2, LLM_MAX_CONCURRENCY=4)
    page = browser_page
    with daphne(env) as server, celery_worker("lane", env, concurrency=1) as worker:
        wait_for(lambda: " ready." in worker.log(), timeout=120, what="the worker starting")
        page.goto(f"{server.url}{reverse('login')}")
        page.fill("input[name=username]", "owner")
        page.fill("input[name=password]", "owner-pass-1")
        page.click("button[type=submit], input[type=submit]")
        page.wait_for_url(f"{server.url}/")
        page.goto(f"{server.url}{reverse('knowledge:upload', args=[workspace.slug])}")
        # One after the other, so the minutes are queued first (the page uploads files side by side).
        for number, upload in enumerate((large, small), start=1):
            page.set_input_files("#file-input", str(upload))
            expect(page.locator("#upload-queue li.success")).to_have_count(number, timeout=30_000)
        page.goto(f"{server.url}{reverse('knowledge:documents', args=[workspace.slug])}")
        minutes = Document.objects.get(title="minutes.txt")
        memo = Document.objects.get(title="memo.txt")

        stages_seen = set()

        def memo_done() -> bool:
            row = page.text_content(f"#document-{minutes.pk}", timeout=5000) or ""
            stages_seen.update(stage for stage in ("Embedding", "Extracting", "Building") if stage in row)
            return Document.objects.get(pk=memo.pk).status == "processed"

        wait_for(memo_done, timeout=300, interval=0.5, what="the memo being processed")
        minutes.refresh_from_db()
        expect(page.locator(f"#document-{memo.pk}")).to_contain_text("processed")
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "documents-small-before-large.png"), full_page=True)
        wait_for(lambda: Document.objects.get(pk=minutes.pk).status == "processed", timeout=600, what="the minutes")

    assert minutes.status == "processing"  # the memo finished while the minutes were still being read
    assert minutes.chunks_done < minutes.chunk_count
    assert "Extracting" in stages_seen  # the row showed the stage and its progress live
