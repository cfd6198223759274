import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from knowledge.models import Document, Entity, Workspace
from knowledge.rag import graph
from tests.knowledge.ingest_helpers import DOC_A, DOC_B, answer

pytestmark = pytest.mark.django_db


@pytest.fixture
def corpus(tmp_path):
    (tmp_path / "nested").mkdir()
    (tmp_path / "a.txt").write_text(DOC_A)
    (tmp_path / "nested" / "b.md").write_text(DOC_B)
    (tmp_path / "nested" / "photo.png").write_bytes(b"\x89PNG")
    return tmp_path


def _run(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_ingest_reads_folders_into_a_new_workspace_in_process(openai_double, corpus, owner):
    openai_double.reply(answer)

    output = _run("ingest", str(corpus), "--workspace", "research", "--create", "--owner", owner.username)

    assert "2 processed, 0 failed, 0 refused into workspace research" in output
    workspace = Workspace.objects.get(slug="research")
    assert workspace.memberships.get().user == owner
    assert sorted(Document.objects.values_list("title", "status")) == [("a.txt", "processed"), ("b.md", "processed")]
    assert Entity.objects.filter(workspace=workspace, key="acme corp").exists()


def test_ingest_reports_odd_file_names_and_unreadable_files_as_refused(tmp_path, workspace):
    import os

    (tmp_path / "bell\x07.txt").write_text("A file whose name rings a bell.")
    (tmp_path / os.fsdecode(b"latin-\xe9.txt")).write_text("A file whose name is not UTF-8.")
    as_root = os.geteuid() == 0  # root reads any file, so only others can see the refusal
    if not as_root:
        (tmp_path / "locked.txt").write_text("Nobody may read this.")
        (tmp_path / "locked.txt").chmod(0)
    errors = StringIO()

    call_command("ingest", str(tmp_path), "--workspace", workspace.slug, stdout=StringIO(), stderr=errors)

    report = errors.getvalue()
    assert "control characters" in report
    assert "must be valid UTF-8" in report
    assert as_root or "locked.txt: could not be read" in report
    assert not Document.objects.filter(workspace=workspace).exists()


def test_ingest_refuses_an_unknown_workspace_without_create(corpus, db):
    with pytest.raises(CommandError, match="Pass --create"):
        _run("ingest", str(corpus), "--workspace", "nowhere")


def test_ingest_reports_failed_documents_and_exits_non_zero(openai_double, corpus, workspace, settings):
    settings.LLM_MAX_RETRIES = 0
    openai_double.fail(1000, status=500, message="server exploded")

    with pytest.raises(CommandError, match="2 document"):
        _run("ingest", str(corpus / "a.txt"), str(corpus / "nested" / "b.md"), "--workspace", workspace.slug)

    assert set(Document.objects.values_list("status", flat=True)) == {"failed"}
    assert "server exploded" in Document.objects.first().error_detail


def test_documents_and_graph_stats_print_json(openai_double, corpus, workspace):
    openai_double.reply(answer)
    _run("ingest", str(corpus / "a.txt"), "--workspace", workspace.slug)

    documents = json.loads(_run("documents", "--workspace", workspace.slug, "--json"))
    stats = json.loads(_run("graph_stats", "--workspace", workspace.slug, "--json"))

    assert [(row["title"], row["status"], row["entity_count"], row["error"]) for row in documents] == [
        ("a.txt", "processed", 3, "")
    ]
    assert stats["documents"] == 1
    assert stats["documents_by_status"] == {"processed": 1}
    assert (stats["chunks"], stats["entities"], stats["relations"]) == (1, 3, 2)
    assert stats["tokens"]["corpus_tokens"] > 0
    assert stats["tokens"]["llm_calls"] == 2


def test_delete_document_removes_what_only_it_contributed(openai_double, corpus, workspace):
    openai_double.reply(answer)
    _run("ingest", str(corpus / "a.txt"), str(corpus / "nested" / "b.md"), "--workspace", workspace.slug)
    first = Document.objects.get(title="a.txt")

    _run("delete_document", str(first.pk))

    assert not Entity.objects.filter(key="berlin").exists()
    assert Entity.objects.filter(key="acme corp").exists()
    with pytest.raises(CommandError, match="No document"):
        _run("delete_document", str(first.pk))


def test_reembed_embeds_everything_again_with_the_current_model(openai_double, corpus, workspace):
    openai_double.reply(answer)
    _run("ingest", str(corpus / "a.txt"), "--workspace", workspace.slug)
    Entity.objects.update(embedding=None)
    openai_double.clear()

    output = _run("reembed", "--workspace", workspace.slug)

    assert "1 chunks, 3 entities, 2 relations re-embedded" in output
    assert not Entity.objects.filter(embedding=None).exists()
    assert graph.vector_dimensions() == 384
