import asyncio
import os
import re
import socket
import subprocess
import threading
import types
from datetime import timedelta

import psutil
import pytest
import redis
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import OperationalError, connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from knowledge import metrics
from knowledge.models import (
    Chunk,
    ChunkExtraction,
    Document,
    Entity,
    EntityDegree,
    EntityLink,
    EntitySource,
    GraphRebuild,
    PendingRow,
    Relation,
    SynonymSearch,
    Workspace,
)
from knowledge.rag import graph, llm, prompts
from knowledge.rag.graph import describe, provenance, rebuild, vectors
from knowledge.rag.graph.provenance import provenance_epoch
from knowledge.rag.graph.rebuild import SUMMARY_FIELDS
from knowledge.services import ingestion
from knowledge.services.ingestion import runs, steps
from knowledge.tasks import ingest_next
from tests.factories import make_workspace
from tests.knowledge.ingest_helpers import (
    DOC_A,
    DOC_B,
    MEETING,
    answer,
    graph_dump,
    meetings,
    parts,
    small_chunks,
)
from tests.processes import wait_for

pytestmark = pytest.mark.django_db


def _create(workspace, name: str, text: str) -> Document:
    return ingestion.document_create(workspace=workspace, filename=name, data=text.encode(), enqueue=False)


def _ingest(workspace, name: str, text: str) -> Document:
    document = _create(workspace, name, text)
    return ingestion.document_ingest(document_id=document.pk)


def _ingest_at_once(documents: list[Document]) -> list[Exception]:
    """Ingest each document on a thread of its own, all at once; what they raised."""
    errors = []

    def run(document):
        try:
            ingestion.document_ingest(document_id=document.pk)
        except Exception as err:  # returned to the test
            errors.append(err)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(document,)) for document in documents]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return errors


def _extraction_requests(double):
    """First-pass extraction requests (gleaning requests carry the whole conversation)."""
    return [
        request
        for request in double.chat_requests()
        if request.messages[0]["content"].startswith("You build") and len(request.messages) == 2
    ]


@pytest.fixture
def scripted(openai_double):
    openai_double.reply(answer)
    return openai_double


def test_a_run_reads_the_model_settings_once_a_step_and_its_document_once(scripted, workspace, monkeypatch):
    # Per call, the settings cost a read of Redis (28 for this document before), and the build's
    # provenance checks read the document's workspace and version sixteen times; the document
    # was read again after each step (six times), and the vector type before each vector write.
    _ingest(workspace, "a.txt", DOC_A)
    reads, type_lookups = [], []
    provider = llm._provider
    monkeypatch.setattr(llm, "_provider", lambda: reads.append(1) or provider())
    fetch = vectors.TypeInfo.fetch
    monkeypatch.setattr(vectors.TypeInfo, "fetch", lambda *args: type_lookups.append(1) or fetch(*args))
    second = _create(workspace, "b.txt", DOC_B)
    with CaptureQueriesContext(connection) as queries:
        assert ingestion.document_ingest(document_id=second.pk).status == "processed"

    steps_run = 5  # parse, embed, extract, build, publish
    assert len(reads) == steps_run
    document_reads = [
        query["sql"]
        for query in queries.captured_queries
        if re.match(r'SELECT "knowledge_document"\."(workspace_id|replaces_id)"', query["sql"])
    ]
    assert document_reads == []
    whole_reads = [
        query
        for query in queries.captured_queries
        if query["sql"].startswith('SELECT "knowledge_document"."id", "knowledge_document"."workspace_id"')
    ]
    assert len(whole_reads) == 2  # when the run starts, and the one it returns
    assert len(type_lookups) <= 1  # once per connection, and this one may have asked already


def test_a_two_document_corpus_gives_the_expected_graph(scripted, workspace):
    first = _ingest(workspace, "a.txt", DOC_A)
    second = _ingest(workspace, "b.txt", DOC_B)

    dump = graph_dump(workspace)
    assert (first.status, second.status) == ("processed", "processed")
    assert {key: (entity["name"], entity["type"]) for key, entity in dump["entities"].items()} == {
        "alice smith": ("Alice Smith", "person"),
        "acme corp": ("Acme Corp", "organization"),
        "berlin": ("Berlin", "location"),
        "bob jones": ("Bob Jones", "person"),
    }
    founder = dump["relations"][("acme corp", "alice smith")]
    assert founder["weight"] == 11.0
    assert founder["keywords"] == "founding, advice"
    assert founder["description"] == "Alice Smith founded Acme Corp.\nAlice Smith advises Acme Corp."
    assert [source[0] for source in founder["sources"]] == ["a.txt", "b.txt"]
    assert dump["relations"][("acme corp", "berlin")]["weight"] == 6.0
    assert dump["relations"][("acme corp", "bob jones")]["weight"] == 7.0
    assert len(dump["relations"]) == 3
    assert all(entity["has_vector"] for entity in dump["entities"].values())
    assert all(relation["has_vector"] for relation in dump["relations"].values())
    assert second.entity_count == 3
    assert second.relation_count == 2
    assert second.llm_calls == 2  # one extraction and one gleaning call for its only chunk
    assert second.prompt_tokens > 0
    workspace.refresh_from_db()
    assert (workspace.entity_count, workspace.relation_count, workspace.chunk_count) == (4, 3, 2)


