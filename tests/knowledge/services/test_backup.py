import bisect
import hashlib
import json
import zipfile
from io import StringIO
from pathlib import Path

import pytest
from asgiref.sync import async_to_sync
from django.core.files.storage import default_storage
from django.core.management import CommandError, call_command
from django.db import connection

from chat.models import Conversation, Message
from knowledge.models import (
    AuditEvent,
    Chunk,
    ChunkExtraction,
    Document,
    Entity,
    EntityDegree,
    GraphRebuild,
    LLMCacheEntry,
    MergeLog,
    PendingVector,
    Relation,
    Source,
    Workspace,
)
from knowledge.rag.graph.embedding import clear_cache
from knowledge.rag.llm import Usage
from knowledge.rag.retrieval import retrieve
from knowledge.services import ingestion
from knowledge.services.asking import answer_stream, ask_request
from knowledge.services.backup import ArchiveError, workspace_backup, workspace_restore
from knowledge.services.backup.tables import TABLES
from knowledge.services.curation import entity_merge, entity_merge_undo
from knowledge.services.workspaces import workspace_delete
from tests.factories import make_user
from tests.knowledge.ingest_helpers import DOC_A, DOC_B, answer, graph_dump, meetings, parts, small_chunks

pytestmark = pytest.mark.django_db

QUESTION = "Where is Acme Corp based, and who founded it?"
KEYWORDS = {"low_level": ["Acme Corp", "Alice Smith"], "high_level": ["headquarters", "founding"]}
DOC_C = "Carol Diaz founded Acme Corp.\n\nAcme Corp is based in Berlin."


def _ingest(workspace, name: str, text: str) -> Document:
    document = ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
    return ingestion.document_ingest(document_id=document.pk)


@pytest.fixture
def media(settings, tmp_path):
    settings.MEDIA_ROOT = str(tmp_path / "media")
    return tmp_path


@pytest.fixture
def corpus(openai_double, workspace, owner, settings, media):
    """Three documents through the LLM pipeline (summaries included), a merge, and a conversation."""
    settings.SUMMARY_TRIGGER = 1
    openai_double.reply(answer)
    _ingest(workspace, "a.txt", DOC_A)
    _ingest(workspace, "b.txt", DOC_B)
    _ingest(workspace, "c.md", DOC_C)
    # A source that brought a document, and a second version of another.
    source = Source.objects.create(
        workspace=workspace, name="Handbook", kind="folder", location="handbook", tags=["hb"]
    )
    Document.objects.filter(workspace=workspace, original_filename="a.txt").update(source=source, source_key="a.txt")
    _ingest(workspace, "b.txt", DOC_B + "\n\nBob Jones retired in 2020.")
    survivor = Entity.objects.get(workspace=workspace, key="alice smith")
    entity_merge(survivor=survivor, others=[Entity.objects.get(workspace=workspace, key="bob jones")], actor=owner)
    conversation = Conversation.objects.create(workspace=workspace, user=owner, title="About Acme")
    chunk = Chunk.objects.filter(workspace=workspace).order_by("pk").first()
    acme = Entity.objects.get(workspace=workspace, key="acme corp")
    relation = Relation.objects.filter(workspace=workspace).order_by("pk").first()
    Message.objects.create(conversation=conversation, role="user", content=QUESTION)
    Message.objects.create(
        conversation=conversation,
        role="assistant",
        content="In Berlin [S1].",
        citations=[{"id": "S1", "kind": "source", "chunk_id": chunk.pk, "document_id": chunk.document_id}],
        subgraph={
            "nodes": [{"id": str(acme.pk), "label": "Acme Corp"}],
            "edges": [{"id": f"r{relation.pk}", "source": str(relation.source_id), "target": str(relation.target_id)}],
        },
    )
    workspace.refresh_from_db()
    return workspace


# --- A dump of every archived table, ids replaced by their rank ---------------------------


def _ids(queryset) -> list[int]:
    return sorted(queryset.values_list("pk", flat=True))


def _rank(ids: list[int], value):
    return None if value is None else bisect.bisect_left(ids, value) if value in set(ids) else ("missing", value)


def _search_column(table: str, workspace_id: int) -> dict:
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT id, search::text FROM {table} WHERE workspace_id = %s ORDER BY id",  # noqa: S608
            [workspace_id],
        )
        return cursor.fetchall()


