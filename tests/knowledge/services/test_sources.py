"""Sources: a folder, a web site and a git repository kept in sync, with real local servers."""

import contextlib
import functools
import http.server
import os
import subprocess
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone

from knowledge.models import Document, Source
from knowledge.services import ingestion, sources
from tests.knowledge.ingest_helpers import meetings

pytestmark = pytest.mark.django_db


@pytest.fixture
def roots(settings, tmp_path):
    settings.SOURCES_ROOTS = [str(tmp_path / "shared")]
    settings.SOURCES_CHECKOUTS = tmp_path / "checkouts"
    settings.MEDIA_ROOT = tmp_path / "media"
    (tmp_path / "shared").mkdir()
    return tmp_path / "shared"


def write(path, text, *, later: int = 0):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    if later:
        stamp = time.time() + later
        os.utime(path, (stamp, stamp))


def titles(source) -> dict[str, int]:
    """Each file's newest version (a new one is current beside the old until it is published)."""
    rows = Document.objects.current().filter(source=source).order_by("version")
    return dict(rows.values_list("source_key", "version"))


def ingest_all():
    for pk in Document.objects.filter(status=Document.Status.PENDING).values_list("pk", flat=True):
        ingestion.document_ingest(document_id=pk)


def sync(source):
    return sources.source_sync(source_id=source.pk)