def test_an_entity_in_both_documents_is_one_node_with_both_sources(scripted, workspace):
    _ingest(workspace, "a.txt", DOC_A)
    _ingest(workspace, "b.txt", DOC_B)

    acme = Entity.objects.get(workspace=workspace, key="acme corp")
    assert Entity.objects.filter(workspace=workspace, name__iexact="acme corp").count() == 1
    assert sorted(acme.sources.values_list("chunk__document__title", flat=True)) == ["a.txt", "b.txt"]
    assert sorted(acme.sources.values_list("name", flat=True)) == ["ACME corp", "Acme Corp"]
    assert "Acme Corp is based in Berlin." in acme.description
    assert "Acme Corp employs Bob Jones." in acme.description


def test_deleting_a_document_leaves_the_graph_of_the_other_alone_without_extraction_calls(
    scripted, workspace, settings
):
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 1, 0  # merged descriptions go through (cached) summaries
    alone = make_workspace(slug="alone")
    a = _ingest(workspace, "a.txt", DOC_A)
    _ingest(workspace, "b.txt", DOC_B)
    _ingest(alone, "b.txt", DOC_B)
    assert graph_dump(workspace) != graph_dump(alone)
    scripted.clear()

    ingestion.document_delete(document=a)

    assert graph_dump(workspace) == graph_dump(alone)
    assert scripted.chat_requests() == []
    assert "Summary:" in Entity.objects.get(workspace=workspace, key="acme corp").description
    workspace.refresh_from_db()
    assert (workspace.entity_count, workspace.relation_count, workspace.chunk_count) == (3, 2, 1)
    assert workspace.audit_events.filter(action="document.delete").count() == 1


def test_a_failure_after_half_the_chunks_resumes_without_asking_again_for_the_extracted_ones(
    openai_double, workspace, settings
):
    settings.LLM_MAX_RETRIES = 0
    settings.LLM_MAX_CONCURRENCY = 4  # batches of 8 chunks
    Workspace.objects.filter(pk=workspace.pk).update(chunk_token_size=14, chunk_overlap_tokens=0)
    answered = []

    def failing_after_first_batch(body):
        if len(answered) >= 16:  # 8 extractions + 8 gleanings
            raise RuntimeError("model crashed")
        answered.append(body)
        return meetings(body)

    openai_double.reply(failing_after_first_batch)
    document = _create(workspace, "parts.txt", parts(count=16))

    with pytest.raises(ingestion.IngestInterrupted, match="chunk"):
        ingestion.document_ingest(document_id=document.pk)

    document.refresh_from_db()
    assert document.status == "pending"
    assert "will retry" in document.error
    Document.objects.filter(pk=document.pk).update(next_attempt_at=document.created_at)  # its backoff is over
    assert document.chunks_done == 8
    chunk_count = document.chunk_count
    assert chunk_count > 8
    first_half = set(Chunk.objects.filter(document=document, order__lt=8).values_list("text", flat=True))
    openai_double.clear()
    openai_double.reply(meetings)

    done = ingestion.document_ingest(document_id=document.pk)

    asked = [request.messages[1]["content"] for request in _extraction_requests(openai_double)]
    assert done.status == "processed"
    assert len(asked) == chunk_count - 8
    assert not any(text in question for text in first_half for question in asked)
    assert done.chunks_done == chunk_count
    assert ChunkExtraction.objects.filter(chunk__document=document).count() == chunk_count
    meeting_chunks = [chunk for chunk in Chunk.objects.filter(document=document) if MEETING.search(chunk.text)]
    shared = Entity.objects.get(workspace=workspace, key="shared person")
    assert set(shared.sources.values_list("chunk", flat=True)) == {chunk.pk for chunk in meeting_chunks}


@pytest.mark.django_db(transaction=True)
def test_two_documents_sharing_entities_ingested_concurrently_lose_no_provenance(openai_double, settings):
    workspace = make_workspace(slug="concurrent", chunk_token_size=14, chunk_overlap_tokens=0)
    settings.SUMMARY_TRIGGER = 1000
    settings.SUMMARY_MAX_TOKENS = 100000

    openai_double.reply(lambda body: meetings(body, delay=0.005))  # so the two documents' batches interleave
    documents = [
        _create(workspace, "a.txt", parts("A", count=24)),
        _create(workspace, "b.txt", parts("B", count=24)),
    ]

    assert _ingest_at_once(documents) == []
    # The race happened: extraction requests of one document arrived between two of the other's.
    letters = [
        MEETING.findall(request.messages[1]["content"])[0][0]
        for request in _extraction_requests(openai_double)
        if MEETING.findall(request.messages[1]["content"])
    ]
    switches = sum(1 for first, second in zip(letters, letters[1:], strict=False) if first != second)
    assert switches >= 2, f"the documents' batches did not interleave: {''.join(letters)}"
    assert set(Document.objects.values_list("status", flat=True)) == {"processed"}
    expected = set()
    for chunk in Chunk.objects.filter(workspace=workspace):
        for person in MEETING.findall(chunk.text):
            expected |= {(f"person {person.lower()}", chunk.pk), ("shared person", chunk.pk)}
    stored = set(EntitySource.objects.values_list("entity__key", "chunk_id"))
    assert stored == expected
    shared = Entity.objects.get(key="shared person")
    for person in [f"A{i:02d}" for i in range(24)] + [f"B{i:02d}" for i in range(24)]:
        if any(key == f"person {person.lower()}" for key, _ in expected):
            assert f"Shared Person met Person {person}." in shared.description
    relation_weights = dict(Relation.objects.values_list("source__key", "weight"))
    assert all(weight == 2.0 for weight in relation_weights.values())


def _one_name_each(body: dict) -> str:
    """Extraction of the one product each document names; summaries of what it is given."""
    if body["messages"][0]["content"].startswith("You merge descriptions"):
        return "Summary: " + " / ".join(re.findall(r"^- (.*)$", body["messages"][1]["content"], flags=re.M))
    names = re.findall(r"We use (\S+) daily", body["messages"][1]["content"]) if len(body["messages"]) == 2 else []
    return "\n".join([*(f"entity<|>{name}<|>product<|>{name} is used daily." for name in names), prompts.DONE_MARKER])