def full_dump(workspace: Workspace) -> dict:
    """Every row of every archived table, ids and references as ranks (a restore redraws ids in
    order), users as usernames, files as their hash; plus the derived state: degrees, the
    full-text columns and the workspace's counters."""
    workspace = Workspace.objects.get(pk=workspace.pk)
    ids = {table.name: _ids(table.rows(workspace)) for table in TABLES}
    dump = {}
    for table in TABLES:
        rows = []
        for obj in table.rows(workspace).order_by("pk"):
            if isinstance(obj, AuditEvent) and obj.action == "workspace.restore":
                continue
            row = {}
            for field in table.model._meta.concrete_fields:
                value = getattr(obj, field.attname)
                if field.attname in ("id", "slug"):
                    continue
                if field.attname in table.refs:
                    value = _rank(ids[table.refs[field.attname]], value)
                elif field.attname in table.users:
                    value = getattr(getattr(obj, field.name), "username", None)
                elif field.attname == "source_file":
                    value = hashlib.sha256(default_storage.open(value.name).read()).hexdigest() if value else ""
                elif field.attname == "summary_through":
                    sources = "entity_sources" if table.name == "entities" else "relation_sources"
                    value = bisect.bisect_right(ids[sources], value)
                elif field.attname == "folded" and value:
                    sources = "entity_sources" if table.name == "entities" else "relation_sources"
                    value = {**value, "through": bisect.bisect_right(ids[sources], value["through"])}
                elif field.attname == "snapshot":
                    continue  # holds rows deleted by the merge; test_undo_... checks it by undoing
                elif field.attname == "embedding" and value is not None:
                    value = [float(x) for x in value]
                elif field.attname == "citations":
                    value = [
                        {
                            **c,
                            "chunk_id": _rank(ids["chunks"], c["chunk_id"]),
                            "document_id": _rank(ids["documents"], c["document_id"]),
                        }
                        for c in value
                    ]
                elif field.attname == "subgraph" and value:
                    value = {
                        "nodes": [{**n, "id": _rank(ids["entities"], int(n["id"]))} for n in value["nodes"]],
                        "edges": [
                            {
                                **e,
                                "id": _rank(ids["relations"], int(e["id"][1:])),
                                "source": _rank(ids["entities"], int(e["source"])),
                                "target": _rank(ids["entities"], int(e["target"])),
                            }
                            for e in value["edges"]
                        ],
                    }
                row[field.attname] = value
            rows.append(row)
        dump[table.name] = rows
    degrees = EntityDegree.objects.filter(entity__workspace=workspace).values_list("entity_id", "degree")
    dump["degrees"] = sorted((_rank(ids["entities"], pk), degree) for pk, degree in degrees)
    dump["chunk_search"] = [text for _, text in _search_column("knowledge_chunk", workspace.pk)]
    dump["entity_search"] = [text for _, text in _search_column("knowledge_entity", workspace.pk)]
    return dump


def _answer_prompt(double, workspace) -> tuple[str, list]:
    """The context of the question and the messages the answer call sent, with what it cost."""
    double.clear()
    result = retrieve(workspace=workspace, question=QUESTION, mode="mix", keywords=KEYWORDS)
    retrieval_chat_calls = len(double.chat_requests())
    request = ask_request(question=QUESTION, keywords=KEYWORDS)

    async def answer():
        return [event async for event in answer_stream(request=request, result=result, usage=Usage())]

    async_to_sync(answer)()
    assert retrieval_chat_calls == 0
    assert len(double.chat_requests()) == 1  # the answer itself
    return result.context, double.chat_requests()[0].messages


# --- The round trip -------------------------------------------------------------------------


def test_backup_then_restore_into_a_fresh_state_gives_the_same_rows_and_the_same_answer_without_model_calls(
    corpus, openai_double, owner, tmp_path
):
    before = full_dump(corpus)
    context, prompt = _answer_prompt(openai_double, corpus)
    archive = tmp_path / "acme.zip"
    workspace_backup(workspace=corpus, path=archive, conversations=True)
    # A fresh database as far as the workspace goes: it, its files and every cached model reply gone.
    workspace_delete(workspace=corpus, actor=owner)
    LLMCacheEntry.objects.all().delete()
    assert not Workspace.objects.filter(slug="acme").exists()
    openai_double.clear()

    report = workspace_restore(path=archive, owner=owner)

    assert openai_double.requests == []
    restored = report.workspace
    assert restored.slug == "acme"
    assert full_dump(restored) == before
    assert (restored.entity_count, restored.relation_count, restored.chunk_count) == (
        before["workspace"][0]["entity_count"],
        before["workspace"][0]["relation_count"],
        before["workspace"][0]["chunk_count"],
    )
    assert report.counts["messages"] == 2
    assert _answer_prompt(openai_double, restored) == (context, prompt)
    assert restored.audit_events.filter(action="workspace.restore").count() == 1


