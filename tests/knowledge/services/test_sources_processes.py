"""Sources synced on schedule by a real Celery beat and worker: a folder, a site served by a local
HTTP server and a local git repository, each changed between two syncs, and a failing source
whose reason the source page shows."""

import time

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from knowledge.models import Document, Role, Source
from knowledge.services import sources
from tests.factories import make_user, make_workspace
from tests.knowledge.ingest_helpers import meetings
from tests.knowledge.services.test_ingestion_processes import queue, worker_ready  # noqa: F401 - fixture
from tests.knowledge.services.test_sources import git, serving, write
from tests.processes import celery_beat, celery_worker, process_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def synced_since(source: Source, moment) -> bool:
    source.refresh_from_db()
    return source.last_sync_at is not None and source.last_sync_at > moment and source.sync_until is None


def all_read(workspace) -> bool:
    return not Document.objects.filter(workspace=workspace, status__in=["pending", "processing"]).exists()


def newest(source: Source) -> dict[str, int]:
    rows = Document.objects.current().filter(source=source).order_by("version")
    return dict(rows.values_list("source_key", "version"))


def test_a_folder_a_site_and_a_repository_are_synced_on_schedule_by_the_beat(openai_double, queue, tmp_path, settings):  # noqa: F811
    openai_double.reply(meetings)
    shared, site = tmp_path / "shared", tmp_path / "site"
    write(shared / "team" / "a.md", "Part 01: Person A01 meets Shared Person.")
    write(shared / "team" / "b.md", "Part 02: Person A02 meets Shared Person.")
    repository = shared / "repo"
    write(repository / "guide.md", "Part 03: Person A03 meets Shared Person.")
    git("init", "-q", "-b", "main", cwd=repository)
    git("add", ".", cwd=repository)
    git("commit", "-q", "-m", "first", cwd=repository)
    write(site / "robots.txt", "User-agent: *\nDisallow: /private/\n")
    write(site / "one.html", "<p>Part 04: Person A04 meets Shared Person.</p>")
    write(site / "two.html", "<p>Part 05: Person A05 meets Shared Person.</p>")
    write(site / "private" / "no.html", "<p>Part 06: Person A06 meets Shared Person.</p>")
    settings.SOURCES_ROOTS = [str(shared)]
    owner = make_user("owner")
    workspace = make_workspace(slug="synced", members={owner: Role.OWNER})
    env = process_env(
        SOURCES_ROOTS=shared,
        SOURCES_CHECK_SECONDS=1,
        SOURCES_CHECKOUTS=tmp_path / "checkouts",
        MEDIA_ROOT=tmp_path / "media",
        INGEST_SWEEP_SECONDS=2,
    )
    with serving(site) as url:

        def sitemap(*pages):
            locs = "".join(f"<url><loc>{url}/{page}</loc></url>" for page in pages)
            write(site / "sitemap.xml", f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>')

        sitemap("one.html", "two.html", "private/no.html")
        made = {
            "folder": {"kind": "folder", "location": str(shared / "team")},
            "site": {"kind": "web", "location": f"{url}/sitemap.xml"},
            "repo": {"kind": "git", "location": str(repository), "branch": "main"},
            "broken": {"kind": "web", "location": "http://127.0.0.1:9/nothing-listens-here.html"},
        }
        created = {
            name: sources.source_create(workspace=workspace, actor=owner, name=name, grace_hours=0, **fields)
            for name, fields in made.items()
        }
        started = timezone.now()
        with celery_worker("syncer", env) as worker, celery_beat(env, tmp_path / "beat-schedule"):
            wait_for(lambda: worker_ready(worker), timeout=120, what="the worker starting")
            for source in created.values():
                wait_for(lambda s=source: synced_since(s, started), timeout=120, what=f"{source.name} synced")
            wait_for(lambda: all_read(workspace), timeout=300, what="the synced documents read")
            assert newest(created["folder"]) == {"a.md": 1, "b.md": 1}
            assert newest(created["site"]) == {f"{url}/one.html": 1, f"{url}/two.html": 1}
            assert newest(created["repo"]) == {"guide.md": 1}

            write(shared / "team" / "a.md", "Part 01: Person Z01 meets Shared Person.")
            write(site / "one.html", "<p>Part 04: Person Z04 meets Shared Person.</p>")
            time.sleep(1.1)  # http.server's Last-Modified counts whole seconds
            write(site / "one.html", "<p>Part 04: Person Z04 meets Shared Person.</p>")
            (site / "two.html").unlink()
            write(site / "three.html", "<p>Part 07: Person A07 meets Shared Person.</p>")
            sitemap("one.html", "two.html", "three.html", "private/no.html")
            write(repository / "guide.md", "Part 03: Person Z03 meets Shared Person.")
            git("commit", "-q", "-am", "second", cwd=repository)
            changed = timezone.now()
            # The schedule comes due (the interval is a minute at least): the beat picks them up.
            Source.objects.update(next_sync_at=changed)
            for source in created.values():
                wait_for(lambda s=source: synced_since(s, changed), timeout=120, what=f"{source.name} synced again")
            wait_for(lambda: all_read(workspace), timeout=300, what="the new versions read")

    for source in created.values():
        source.refresh_from_db()
    assert newest(created["folder"]) == {"a.md": 2, "b.md": 1}
    assert newest(created["site"]) == {f"{url}/one.html": 2, f"{url}/two.html": 1, f"{url}/three.html": 1}
    assert Document.objects.get(source=created["site"], source_key=f"{url}/two.html").source_missing_since
    assert newest(created["repo"]) == {"guide.md": 2}
    assert f"{url}/private/no.html: robots.txt asks not to fetch it." in created["site"].last_error
    assert created["broken"].last_success_at is None
    client = Client()
    client.force_login(owner)
    page = client.get(reverse("knowledge:source", args=[workspace.slug, created["broken"].pk])).content.decode()
    assert "ConnectError" in page
    listed = client.get(reverse("knowledge:sources", args=[workspace.slug])).content.decode()
    assert all(name in listed for name in made)