@pytest.mark.django_db(transaction=True)
def test_two_documents_published_at_once_link_their_synonyms(openai_double, monkeypatch):
    workspace = make_workspace(slug="synonyms-at-once")
    openai_double.reply(_one_name_each)
    documents = [
        _create(workspace, "a.txt", "We use Graph-RAG daily."),
        _create(workspace, "b.txt", "We use GraphRAG daily."),
    ]
    # Both publishing transactions wait for each other after their vectors are published and
    # before either commits: where each searched for synonyms before, seeing nothing of the other.
    both_open = threading.Barrier(2, timeout=60)
    met = []
    checked = steps._checked

    def meet_then_check(document, owner, seconds=None, **changes):
        if changes.get("status") == Document.Status.PROCESSED:
            both_open.wait()
            met.append(document.pk)
        checked(document, owner, seconds, **changes)

    monkeypatch.setattr(steps, "_checked", meet_then_check)

    assert _ingest_at_once(documents) == []
    assert sorted(met) == sorted(document.pk for document in documents)  # the race happened
    assert set(Document.objects.values_list("status", flat=True)) == {"processed"}
    names = {link.source.name for link in EntityLink.objects.select_related("source")} | {
        link.target.name for link in EntityLink.objects.select_related("target")
    }
    assert names == {"Graph-RAG", "GraphRAG"}
    assert not SynonymSearch.objects.exists()


def test_a_synonym_search_that_fails_after_publishing_is_done_by_the_sweeper(openai_double, workspace, monkeypatch):
    openai_double.reply(_one_name_each)
    _ingest(workspace, "a.txt", "We use Graph-RAG daily.")
    search = graph.run_synonym_searches

    def lost(**kwargs):
        raise OperationalError("the connection was lost")

    monkeypatch.setattr(graph, "run_synonym_searches", lost)
    assert _ingest(workspace, "b.txt", "We use GraphRAG daily.").status == "processed"
    monkeypatch.setattr(graph, "run_synonym_searches", search)
    queued = SynonymSearch.objects.get()
    assert queued.entity.name == "GraphRAG"
    assert not EntityLink.objects.exists()

    assert runs.sweep()["synonym_searches"] == 0  # the publisher may still be at it
    SynonymSearch.objects.update(due_at=timezone.now() - timedelta(seconds=1))
    assert runs.sweep()["synonym_searches"] == 1

    link = EntityLink.objects.select_related("source", "target").get()
    assert {link.source.name, link.target.name} == {"Graph-RAG", "GraphRAG"}
    assert not SynonymSearch.objects.exists()


def test_malformed_lines_are_skipped_and_counted(openai_double, workspace):
    openai_double.reply(
        lambda body: (
            "\n".join(
                [
                    "entity<|>Alice Smith<|>person<|>Alice founded Acme.",
                    "this line is not a record",
                    "entity<|>only a name",
                    "relation<|>Alice Smith<|>Alice Smith<|>self<|>A self-loop is not a relation.<|>3",
                    "entity<|>Acme Corp<|>organization<|>Acme is a company.",
                    "relation<|>Alice Smith<|>Acme Corp<|>founding<|>Alice founded Acme.<|>high",
                ]
            )
            if len(body["messages"]) == 2
            else prompts.DONE_MARKER
        )
    )

    document = _ingest(workspace, "a.txt", DOC_A)

    extraction = ChunkExtraction.objects.get(chunk__document=document)
    assert extraction.skipped_lines == 3
    assert extraction.engine == "llm"
    assert Entity.objects.filter(workspace=workspace).count() == 2
    relation = Relation.objects.get(workspace=workspace)
    assert relation.weight == 1.0  # an unreadable strength counts as 1


def _turns_until_settled() -> int:
    """Run turns as a worker would until nothing is due; how many turns ran."""
    turns = 0
    while ingest_next.apply().get() is not None:
        turns += 1
        Document.objects.filter(status="pending").update(next_attempt_at=timezone.now())  # no backoff waits
    return turns


def test_a_model_that_keeps_failing_leaves_the_document_failed_with_the_reason(openai_double, workspace, settings):
    settings.LLM_MAX_RETRIES = 1
    settings.INGEST_MAX_ATTEMPTS = 2
    openai_double.fail(1000, status=503, message="the model is overloaded")
    document = _create(workspace, "a.txt", DOC_A)

    assert _turns_until_settled() == 3

    document.refresh_from_db()
    assert document.status == "failed"
    # Every member reads what to do; owners read what the model said and where it lives.
    assert document.error.startswith("The chat model did not answer; try again later.")
    assert "gave up after 2 attempts" in document.error
    assert "127.0.0.1" not in document.error
    assert "503" in document.error_detail
    assert "the model is overloaded" in document.error_detail
    assert "gave up after 2 attempts" in document.error_detail


def test_a_refused_api_key_fails_the_document_at_once(openai_double, workspace):
    openai_double.fail(1, status=401)
    document = _create(workspace, "a.txt", DOC_A)

    assert _turns_until_settled() == 1

    document.refresh_from_db()
    assert document.error == "The chat model refused the request; an owner should check LLM settings."
    assert "LLM_API_KEY" in document.error_detail
    assert len(openai_double.chat_requests()) == 1


def test_a_second_run_of_a_processed_document_does_nothing(scripted, workspace):
    document = _ingest(workspace, "a.txt", DOC_A)
    scripted.clear()

    assert ingestion.document_ingest(document_id=document.pk) is None
    assert ingest_next.apply().get() is None
    assert scripted.requests == []