def test_a_restore_beside_the_original_is_the_same_graph_with_the_same_context(corpus, openai_double, tmp_path):
    archive = tmp_path / "acme.zip"
    workspace_backup(workspace=corpus, path=archive)

    report = workspace_restore(path=archive, slug="acme-copy")

    copy = report.workspace
    original = full_dump(corpus)
    assert full_dump(copy) == {**original, "conversations": [], "messages": []}
    assert graph_dump(copy) == graph_dump(corpus)
    assert _answer_prompt(openai_double, copy) == _answer_prompt(openai_double, corpus)
    assert not Conversation.objects.filter(workspace=copy).exists()
    # Files are copies of their own: deleting the original's leaves the copy's.
    original_files = set(Document.objects.filter(workspace=corpus).values_list("source_file", flat=True))
    copy_files = set(Document.objects.filter(workspace=copy).values_list("source_file", flat=True))
    assert original_files.isdisjoint(copy_files)


def test_a_merge_restored_can_be_undone_as_in_the_original(corpus, openai_double, owner, tmp_path):
    archive = tmp_path / "acme.zip"
    workspace_backup(workspace=corpus, path=archive)
    copy = workspace_restore(path=archive, slug="acme-copy").workspace

    entity_merge_undo(merge_log=MergeLog.objects.get(workspace=corpus), actor=owner)
    entity_merge_undo(merge_log=MergeLog.objects.get(workspace=copy), actor=owner)

    assert graph_dump(copy) == graph_dump(corpus)
    assert Entity.objects.filter(workspace=copy, key="bob jones").exists()


def test_the_restored_workspace_takes_new_documents_like_the_original(corpus, openai_double, tmp_path):
    archive = tmp_path / "acme.zip"
    workspace_backup(workspace=corpus, path=archive)
    copy = workspace_restore(path=archive, slug="acme-copy").workspace

    _ingest(corpus, "d.txt", "Bob Jones works for Acme Corp.\n\nAcme Corp is based in Berlin.\n\nDana.")
    _ingest(copy, "d.txt", "Bob Jones works for Acme Corp.\n\nAcme Corp is based in Berlin.\n\nDana.")

    assert graph_dump(copy) == graph_dump(corpus)


def test_an_archive_from_before_sources_and_synonym_links_restores_without_them(corpus, tmp_path):
    path = tmp_path / "acme.zip"
    workspace_backup(workspace=corpus, path=path)
    later = {"tables/sources.jsonl", "tables/entity_links.jsonl"}

    def older(name, data):
        if name in later:
            return None
        if name == "manifest.json":
            manifest = json.loads(data)
            manifest["members"] = {key: value for key, value in manifest["members"].items() if key not in later}
            manifest["counts"] = {
                key: value for key, value in manifest["counts"].items() if f"tables/{key}.jsonl" not in later
            }
            # Its documents name no source: the column was not there yet.
            return json.dumps(manifest).encode()
        if name == "tables/documents.jsonl":
            rows = [json.loads(line) | {"source_id": None} for line in data.decode().splitlines()]
            return "".join(json.dumps(row) + "\n" for row in rows).encode()
        return data

    old = _rewrite(path, tmp_path / "old.zip", older)
    manifest = json.loads(zipfile.ZipFile(old).read("manifest.json"))
    documents = zipfile.ZipFile(old).read("tables/documents.jsonl")
    manifest["members"]["tables/documents.jsonl"]["sha256"] = hashlib.sha256(documents).hexdigest()
    old = _rewrite(
        old,
        tmp_path / "old2.zip",
        lambda name, data: json.dumps(manifest).encode() if name == "manifest.json" else data,
    )

    restored = workspace_restore(path=old, slug="acme-old").workspace

    assert graph_dump(restored) == graph_dump(corpus)
    assert not Source.objects.filter(workspace=restored).exists()


# --- Refusals: nothing changes ---------------------------------------------------------------


@pytest.fixture
def archive(corpus, tmp_path):
    path = tmp_path / "acme.zip"
    workspace_backup(workspace=corpus, path=path)
    return path