@contextlib.contextmanager
def serving(folder):
    handler = functools.partial(QuietHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


def git(*arguments, cwd):
    subprocess.run(
        ["git", "-c", "user.name=T", "-c", "user.email=t@example.org", *arguments],
        cwd=cwd,
        check=True,
        capture_output=True,
    )


def test_a_folder_source_adds_versions_and_removes_after_the_grace_period(roots, workspace, openai_double):
    openai_double.reply(meetings)
    write(roots / "team" / "a.md", "Part 01: Person A01 meets Shared Person.")
    write(roots / "team" / "sub" / "b.txt", "Part 02: Person A02 meets Shared Person.")
    write(roots / "team" / ".hidden.md", "Not synced.")
    source = sources.source_create(
        workspace=workspace, actor=None, name="Team", kind="folder", location=str(roots / "team"), tags=["team"]
    )
    source.grace_hours = 1
    source.save()

    sync(source)
    assert titles(source) == {"a.md": 1, "sub/b.txt": 1}
    assert list(Document.objects.values_list("tags", flat=True)) == [["team"], ["team"]]
    ingest_all()

    write(roots / "team" / "a.md", "Part 01: Person Z01 meets Shared Person.", later=5)
    (roots / "team" / "sub" / "b.txt").unlink()
    write(roots / "team" / "c.md", "Part 03: Person A03 meets Shared Person.")
    sync(source)
    source.refresh_from_db()
    assert source.counts == {
        "added": 1,
        "updated": 1,
        "unchanged": 0,
        "waiting": 0,
        "missing": 1,
        "removed": 0,
        "failed": 0,
    }
    assert titles(source) == {"a.md": 2, "sub/b.txt": 1, "c.md": 1}  # the newest version of each
    assert Document.objects.get(source=source, source_key="sub/b.txt").source_missing_since is not None
    ingest_all()
    assert titles(source) == {"a.md": 2, "sub/b.txt": 1, "c.md": 1}

    Document.objects.filter(source_key="sub/b.txt").update(source_missing_since=timezone.now() - timedelta(hours=2))
    sync(source)
    source.refresh_from_db()
    assert titles(source) == {"a.md": 2, "c.md": 1}
    assert (source.counts["unchanged"], source.counts["removed"]) == (2, 1)
    assert source.last_error == ""


def test_a_folder_outside_the_allowed_roots_is_refused_and_a_vanished_one_keeps_its_documents(roots, workspace):
    with pytest.raises(sources.SourceError, match="not under a folder this server may read"):
        sources.source_create(workspace=workspace, actor=None, name="Etc", kind="folder", location="/etc")
    write(roots / "docs" / "a.md", "Ada wrote the first program.")
    source = sources.source_create(
        workspace=workspace, actor=None, name="Docs", kind="folder", location=str(roots / "docs")
    )
    sync(source)
    (roots / "docs" / "a.md").unlink()
    (roots / "docs").rmdir()

    sync(source)

    source.refresh_from_db()
    assert "does not exist" in source.last_error
    assert titles(source) == {"a.md": 1}
    assert source.last_success_at < source.last_sync_at


def test_a_web_source_follows_its_sitemap_honours_robots_txt_and_asks_only_for_changes(roots, workspace, openai_double):
    site = roots.parent / "site"
    write(site / "robots.txt", "User-agent: *\nDisallow: /private/\n")
    write(site / "guide.html", "<html><body><h1>Guide</h1><p>Ada wrote the first program.</p></body></html>")
    write(site / "faq.html", "<html><body><p>Babbage designed the engine.</p></body></html>")
    write(site / "private" / "secret.html", "<html><body><p>Secret.</p></body></html>")
    with serving(site) as url:

        def sitemap(*pages):
            locs = "".join(f"<url><loc>{url}/{page}</loc></url>" for page in pages)
            write(site / "sitemap.xml", f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{locs}</urlset>')

        sitemap("guide.html", "faq.html", "private/secret.html")
        source = sources.source_create(
            workspace=workspace, actor=None, name="Site", kind="web", location=f"{url}/sitemap.xml", grace_hours=0
        )
        sync(source)
        assert titles(source) == {f"{url}/guide.html": 1, f"{url}/faq.html": 1}
        source.refresh_from_db()
        assert f"{url}/private/secret.html: robots.txt asks not to fetch it." in source.last_error
        ingest_all()

        write(site / "guide.html", "<html><body><p>Ada Lovelace wrote the first program.</p></body></html>", later=5)
        (site / "faq.html").unlink()
        write(site / "new.html", "<html><body><p>Turing described a machine.</p></body></html>")
        sitemap("guide.html", "faq.html", "new.html")
        sync(source)
        source.refresh_from_db()
        assert (source.counts["added"], source.counts["updated"], source.counts["missing"]) == (1, 1, 1)
        assert titles(source) == {f"{url}/guide.html": 2, f"{url}/faq.html": 1, f"{url}/new.html": 1}
        assert Document.objects.filter(replaces__source_key=f"{url}/guide.html").count() == 1
        ingest_all()

        sync(source)  # unchanged pages answer 304; the missing one is past its (zero) grace period
        source.refresh_from_db()
        assert (source.counts["unchanged"], source.counts["removed"]) == (2, 1)


def test_a_git_source_syncs_a_branch_and_its_next_commit(roots, workspace, openai_double):
    repository = roots / "repo"
    write(repository / "README.md", "Ada wrote the first program.")
    write(repository / "docs" / "guide.md", "Babbage designed the engine.")
    git("init", "-q", "-b", "main", cwd=repository)
    git("add", ".", cwd=repository)
    git("commit", "-q", "-m", "first", cwd=repository)
    source = sources.source_create(
        workspace=workspace, actor=None, name="Repo", kind="git", location=str(repository), branch="main"
    )
    sync(source)
    assert titles(source) == {"README.md": 1, "docs/guide.md": 1}
    ingest_all()

    write(repository / "docs" / "guide.md", "Charles Babbage designed the Analytical Engine.")
    git("commit", "-q", "-am", "second", cwd=repository)
    sync(source)

    source.refresh_from_db()
    assert (source.counts["updated"], source.counts["unchanged"]) == (1, 1)
    assert len(source.state["commit"]) == 40


def test_a_git_source_that_fails_says_why_without_its_credentials(roots, workspace, settings):
    settings.SOURCES_FETCH_TIMEOUT = 2
    source = sources.source_create(
        workspace=workspace,
        actor=None,
        name="Private",
        kind="git",
        location="https://robot:s3cret-token@127.0.0.1:9/team/repo.git",
    )

    sync(source)

    source.refresh_from_db()
    assert source.last_error.startswith("git clone:")
    assert "s3cret-token" not in source.last_error
    assert source.next_sync_at > timezone.now()


def test_the_beat_claims_a_due_source_once_until_its_sync_ends(roots, workspace, monkeypatch):
    queued = []
    monkeypatch.setattr(sources, "_queue", queued.extend)
    write(roots / "a.md", "Ada.")
    source = sources.source_create(workspace=workspace, actor=None, name="A", kind="folder", location=str(roots))

    assert sources.sources_claim_due() == [source.pk]
    assert sources.sources_claim_due() == []
    assert sources.source_sync_request(source=source) is False
    sync(source)
    assert sources.sources_claim_due() == []  # next due in an hour
    assert sources.source_sync_request(source=source) is True
    assert queued == [source.pk, source.pk]
    assert Source.objects.get().sync_until is not None