def test_a_document_whose_run_died_is_taken_over_once_its_lease_expires(scripted, workspace):
    document = _create(workspace, "a.txt", DOC_A)
    lease = timezone.now() + timedelta(seconds=60)
    Document.objects.filter(pk=document.pk).update(
        status="processing", lease_owner="elsewhere:1", lease_expires_at=lease
    )
    assert ingestion.document_ingest(document_id=document.pk) is None  # a live run holds it

    Document.objects.filter(pk=document.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    before = _takeovers()

    assert ingestion.document_ingest(document_id=document.pk).status == "processed"
    assert _takeovers() == before + 1


def _takeovers() -> float:
    """The operators' count of documents taken over after their lease ran out (knowledge/metrics.py)."""
    samples = dict(metrics.read())[metrics.SWEEPER_TAKEOVERS]
    return sum(sample.value for sample in samples if sample.labels == {"how": "lease_expired"})


def test_a_turn_that_claims_a_document_wakes_a_worker_for_one_still_waiting(scripted, workspace, settings):
    # B's wake-up was spent: its claim looked just before B committed, while another worker took A.
    # The turn on A hands the work on at once, not at the end of its slice or the next sweep.
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    _create(workspace, "a.txt", DOC_A)
    # Of another workspace, B cannot join A's turn (runs take new documents of one workspace together).
    _create(make_workspace(slug="elsewhere"), "b.txt", DOC_B)
    broker.delete("celery")
    queued_at_first_call = []

    def reply(body):
        if not queued_at_first_call:
            queued_at_first_call.append(broker.llen("celery"))
        return answer(body)

    scripted.reply(reply)
    try:
        ingest_next.apply()
    finally:
        broker.delete("celery")

    assert queued_at_first_call == [1]


def test_a_starting_worker_takes_over_the_runs_of_dead_zombie_and_pid_reusing_processes_on_its_host(workspace):
    # A pool process killed with its worker is a zombie until PID 1 reaps it, which took more than
    # a second on this machine; a worker restarted within it once left the run to its 10-minute lease.
    zombie = subprocess.Popen(["true"])  # never waited for: a zombie of this process
    wait_for(lambda: psutil.Process(zombie.pid).status() == psutil.STATUS_ZOMBIE, timeout=30, what="a zombie")
    gone = subprocess.Popen(["true"])
    gone.wait()
    host = socket.gethostname()
    lease = timezone.now() + timedelta(minutes=10)
    me = ingestion.worker_identity()
    started = int(me.rsplit(":", 1)[1])
    owners = {
        "live": me,
        "older version": f"{host}:{os.getpid()}",
        # This process's pid, but another process's start: a restarted container reusing the pid.
        "reused pid": f"{host}:{os.getpid()}:{started - 100}",
        "zombie": f"{host}:{zombie.pid}",
        "gone": f"{host}:{gone.pid}:{started}",
        "elsewhere": f"another-host:{zombie.pid}",
    }
    for name, owner in owners.items():
        document = _create(workspace, f"{name}.txt", f"The run of {name}.")
        Document.objects.filter(pk=document.pk).update(status="processing", lease_owner=owner, lease_expires_at=lease)

    assert ingestion.release_dead_leases() == 3
    zombie.wait()

    held = dict(Document.objects.filter(workspace=workspace).values_list("title", "lease_owner"))
    assert held == {
        "live.txt": owners["live"],
        "older version.txt": owners["older version"],
        "reused pid.txt": "",
        "zombie.txt": "",
        "gone.txt": "",
        "elsewhere.txt": owners["elsewhere"],
    }


def test_the_same_text_in_another_workspace_is_served_from_the_cache(scripted, workspace):
    _ingest(workspace, "a.txt", DOC_A)
    scripted.clear()

    other = _ingest(make_workspace(slug="other"), "a.txt", DOC_A)

    assert other.status == "processed"
    assert _extraction_requests(scripted) == []
    assert other.llm_calls == 0


def test_progress_is_published_to_the_workspace_group(scripted, workspace, django_capture_on_commit_callbacks):
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(f"workspace-{workspace.pk}", channel)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            document = _ingest(workspace, "a.txt", DOC_A)
        events = async_to_sync(_drain)(layer, channel)
    finally:
        async_to_sync(layer.group_discard)(f"workspace-{workspace.pk}", channel)

    progress = [event["document"] for event in events if event["document"]["id"] == document.pk]
    assert all(event["type"] == "document.progress" for event in events)
    assert progress[0]["status"] == "pending"
    assert progress[-1]["status"] == "processed"
    assert progress[-1]["chunks_done"] == progress[-1]["chunk_count"] == 1
    assert progress[-1]["entity_count"] == 3
    assert progress[-1]["prompt_tokens"] > 0
    assert any(event["status"] == "processing" for event in progress)


def test_each_stage_takes_one_step_when_its_work_fits_in_one(scripted, workspace):
    """The step that finishes a stage's work starts the next stage: every step is a transaction,
    a read of the document and an event, and a small document should not pay for empty ones."""
    document = _create(workspace, "a.txt", DOC_A)
    stages = []
    ingestion.document_ingest(document_id=document.pk, progress=lambda current: stages.append(current.stage))

    assert stages == ["embedding", "extracting", "building", "publishing", "done"]
    assert Document.objects.get(pk=document.pk).status == "processed"


def test_the_steps_commit_without_waiting_for_the_disk_and_the_publishing_waits(scripted, workspace, monkeypatch):
    """Decision 0173: a Postgres crash may lose a run's last steps, which the next run redoes, but
    never a document members were shown as processed; the connection is as it was afterwards."""
    document = _create(workspace, "a.txt", DOC_A)
    seen = []
    checked = steps._checked

    def noting_the_setting(current, *args, **changes):
        with connection.cursor() as cursor:
            cursor.execute("SHOW synchronous_commit")
            seen.append((current.stage, cursor.fetchone()[0]))
        return checked(current, *args, **changes)

    monkeypatch.setattr(steps, "_checked", noting_the_setting)
    assert ingestion.document_ingest(document_id=document.pk).status == "processed"

    assert {stage for stage, _ in seen} == {"queued", "embedding", "extracting", "building", "publishing"}
    assert {setting for stage, setting in seen if stage != "publishing"} == {"off"}
    assert {setting for stage, setting in seen if stage == "publishing"} == {"on"}
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        assert cursor.fetchone()[0] == "on"


async def _drain(layer, channel) -> list[dict]:
    """Everything waiting on the channel, read on one event loop (the layer's receive state belongs to it)."""
    events = []
    while True:
        try:
            async with asyncio.timeout(1):
                events.append(await layer.receive(channel))
        except TimeoutError:
            return events


def test_the_embedded_defaults_turn_prose_into_a_sensible_graph(workspace, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    prose = (
        "Ada Lovelace worked with Charles Babbage on the Analytical Engine in London. "
        "Babbage had designed the machine while he taught at the University of Cambridge.\n\n"
        "Many years later, Alan Turing joined the University of Manchester, where he wrote about "
        "computing machinery. Turing admired the notes of Ada Lovelace.\n\n"
        "The Science Museum in London exhibits a reconstruction of the Difference Engine. "
        "Microsoft and IBM both sponsored exhibitions about the history of computing."
    )

    document = _ingest(workspace, "history.txt", prose)

    assert document.status == "processed", document.error
    entities = {entity.key: entity for entity in Entity.objects.filter(workspace=workspace)}
    assert entities["ada lovelace"].type == "person"
    assert entities["charles babbage"].type == "person"
    assert entities["university of manchester"].type == "organization"
    assert entities["ibm"].type == "organization"
    pair = Relation.objects.get(
        workspace=workspace,
        source__key__in=["ada lovelace", "charles babbage"],
        target__key__in=["ada lovelace", "charles babbage"],
    )
    assert "Ada Lovelace worked with Charles Babbage" in pair.description
    assert pair.weight == 1.0
    assert all(entity.embedding is not None and len(entity.embedding) == 384 for entity in entities.values())
    assert ChunkExtraction.objects.get(chunk__document=document).engine == "spacy"
    assert document.llm_calls == 0


def test_a_model_that_refuses_the_key_midway_leaves_nothing_behind_and_a_retry_gives_the_clean_graph(
    openai_double, settings
):
    settings.LLM_MAX_CONCURRENCY = 4  # batches of 8 chunks
    clean, broken = (small_chunks(make_workspace(slug=slug, gleaning_passes=0)) for slug in ("clean", "broken"))
    openai_double.reply(meetings)
    for workspace in (clean, broken):
        _ingest(workspace, "base.txt", parts("B"))
    answered = []

    def refusing_after_eight(body):
        answered.append(body)
        if len(answered) == 8:
            openai_double.fail(1000, status=401)
        return meetings(body)

    openai_double.reply(refusing_after_eight)
    document = _create(broken, "meetings.txt", parts())

    failed = ingestion.document_ingest(document_id=document.pk)

    assert failed.status == "failed"
    assert "LLM_API_KEY" in failed.error_detail
    assert failed.llm_calls == 8  # what it spent is counted, though nothing of it stays
    assert not Entity.objects.filter(workspace=broken, key__startswith="person a").exists()
    assert not EntitySource.objects.filter(chunk__document=document).exists()
    shared = Entity.objects.get(workspace=broken, key="shared person")
    assert "Person A00" not in shared.description
    openai_double._failures.clear()  # the key is fixed
    openai_double.reply(meetings)
    assert ingestion.document_retry(document=failed)

    assert ingestion.document_ingest(document_id=document.pk).status == "processed"

    _ingest(clean, "meetings.txt", parts())
    assert graph_dump(broken) == graph_dump(clean)


def test_a_deletion_while_the_model_is_down_converges_once_it_is_back(openai_double, settings):
    # Every description goes through a summary, even of one mention: with vectors made of names,
    # the summaries are what a deletion needs the model for.
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 0, 0
    settings.LLM_MAX_RETRIES = 1
    openai_double.reply(answer)
    workspace, alone = make_workspace(slug="both"), make_workspace(slug="alone")
    a = _ingest(workspace, "a.txt", DOC_A)
    _ingest(workspace, "b.txt", DOC_B)
    _ingest(alone, "b.txt", DOC_B)
    openai_double.fail(1000, status=503, message="the model is down")
    openai_double.fail(1000, status=503, path="/v1/embeddings", message="the model is down")
    openai_double.reply(lambda body: "Summary: fresh " + answer(body))  # nothing cached may be reused

    ingestion.document_delete(document=a)

    assert not Document.objects.filter(pk=a.pk).exists()  # the deletion itself is done
    rebuild = GraphRebuild.objects.get(workspace=workspace)
    assert "down" in rebuild.error
    assert rebuild.attempts == 1
    assert graph_dump(workspace) != graph_dump(alone)
    openai_double._failures.clear()
    openai_double.reply(answer)

    assert ingestion.graph_rebuild_run(rebuild_id=rebuild.pk)

    assert not GraphRebuild.objects.exists()
    assert graph_dump(workspace) == graph_dump(alone)


def test_an_entity_in_twenty_documents_is_summarized_each_time_its_new_mentions_cross_the_trigger(
    openai_double, workspace, settings
):
    settings.SUMMARY_TRIGGER = 8
    settings.SUMMARY_MIN_TOKENS = 0  # the mentions are short; the floor has a test of its own
    summary_inputs = []

    def script(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You merge descriptions"):
            facts = re.findall(r"^- (.*)$", user, flags=re.M)
            summary_inputs.append(facts)
            return f"Summary of {len(facts)} descriptions."
        if len(body["messages"]) > 2:
            return prompts.DONE_MARKER
        (number,) = re.findall(r"Report (\d+)", user)
        return f"entity<|>Hub<|>concept<|>Report {number} says something about the hub.\n{prompts.DONE_MARKER}"

    openai_double.reply(script)
    for number in range(1, 21):
        _ingest(workspace, f"report-{number}.txt", f"Report {number} mentions the hub.")

    # New mentions cross the trigger at report 9 and report 18; 19 and 20 wait below the summary.
    assert len(summary_inputs) == 2
    assert summary_inputs[1][0] == "Summary of 9 descriptions."
    every_input = [fact for facts in summary_inputs for fact in facts]
    for number in range(1, 19):
        assert every_input.count(f"Report {number} says something about the hub.") == 1
    hub = Entity.objects.get(workspace=workspace, key="hub")
    assert hub.description == (
        "Summary of 10 descriptions.\nReport 19 says something about the hub.\nReport 20 says something about the hub."
    )
    assert hub.summary == "Summary of 10 descriptions."


def test_many_short_mentions_wait_for_the_summary_floor_and_long_ones_do_not(openai_double, workspace, settings):
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 2, 80
    summaries = []

    def script(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You merge descriptions"):
            summaries.append(re.findall(r"^- (.*)$", user, flags=re.M))
            return "Summary."
        if len(body["messages"]) > 2:
            return prompts.DONE_MARKER
        (number,) = re.findall(r"Report (\d+)", user)
        padding = " and much more besides" * 15 if "long" in user else ""
        return f"entity<|>Hub<|>concept<|>Report {number} names the hub{padding}.\n{prompts.DONE_MARKER}"

    openai_double.reply(script)
    for number in range(1, 5):  # four short mentions (~8 tokens each): past the trigger, under the floor
        _ingest(workspace, f"report-{number}.txt", f"Report {number} mentions the hub.")
    assert summaries == []
    assert Entity.objects.get(workspace=workspace, key="hub").description.count("\n") == 3

    # One long mention carries the description past the floor: everything so far is folded once;
    # the next two are new mentions below the trigger again.
    for number in range(5, 8):
        _ingest(workspace, f"report-{number}.txt", f"Report {number} mentions the hub, long.")
    assert [len(fragments) for fragments in summaries] == [5]


def _graph_values(workspace) -> dict:
    entities = Entity.objects.filter(workspace=workspace).order_by("key")
    relations = Relation.objects.filter(workspace=workspace).order_by("pk")
    return {
        "entities": list(entities.values("key", "name", "type", "description", *SUMMARY_FIELDS)),
        "relations": list(relations.values("pk", "keywords", "weight", "description", *SUMMARY_FIELDS)),
    }


@pytest.mark.parametrize("summaries", [False, True], ids=["fragments", "summaries"])
def test_a_build_reads_only_the_sources_a_row_has_not_folded_and_gets_what_all_of_them_give(
    openai_double, workspace, settings, monkeypatch, summaries
):
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS, settings.SUMMARY_MAX_TOKENS = 3, 0, 60
    if not summaries:
        # The model extracts but is not asked to summarize: descriptions are cut to the budget.
        class Unsummarized:
            def __getattr__(self, name):
                return getattr(llm, name)

            def chat_model_configured(self):
                return False

        for module in (describe, provenance, rebuild):
            monkeypatch.setattr(module, "llm", Unsummarized())

    def script(body):
        system, user = body["messages"][0]["content"], body["messages"][-1]["content"]
        if system.startswith("You merge descriptions"):
            return f"Summary of {len(re.findall(r'^- ', user, flags=re.M))} descriptions."
        if len(body["messages"]) > 2:
            return prompts.DONE_MARKER
        (number,) = map(int, re.findall(r"Report (\d+)", user))
        # Two spellings and two types, the majority changing on the way; a pair seen every time.
        name, kind = ("HUB", "product") if number % 3 == 0 else ("Hub", "concept" if number < 9 else "location")
        return "\n".join(
            [
                f"entity<|>{name}<|>{kind}<|>Report {number} says something about the hub.",
                f"entity<|>Spoke<|>concept<|>Report {number} names the spoke.",
                f"relation<|>{name}<|>Spoke<|>link {number % 4}<|>Report {number} links them.<|>{number}",
                prompts.DONE_MARKER,
            ]
        )

    openai_double.reply(script)
    read = []
    real_source_rows, real_unfolded_rows = rebuild.source_rows, rebuild.unfolded_rows

    def counting(real):
        def wrapped(*args, **kwargs):
            found = real(*args, **kwargs)
            read.append(sum(map(len, found.values())))
            return found

        return wrapped

    monkeypatch.setattr(rebuild, "source_rows", counting(real_source_rows))
    monkeypatch.setattr(rebuild, "unfolded_rows", counting(real_unfolded_rows))
    for number in range(1, 13):
        read.clear()
        _ingest(workspace, f"report-{number}.txt", f"Report {number} mentions the hub.")

    # The twelfth build read its own two entity and one relation sources, not the 36 there are.
    assert sum(read) == 3
    hub = Entity.objects.get(workspace=workspace, key="hub")
    assert (hub.name, hub.type) == ("Hub", "concept")
    assert ("Summary of" in hub.description) == summaries
    assert hub.folded["cut"] == (not summaries)
    _assert_as_rebuilt_from_everything(workspace)

    # A deletion changes the provenance under the folds: the next build reads the hub whole.
    epoch = provenance_epoch(workspace.pk)
    ingestion.document_delete(document=Document.objects.get(workspace=workspace, title="report-5.txt"))
    assert provenance_epoch(workspace.pk) > epoch
    read.clear()
    _ingest(workspace, "report-13.txt", "Report 13 mentions the hub.")
    assert sum(read) == 3
    _assert_as_rebuilt_from_everything(workspace)


def _assert_as_rebuilt_from_everything(workspace) -> None:
    """Rebuilt from every source, unfolded, the rows come out the same, their folds included."""
    built = _graph_values(workspace)
    Entity.objects.filter(workspace=workspace).update(folded=None)
    Relation.objects.filter(workspace=workspace).update(folded=None)
    graph.rebuild_entities(entity_ids=Entity.objects.filter(workspace=workspace).values_list("pk", flat=True))
    graph.rebuild_relations(relation_ids=Relation.objects.filter(workspace=workspace).values_list("pk", flat=True))
    assert _graph_values(workspace) == built


def _run_until(document: Document, stage: str) -> Document:
    """Run a claimed document's steps in this process until it reaches `stage`."""
    owner = runs.worker_identity()
    current = steps.current(document.pk)
    if current.lease_owner != owner:
        assert runs._claim(owner, document.pk) == document.pk
        current = steps.current(document.pk)
    while current.stage != stage:
        current = steps.run_step(steps.next_step(current, owner), current, owner, lambda document: None)
    return current


def _served(workspace) -> dict:
    """What answers read of each published row: its text, numbers and vector."""
    entities = {
        key: (description, summary, type, list(vector))
        for key, description, summary, type, vector in Entity.objects.published()
        .filter(workspace=workspace)
        .values_list("key", "description", "summary", "type", "embedding")
    }
    relations = {
        tuple(sorted((source, target))): (keywords, description, weight, list(vector))
        for source, target, keywords, description, weight, vector in Relation.objects.published()
        .filter(workspace=workspace)
        .values_list("source__key", "target__key", "keywords", "description", "weight", "embedding")
    }
    return {"entities": entities, "relations": relations}


def test_a_shared_row_read_between_build_and_publish_keeps_its_published_text_and_vector(scripted, workspace, settings):
    # Summaries change the rows' descriptions at every document.
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 1, 0
    _ingest(workspace, "a.txt", DOC_A)
    before = _served(workspace)
    second = _create(workspace, "b.txt", DOC_B)

    _run_until(second, Document.Stage.PUBLISHING)

    assert _served(workspace) == before
    published = _run_until(second, Document.Stage.DONE)
    assert published.status == Document.Status.PROCESSED
    after = _served(workspace)
    assert after["entities"]["acme corp"][0] != before["entities"]["acme corp"][0]
    # A vector is the row's name (decision 0071), which a new description does not change.
    assert after["entities"]["acme corp"][3] == before["entities"]["acme corp"][3]
    assert "Acme Corp employs Bob Jones." in after["entities"]["acme corp"][0]
    assert after["relations"][("acme corp", "alice smith")][2] == 11.0


def test_a_document_that_fails_after_its_build_leaves_the_shared_rows_as_they_were(scripted, workspace, settings):
    settings.SUMMARY_TRIGGER, settings.SUMMARY_MIN_TOKENS = 1, 0
    _ingest(workspace, "a.txt", DOC_A)
    before = _served(workspace)
    settings.LLM_MAX_RETRIES = 1
    degrees = _degrees(workspace)
    second = _run_until(_create(workspace, "b.txt", DOC_B), Document.Stage.PUBLISHING)
    # The usual reason a document fails: the model is down, so the rebuild of what it touched waits.
    scripted.fail(1000, status=503, message="the model is down")
    scripted.fail(1000, status=503, path="/v1/embeddings", message="the model is down")

    ingestion.document_fail(document_id=second.pk, error="The model went away.")

    assert _served(workspace) == before
    assert _degrees(workspace) == degrees
    assert not PendingRow.objects.exists()


def _degrees(workspace) -> dict:
    return dict(EntityDegree.objects.filter(entity__workspace=workspace).values_list("entity__key", "degree"))


def test_degrees_after_a_failed_document_are_those_of_the_published_graph(scripted, workspace, settings):
    settings.LLM_MAX_RETRIES = 1
    _ingest(workspace, "a.txt", DOC_A)
    degrees = _degrees(workspace)
    second = _create(workspace, "b.txt", DOC_B)
    # B would add Bob Jones, and a relation to Acme Corp, raising its degree; it fails at extraction.
    scripted.fail(1000, status=400, message="the request was refused")

    failed = ingestion.document_ingest(document_id=second.pk)

    assert failed.status == Document.Status.FAILED
    assert _degrees(workspace) == degrees == {"acme corp": 2, "alice smith": 1, "berlin": 1}


def test_retry_brings_back_a_document_whose_lease_expired_while_processing(scripted, workspace):
    document = _run_until(_create(workspace, "a.txt", DOC_A), Document.Stage.EXTRACTING)
    # Its worker died: the lease ran out while the document still says "processing".
    Document.objects.filter(pk=document.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert Document.objects.get(pk=document.pk).status == Document.Status.PROCESSING

    assert ingestion.document_retry(document=document)

    document.refresh_from_db()
    assert (document.status, document.lease_owner, document.error) == (Document.Status.PENDING, "", "")
    assert ingestion.document_ingest(document_id=document.pk).status == Document.Status.PROCESSED
    assert set(graph_dump(workspace)["entities"]) == {"alice smith", "acme corp", "berlin"}


def test_a_broken_csv_fails_with_a_clear_message_and_leaves_nothing_in_the_graph(openai_double, workspace):
    # A field past the csv module's limit: what a CSV with a stray quote near its top looks like.
    document = _ingest(workspace, "broken.csv", 'name,notes\nAda,"never closed\n' + "x" * 200_000 + "\n")

    assert document.status == Document.Status.FAILED
    assert document.error == "broken.csv could not be read as CSV (field larger than field limit (131072))."
    assert not Chunk.objects.filter(document=document).exists()
    assert openai_double.chat_requests() == []


def test_an_unterminated_quote_in_a_csv_keeps_the_rest_of_the_file_as_its_field(scripted, workspace):
    document = _ingest(workspace, "notes.csv", 'name,notes\nAda,"never closed\nAlice Smith founded Acme Corp.\n')

    assert document.status == Document.Status.PROCESSED
    assert "Alice Smith founded Acme Corp." in Document.objects.get(pk=document.pk).text


def _pdf_stream_bomb() -> bytes:
    """One page with a font and a content stream of 80 MB of spaces, 78 kB compressed: past
    pypdf's 75 MB limit on what a stream may inflate to."""
    import io
    import zlib

    from pypdf import PdfWriter
    from pypdf.generic import DictionaryObject, NameObject, StreamObject

    writer = PdfWriter()
    page = writer.add_blank_page(100, 100)
    font = DictionaryObject(
        {
            NameObject("/Type"): NameObject("/Font"),
            NameObject("/Subtype"): NameObject("/Type1"),
            NameObject("/BaseFont"): NameObject("/Helvetica"),
        }
    )
    fonts = DictionaryObject({NameObject("/F1"): writer._add_object(font)})
    page[NameObject("/Resources")] = DictionaryObject({NameObject("/Font"): fonts})
    stream = StreamObject()
    stream._data = zlib.compress(b"BT /F1 12 Tf (Hi) Tj ET\n" + b" " * 80_000_000, 9)
    stream[NameObject("/Filter")] = NameObject("/FlateDecode")
    page[NameObject("/Contents")] = writer._add_object(stream)
    out = io.BytesIO()
    writer.write(out)
    return out.getvalue()


def test_a_pdf_stream_bomb_fails_the_document_with_a_clear_message(openai_double, workspace):
    document = ingestion.document_create(
        workspace=workspace, filename="bomb.pdf", data=_pdf_stream_bomb(), enqueue=False
    )

    failed = ingestion.document_ingest(document_id=document.pk)

    assert failed.status == Document.Status.FAILED
    assert failed.error == (
        "bomb.pdf holds a compressed stream that expands beyond what a PDF is allowed to here "
        "(a decompression bomb?); it was not read."
    )
    assert failed.error_detail == ""
    assert openai_double.chat_requests() == []


@pytest.fixture
def unloaded_models():
    from knowledge.rag import language, tokens

    for loader in (language._identifier, language._pipeline, tokens.encoding):
        loader.cache_clear()
    return language, tokens


# Transactional: preloading closes the connection, which a test's enclosing transaction would not survive.
@pytest.mark.django_db(transaction=True)
def test_a_worker_loads_what_runs_read_before_its_pool_forks(unloaded_models):
    language, tokens = unloaded_models
    ingestion.preload_models()
    assert language._identifier.cache_info().currsize == 1
    assert tokens.encoding.cache_info().currsize == 1
    # No chat model: spaCy extracts, with the default language's pipeline.
    assert language._pipeline.cache_info().currsize == 1
    assert connection.connection is None  # the pool's children open their own


def _environment_of_a_fork(name: str) -> str | None:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report and leave, running nothing of the test's
        os.write(write, (os.environ.get(name) or "-").encode())
        os._exit(0)
    os.close(write)
    os.waitpid(pid, 0)
    with os.fdopen(read) as reported:
        value = reported.read()
    return None if value == "-" else value


@pytest.fixture
def cores_unshared(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(llm, "_threads_per_child", None)  # restored afterwards: later forks keep every core


@pytest.mark.django_db(transaction=True)
def test_the_processes_a_worker_forks_share_the_cores_for_embedding(unloaded_models, cores_unshared, monkeypatch):
    cores = len(os.sched_getaffinity(0))
    ingestion.preload_models(processes=2)
    assert _environment_of_a_fork("OMP_NUM_THREADS") == str(max(1, cores // 2))
    assert "OMP_NUM_THREADS" not in os.environ  # the worker's main process keeps every core
    # An operator's own setting wins.
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert _environment_of_a_fork("OMP_NUM_THREADS") == "3"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("pool", "threads"), [("prefork", 1), ("threads", None), ("solo", None)])
def test_only_a_prefork_pool_shares_the_cores(unloaded_models, cores_unshared, monkeypatch, pool, threads):
    from knowledge import tasks

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    tasks._preload_models(sender=types.SimpleNamespace(pool_cls=pool, concurrency=2))
    assert llm._threads_per_child == threads


@pytest.mark.django_db(transaction=True)
def test_with_a_chat_model_the_spacy_pipeline_waits_for_its_first_use(unloaded_models, openai_double):
    language, _ = unloaded_models
    ingestion.preload_models()
    assert language._identifier.cache_info().currsize == 1
    assert language._pipeline.cache_info().currsize == 0