def _rewrite(source: Path, target: Path, change) -> Path:
    """A copy of the archive with members changed by `change(name, data)` (None drops one)."""
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for info in old.infolist():
            data = change(info.filename, old.read(info.filename))
            if data is not None:
                new.writestr(info.filename, data)
    return target


def _manifest_change(**changes):
    def change(name, data):
        if name != "manifest.json":
            return data
        manifest = json.loads(data)
        for key, value in changes.items():
            manifest[key] = value
        return json.dumps(manifest).encode()

    return change


def _rows_of_everything() -> dict:
    return {table.name: table.model.objects.count() for table in TABLES} | {
        "files": sum(1 for _ in Path(default_storage.location).rglob("*") if _.is_file())
    }


def _refused(path, message: str, **kwargs) -> None:
    before = _rows_of_everything()
    with pytest.raises(ArchiveError, match=message):
        workspace_restore(path=path, **kwargs)
    assert _rows_of_everything() == before


def test_it_refuses_a_slug_that_exists_unless_given_a_new_one(archive):
    _refused(archive, "exists here already; pass a new one")


def test_it_refuses_another_embedding_dimension_with_a_message_to_re_embed(archive, tmp_path):
    path = _rewrite(archive, tmp_path / "other.zip", _manifest_change(embedding={"model": "big", "dimensions": 1536}))

    _refused(path, "re-embed", slug="other")


def test_it_refuses_another_embedding_model_of_the_same_dimension(archive, tmp_path, settings):
    settings.EMBEDDING_MODEL = "another-embed"

    _refused(archive, "this installation embeds with another-embed", slug="other")


def test_it_refuses_an_archive_whose_rows_were_changed(archive, tmp_path):
    def tamper(name, data):
        return data.replace(b"Berlin", b"Munich") if name == "tables/entities.jsonl" else data

    _refused(_rewrite(archive, tmp_path / "tampered.zip", tamper), "does not match the checksum", slug="other")


def test_it_refuses_a_truncated_archive(archive, tmp_path):
    data = archive.read_bytes()
    truncated = tmp_path / "truncated.zip"
    truncated.write_bytes(data[: len(data) * 2 // 3])

    _refused(truncated, "not a readable workspace archive", slug="other")


def test_it_refuses_another_format_version(archive, tmp_path):
    path = _rewrite(archive, tmp_path / "v2.zip", _manifest_change(version=2))

    _refused(path, "format version 2; this installation reads version 1", slug="other")


@pytest.mark.parametrize("name", ["../evil.txt", "/etc/evil", "files/1/../../evil", "files\\1\\evil"])
def test_it_refuses_member_names_that_climb_out(archive, tmp_path, name):
    path = _rewrite(archive, tmp_path / "evil.zip", lambda member, data: data)
    with zipfile.ZipFile(path, "a") as evil:
        evil.writestr(name, b"x")

    _refused(path, "unsafe name", slug="other")


def test_it_refuses_a_listed_file_that_climbs_out(archive, tmp_path):
    def rename(name, data):
        if name == "manifest.json":
            manifest = json.loads(data)
            manifest["members"]["files/1/../../evil"] = {"sha256": "0" * 64, "bytes": 1}
            return json.dumps(manifest).encode()
        return data

    _refused(_rewrite(archive, tmp_path / "evil.zip", rename), "unsafe name|unexpected member", slug="other")


def test_rows_that_do_not_fit_change_nothing_and_leave_no_files(archive, tmp_path):
    def duplicate_key(name, data):
        if name != "tables/entities.jsonl":
            return data
        lines = data.splitlines(keepends=True)
        first = json.loads(lines[0])
        second = json.loads(lines[1])
        second["key"] = first["key"]  # two entities with one key: refused by the unique constraint
        return b"".join([lines[0], json.dumps(second).encode() + b"\n", *lines[2:]])

    def rechecksummed(source, target):
        with zipfile.ZipFile(source) as old:
            manifest = json.loads(old.read("manifest.json"))
            for name in manifest["members"]:
                manifest["members"][name]["sha256"] = hashlib.sha256(old.read(name)).hexdigest()
        return _rewrite(source, target, _manifest_change(members=manifest["members"]))

    changed = _rewrite(archive, tmp_path / "dup.zip", duplicate_key)
    path = rechecksummed(changed, tmp_path / "dup-signed.zip")

    _refused(path, "do not fit this database", slug="other")


# --- The commands ------------------------------------------------------------------------------


def test_the_commands_back_up_and_restore_with_a_new_slug(corpus, openai_double, owner, tmp_path):
    path = tmp_path / "acme.zip"
    out = StringIO()
    call_command("backup_workspace", "acme", "-o", str(path), "--conversations", stdout=out)
    assert "Backed up acme" in out.getvalue()
    assert zipfile.ZipFile(path).read("manifest.json")
    make_user("newcomer")
    openai_double.clear()

    out = StringIO()
    call_command("restore_workspace", str(path), "--slug", "acme-2", "--owner", "newcomer", stdout=out)

    assert "Restored acme-2" in out.getvalue()
    assert openai_double.requests == []
    restored = Workspace.objects.get(slug="acme-2")
    assert restored.memberships.get(user__username="newcomer").role == "owner"
    assert restored.memberships.get(user__username="owner").role == "owner"
    assert Conversation.objects.get(workspace=restored).user == owner
    with pytest.raises(CommandError, match="exists here already"):
        call_command("restore_workspace", str(path), "--slug", "acme-2", stdout=StringIO())


def test_the_manifest_says_what_the_archive_holds(corpus, tmp_path):
    path = tmp_path / "acme.zip"

    manifest = workspace_backup(workspace=corpus, path=path)

    assert manifest["version"] == 1
    assert manifest["embedding"] == {"model": "double-embed", "dimensions": 384}
    assert manifest["counts"]["documents"] == 4  # b.txt in two versions
    assert manifest["counts"]["sources"] == 1
    assert "tables/entity_links.jsonl" in manifest["members"]
    assert manifest["counts"]["entities"] == Entity.objects.filter(workspace=corpus).count()
    assert "tables/conversations.jsonl" not in manifest["members"]
    with zipfile.ZipFile(path) as archive:
        assert sorted(name for name in archive.namelist() if name.startswith("files/")) == sorted(
            name for name in manifest["members"] if name.startswith("files/")
        )
        first = json.loads(archive.read("tables/chunks.jsonl").splitlines()[0])
    assert len(first["embedding"]) == 384
    assert all(isinstance(value, float) for value in first["embedding"])


def test_an_interrupted_document_restored_resumes_where_it_stopped(openai_double, workspace, settings, media, tmp_path):
    settings.LLM_MAX_RETRIES = 0
    settings.LLM_MAX_CONCURRENCY = 4  # batches of 8 chunks
    small_chunks(workspace)
    answered = []

    def failing_after_first_batch(body):
        if len(answered) >= 16:  # 8 extractions + 8 gleanings
            raise RuntimeError("model crashed")
        answered.append(body)
        return meetings(body)

    openai_double.reply(failing_after_first_batch)
    document = ingestion.document_create(
        workspace=workspace, filename="parts.txt", data=parts(count=16).encode(), enqueue=False
    )
    with pytest.raises(ingestion.IngestInterrupted):
        ingestion.document_ingest(document_id=document.pk)
    Document.objects.filter(pk=document.pk).update(next_attempt_at=document.created_at)
    shared = Entity.objects.get(workspace=workspace, key="shared person")
    GraphRebuild.objects.create(workspace=workspace, entity_ids=[shared.pk], reason="a test's rebuild")
    assert PendingVector.objects.filter(document=document).exists()
    assert not shared.published
    path = tmp_path / "parts.zip"
    workspace_backup(workspace=workspace, path=path)
    copy = workspace_restore(path=path, slug="parts-copy").workspace
    copied = Document.objects.get(workspace=copy)
    assert (copied.lease_owner, copied.lease_expires_at) == ("", None)
    assert GraphRebuild.objects.get(workspace=copy).entity_ids == [
        Entity.objects.get(workspace=copy, key="shared person").pk
    ]
    openai_double.reply(meetings)
    calls = {}

    for target in (document, copied):
        LLMCacheEntry.objects.all().delete()  # the copy may not profit from replies the original cached
        clear_cache()  # nor from the names and keywords it embedded
        openai_double.clear()
        done = ingestion.document_ingest(document_id=target.pk)
        assert done.status == "processed"
        calls[target.workspace_id] = (len(openai_double.chat_requests()), len(openai_double.embedding_requests()))

    assert graph_dump(copy) == graph_dump(workspace)
    # Both ask only for the chunks not extracted before the interruption (an extraction and a
    # gleaning each), never again for the first eight.
    assert calls[copy.pk] == calls[workspace.pk]
    assert calls[copy.pk][0] < 2 * copied.chunk_count - 8
    assert ChunkExtraction.objects.filter(chunk__document=copied).count() == copied.chunk_count
