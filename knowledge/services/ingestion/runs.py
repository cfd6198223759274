"""Runs: leases, heartbeats, turns, and what happens when a run stops for any reason.

A run claims a document with one conditional UPDATE that sets its lease (zero rows: someone
else holds it, or it is not due). While the run works, a heartbeat thread extends the lease;
every step also checks the lease in its own transaction, so a run that lost it (it stalled
past the expiry and someone took over) writes nothing more.
"""

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import psutil
import redis
from celery import current_app
from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import (
    DatabaseError,
    InterfaceError,
    OperationalError,
    close_old_connections,
    connection,
    connections,
    transaction,
)
from django.db.models import Q
from django.utils import timezone

from knowledge import metrics
from knowledge.models import Document, GraphRebuild
from knowledge.rag import extraction, graph, language, llm, parsing, tokens
from knowledge.services.ingestion import cleanup, steps
from knowledge.services.ingestion.steps import DocumentGone, LeaseLost, Step, lease_expiry
from knowledge.services.ingestion.uploads import INGEST_TASK, wake_workers

logger = logging.getLogger(__name__)

REBUILD_TASK = "knowledge.tasks.rebuild_graph"
# Wake-ups the sweeper keeps queued at most: enough for every worker process to find work.
MAX_QUEUED_WAKEUPS = 8


class IngestInterrupted(Exception):
    """A run stopped on a transient error (model or database unreachable); the document waits for
    its next turn after a backoff and fails only after INGEST_MAX_ATTEMPTS such errors in a row.
    `str(err)` is the detail for owners and operators; `public` what every member may read."""

    def __init__(self, message: str, *, public: str):
        super().__init__(message)
        self.public = public


def _started(process: psutil.Process) -> int:
    """When the process started, in hundredths of a second since the epoch (the kernel's clock
    ticks): with the pid, it names one process, where a pid alone is reused by the next
    container or the next boot."""
    return round(process.create_time() * 100)


def worker_identity() -> str:
    """host:pid:start, what a lease names as its owner."""
    return f"{socket.gethostname()}:{os.getpid()}:{_started(psutil.Process())}"


def _claimable() -> Q:
    now = timezone.now()
    return (
        Q(status__in=[Document.Status.PENDING, Document.Status.PROCESSING], next_attempt_at__lte=now)
        & (Q(lease_expires_at__isnull=True) | Q(lease_expires_at__lt=now))
        & ~Q(stage=Document.Stage.DONE)
    )


_CLAIM_SQL = """
WITH picked AS (
    -- A lease still set but run out: the run that held it died, and this claim takes it over.
    SELECT id, lease_expires_at IS NOT NULL AS taken_over FROM knowledge_document
    WHERE status IN ('pending', 'processing') AND stage <> 'done' AND next_attempt_at <= %(now)s
      AND (lease_expires_at IS NULL OR lease_expires_at < %(now)s) AND (%(id)s::bigint IS NULL OR id = %(id)s)
      AND (%(workspace)s::bigint IS NULL OR (workspace_id = %(workspace)s AND {groupable}))
    ORDER BY next_attempt_at, id
    LIMIT %(limit)s
    -- Two workers claiming at once take different documents instead of waiting for each other.
    FOR UPDATE SKIP LOCKED
)
UPDATE knowledge_document AS document
SET status = 'processing', lease_owner = %(owner)s, lease_expires_at = %(expiry)s
FROM picked WHERE document.id = picked.id
RETURNING document.id, picked.taken_over, document.workspace_id, {groupable}
"""
# Who may run with others (decision 0176): a new document, not a version (its build leaves out
# the version it retires, which the others' would not); one whose runs have not failed (its
# failures stay its own); a small one, whose chunks fit in one embedding step and in the smallest
# extraction batch (0: not parsed yet), so that a group holds none of its documents back for long.
_GROUPABLE = "replaces_id IS NULL AND attempts = 0 AND token_count <= %(tokens)s AND chunk_count <= %(chunks)s"
GROUP_DOCUMENT_TOKENS = steps.EMBED_STEP_TOKENS


def _small(document: Document) -> bool:
    return document.token_count <= GROUP_DOCUMENT_TOKENS and document.chunk_count <= steps.EXTRACT_STEP_CHUNKS


def _claim_rows(
    owner: str, *, document_id: int | None = None, workspace_id: int | None = None, limit: int = 1
) -> list[tuple[int, int, bool]]:
    """Lease the given document, or up to `limit` claimable ones whose turn came first (with
    `workspace_id`, only those of it that may run together); (id, workspace id, may run
    together) of each."""
    params = {
        "owner": owner,
        "expiry": lease_expiry(),
        "now": timezone.now(),
        "id": document_id,
        "workspace": workspace_id,
        "tokens": GROUP_DOCUMENT_TOKENS,
        "chunks": steps.EXTRACT_STEP_CHUNKS,
        "limit": limit,
    }
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL.format(groupable=_GROUPABLE), params)
        rows = cursor.fetchall()
    taken_over = sum(1 for row in rows if row[1])
    if taken_over:
        metrics.count(metrics.SWEEPER_TAKEOVERS, taken_over, how="lease_expired")
    return [(pk, workspace, groupable) for pk, _, workspace, groupable in rows]


def _claim(owner: str, document_id: int | None = None) -> int | None:
    """Lease the given document, or the claimable one whose turn came first; its id or None."""
    rows = _claim_rows(owner, document_id=document_id)
    return rows[0][0] if rows else None


def _claim_group(owner: str) -> list[int]:
    """Lease the claimable document whose turn came first and, when it may run with others, the
    next ones of its workspace that may, up to INGEST_GROUP_DOCUMENTS; their ids, first first."""
    rows = _claim_rows(owner)
    if not rows:
        return []
    document_id, workspace_id, groupable = rows[0]
    if not groupable or settings.INGEST_GROUP_DOCUMENTS < 2:
        return [document_id]
    more = _claim_rows(owner, workspace_id=workspace_id, limit=settings.INGEST_GROUP_DOCUMENTS - 1)
    return [document_id, *(pk for pk, _, _ in more)]


def _release(document_id: int, owner: str, *, delay: float = 0.0, **fields) -> None:
    """Give the document back: its next turn comes after everyone already waiting (or after `delay`)."""
    Document.objects.filter(pk=document_id, lease_owner=owner).update(
        lease_owner="",
        lease_expires_at=None,
        next_attempt_at=timezone.now() + timedelta(seconds=delay),
        **fields,
    )


class _Heartbeat(threading.Thread):
    """Extends the leases of a run's documents every third of their length until stopped; notes
    when one of them is lost, and goes on extending the others."""

    def __init__(self, document_ids: list[int], owner: str):
        super().__init__(name=f"lease-{document_ids[0]}", daemon=True)
        self.document_ids, self.owner = set(document_ids), owner
        self.lost = False
        self._stop_event = threading.Event()

    def run(self):
        interval = settings.INGEST_LEASE_SECONDS / 3
        try:
            while self.document_ids and not self._stop_event.wait(interval):
                held = Document.objects.filter(pk__in=self.document_ids, lease_owner=self.owner)
                try:
                    extended = held.update(lease_expires_at=lease_expiry())
                    if extended < len(self.document_ids):
                        # Another run holds one now, or, unseen from this connection, it was
                        # deleted, which the run finds out by itself.
                        missing = self.document_ids - set(held.values_list("pk", flat=True))
                        self.lost = self.lost or Document.objects.filter(pk__in=missing).exists()
                        self.document_ids -= missing
                except DatabaseError:
                    # The database is away: the run's own next step will find out; try again later.
                    logger.warning("could not extend the leases of documents %s", self.document_ids, exc_info=True)
                    close_old_connections()
        finally:
            connection.close()

    def stop(self):
        self._stop_event.set()
        self.join()


def _never() -> bool:
    return False


def _run(
    document_id: int,
    owner: str,
    *,
    seconds: float | None,
    stop: Callable[[], bool],
    progress: Callable[[Document], None],
) -> Document | None:
    """Work on a leased document until it is done, its turn is over, or it cannot go on.

    Returns the document as it stands (None when it was deleted meanwhile). A transient failure
    puts it back with a backoff and raises IngestInterrupted; any other failure fails it.
    """
    deadline = None if seconds is None else time.monotonic() + seconds
    heartbeat = _Heartbeat([document_id], owner)
    heartbeat.start()
    try:
        with steps.unflushed_commits():
            document = steps.current(document_id)
            while True:
                if heartbeat.lost:
                    raise LeaseLost
                step = steps.next_step(document, owner)
                if step is Step.DONE:
                    break
                document = steps.run_step(step, document, owner, progress)
                if stop() or (deadline is not None and time.monotonic() >= deadline):
                    _release(document_id, owner)
                    break
    except KeyboardInterrupt:
        # Ctrl-C on the `ingest` command: the next run continues where this one stopped.
        _release(document_id, owner)
        raise
    except Exception as err:
        return _stopped(document_id, owner, err)
    finally:
        heartbeat.stop()
    return Document.objects.filter(pk=document_id).first()


def _stopped(document_id: int, owner: str, err: Exception) -> Document | None:
    """What a run that stopped on `err` leaves of its document, as it then stands (None when it
    was deleted): taken over or deleted, nothing more; a transient failure puts it back with a
    backoff and raises IngestInterrupted; any other failure fails it."""
    if isinstance(err, (DocumentGone, LeaseLost)):
        return Document.objects.filter(pk=document_id).first()
    if isinstance(err, (llm.LLMError, OperationalError, InterfaceError, SoftTimeLimitExceeded)):
        if isinstance(err, llm.LLMError) and not err.transient:
            logger.warning("ingestion of document %s failed: %s", document_id, err)
            return cleanup.document_fail(document_id=document_id, error=err.public, detail=str(err))
        _interrupted(document_id, owner, err)
    if isinstance(err, (parsing.ParseError, steps.DocumentRefused)):
        return cleanup.document_fail(document_id=document_id, error=str(err))
    if not Document.objects.filter(pk=document_id).exists():
        return None
    logger.error("ingestion of document %s failed", document_id, exc_info=err)
    return cleanup.document_fail(
        document_id=document_id,
        error="Ingestion failed unexpectedly; the error was logged. Retry it; if it fails again, tell an owner.",
        detail=llm.redact(f"{err.__class__.__name__}: {err}"),
    )


def _describe_interruption(err: Exception) -> tuple[str, str]:
    """(the detail, what every member may read)."""
    if isinstance(err, llm.LLMError):
        return str(err), err.public
    if isinstance(err, SoftTimeLimitExceeded):
        message = "A step took longer than CELERY_TASK_TIME_LIMIT allows."
        return message, message
    # The driver's message names the database host; members only learn that it failed.
    return llm.redact(f"The database connection failed: {err}"), "The database connection failed."


def _interrupted(document_id: int, owner: str, err: Exception) -> None:
    message, public = _describe_interruption(err)
    logger.warning("ingestion of document %s interrupted: %s", document_id, message)
    try:
        if not connection.in_atomic_block:
            # A connection broken by a database restart is replaced rather than reused.
            close_old_connections()
        attempts = (Document.objects.filter(pk=document_id).values_list("attempts", flat=True).first() or 0) + 1
        if attempts > settings.INGEST_MAX_ATTEMPTS:
            gave_up = f" (gave up after {settings.INGEST_MAX_ATTEMPTS} attempts; Retry when it is fixed)"
            cleanup.document_fail(document_id=document_id, error=public + gave_up, detail=message + gave_up)
        else:
            delay = settings.INGEST_RETRY_BACKOFF * 2 ** (attempts - 1)
            _release(
                document_id,
                owner,
                delay=delay,
                status=Document.Status.PENDING,
                attempts=attempts,
                error=f"Interrupted, will retry in {delay:.0f} s: {public}",
                error_detail=message,
            )
            steps.announce(document_id)
    except DatabaseError:
        # The lease expires by itself and the sweeper brings the document back.
        logger.warning("could not put document %s back after: %s", document_id, message, exc_info=True)
    raise IngestInterrupted(message, public=public) from err


def _run_together(document_ids: list[int], owner: str, *, seconds: float | None, stop: Callable[[], bool]) -> None:
    """Work on several leased documents of one workspace at once (decision 0176): each parsed
    alone, then the small ones taken through every other step together, until they are
    published, their turn is over, or a step fails. Whatever is left then goes on alone, where
    each one's failures are its own: a group only saves work, it never decides an outcome."""
    deadline = None if seconds is None else time.monotonic() + seconds
    heartbeat = _Heartbeat(document_ids, owner)
    heartbeat.start()
    try:
        with steps.unflushed_commits():
            together, alone = _parse_each(document_ids, owner)
            if len(together) > 1:
                together = _steps_together(together, owner, heartbeat, lambda: _over(deadline, stop))
        for document in together + alone:
            if _over(deadline, stop):
                _release(document.pk, owner)
                continue
            try:
                _run(
                    document.pk,
                    owner,
                    seconds=None if deadline is None else max(0.0, deadline - time.monotonic()),
                    stop=stop,
                    progress=lambda document: None,
                )
            except IngestInterrupted:
                logger.warning("document %s interrupted; it gets another turn after a backoff", document.pk)
    except KeyboardInterrupt:
        # Ctrl-C: the next runs continue where this one stopped.
        for document_id in document_ids:
            _release(document_id, owner)
        raise
    finally:
        heartbeat.stop()


def _over(deadline: float | None, stop: Callable[[], bool]) -> bool:
    return stop() or (deadline is not None and time.monotonic() >= deadline)


def _parse_each(document_ids: list[int], owner: str) -> tuple[list[Document], list[Document]]:
    """Parse the documents that need it, each alone (a file that cannot be read fails alone);
    (those small enough to go on together, in id order, the others) among the ones still held."""
    together, alone = [], []
    for document_id in sorted(document_ids):
        document = steps.current(document_id)
        try:
            while document is not None and document.stage in (Document.Stage.QUEUED, Document.Stage.PARSING):
                document = steps.run_step(steps.next_step(document, owner), document, owner, lambda document: None)
        except Exception as err:
            with contextlib.suppress(IngestInterrupted):  # back in the queue after its backoff
                _stopped(document_id, owner, err)
            continue
        if document is None or document.lease_owner != owner or document.stage == Document.Stage.DONE:
            continue  # deleted or taken over
        (together if _small(document) else alone).append(document)
    return together, alone


_STAGES = list(Document.Stage.values)


def _steps_together(
    documents: list[Document], owner: str, heartbeat: _Heartbeat, over: Callable[[], bool]
) -> list[Document]:
    """Take the documents through their steps together, those at the earliest stage first, until
    all are published; the ones left to go on alone (after a failure, or when one was lost)."""
    group = [document.pk for document in documents]
    try:
        while waiting := [document for document in documents if document.stage != Document.Stage.DONE]:
            if heartbeat.lost:
                raise LeaseLost
            earliest = min(_STAGES.index(document.stage) for document in waiting)
            at = [document for document in waiting if _STAGES.index(document.stage) == earliest]
            steps.run_together(steps.next_step(at[0], owner), at, owner, group=group)
            if over():
                for document in documents:
                    if document.stage != Document.Stage.DONE:
                        _release(document.pk, owner)
                return []
        return []
    except SoftTimeLimitExceeded as err:
        for document in waiting:
            with contextlib.suppress(IngestInterrupted):
                _interrupted(document.pk, owner, err)
        return []
    except Exception:
        # Which of them it concerns is for each one's own run to find out.
        logger.warning("documents %s could not go on together; each goes on alone", group, exc_info=True)
        if not connection.in_atomic_block:
            # A connection the failure broke is replaced rather than reused.
            close_old_connections()
        return documents


def ingest_next(*, owner: str | None = None, stop: Callable[[], bool] = _never) -> int | None:
    """One turn: claim the document whose turn came first (and, when they may run together, the
    next new small ones of its workspace) and work on it for one slice.

    Returns the id of the document worked on first (None when nothing was due). Wakes another
    turn when work remains, once it holds its documents and again when it gives them back, so a
    queue of documents keeps every worker busy.
    """
    owner = owner or worker_identity()
    document_ids = _claim_group(owner)
    if not document_ids:
        return None
    _wake_another_if_work_waits()
    try:
        if len(document_ids) > 1:
            _run_together(document_ids, owner, seconds=settings.INGEST_SLICE_SECONDS, stop=stop)
        else:
            _run(
                document_ids[0],
                owner,
                seconds=settings.INGEST_SLICE_SECONDS,
                stop=stop,
                progress=lambda document: None,
            )
    except IngestInterrupted:
        logger.warning("document %s interrupted; it gets another turn after a backoff", document_ids[0])
    finally:
        _wake_another_if_work_waits()
    return document_ids[0]


def preload_models(*, processes: int | None = None) -> None:
    """Load what every run reads (the language identifier, the tokenizer and, when spaCy
    extracts, the default language's pipeline) in a worker's main process before its pool forks:
    each child starts with them, shared copy-on-write, instead of loading its own at its first
    document (decision 0171). Not the embedding model: its OpenMP threads must not exist before
    a fork. Given how many `processes` the pool forks, each one's embedded model gets its share
    of the cores (decision 0172)."""
    if processes is not None:
        llm.share_cores(processes)
    language.load_models(pipeline=extraction.engine_name() == "spacy")
    tokens.encoding()
    # Asking which engine extracts may have opened a connection the children must not share.
    connections.close_all()


def _wake_another_if_work_waits() -> None:
    """Wake a worker when documents wait and no wake-up is queued for them.

    Waking only at the end of a turn is not enough: a wake-up can find nothing, its claim
    looking just before another document commits while a second worker takes the one it saw,
    and that document would wait beside an idle worker until a slice ends. A wake-up already
    queued will claim whatever is due, so a second one would only cost a query."""
    try:
        if not _queued_wakeups() and Document.objects.filter(_claimable()).exists():
            current_app.send_task(INGEST_TASK)
    except DatabaseError:
        logger.warning("could not look for more work; the sweeper will", exc_info=True)


def document_ingest(*, document_id: int, progress: Callable[[Document], None] | None = None) -> Document | None:
    """Run the whole pipeline for one document in this process (the `ingest` command, tests).

    Claims the document first; returns None when there is nothing to claim (another run holds
    it, or it is done or deleted). Raises IngestInterrupted on a transient failure (the document
    waits for a later turn); any other failure leaves it failed with the reason.
    """
    owner = worker_identity()
    if _claim(owner, document_id) is None:
        return None
    return _run(document_id, owner, seconds=None, stop=_never, progress=progress or (lambda document: None))


def documents_ingest(*, document_ids: list[int]) -> list[Document | None]:
    """Run these documents (at most INGEST_GROUP_DOCUMENTS) to the end in this process, together
    where they may be, as a turn would (benchmarks drive ingestion with this). Each one as it then
    stands (None when it was deleted); one that was interrupted waits for a later turn."""
    owner = worker_identity()
    claimed = [row for document_id in document_ids for row in _claim_rows(owner, document_id=document_id)]
    groupable = [pk for pk, workspace_id, may in claimed if may and workspace_id == claimed[0][1]]
    groupable = groupable[: settings.INGEST_GROUP_DOCUMENTS]
    alone = [pk for pk, _, _ in claimed if pk not in groupable or len(groupable) < 2]
    if len(groupable) > 1:
        _run_together(groupable, owner, seconds=None, stop=_never)
    for document_id in alone:
        try:
            _run(document_id, owner, seconds=None, stop=_never, progress=lambda document: None)
        except IngestInterrupted:
            logger.warning("document %s interrupted; it gets another turn after a backoff", document_id)
    found = Document.objects.defer("text").in_bulk(document_ids)
    return [found.get(document_id) for document_id in document_ids]


def document_retry(*, document: Document) -> bool:
    """Queue a failed document again, or one whose run died (its lease expired)."""
    now = timezone.now()
    dead = Q(status=Document.Status.PROCESSING, lease_expires_at__lt=now) | Q(
        status=Document.Status.PROCESSING, lease_expires_at__isnull=True
    )
    with transaction.atomic():
        requeued = (
            Document.objects.filter(pk=document.pk)
            .filter(Q(status=Document.Status.FAILED) | dead | Q(status=Document.Status.PENDING))
            .update(
                status=Document.Status.PENDING,
                error="",
                error_detail="",
                attempts=0,
                next_attempt_at=now,
                lease_owner="",
                lease_expires_at=None,
            )
        )
        if requeued:
            wake_workers()
            steps.announce(document.pk)
    return bool(requeued)


def release_dead_leases(hostname: str | None = None) -> int:
    """Expire at once the leases of runs on this host whose process is gone (a worker restarting
    after a crash does not wait for them to run out)."""
    hostname = hostname or socket.gethostname()
    dead = []
    for document_id, owner in Document.objects.filter(lease_owner__startswith=f"{hostname}:").values_list(
        "pk", "lease_owner"
    ):
        pid, _, started = owner[len(hostname) + 1 :].partition(":")
        if pid.isdigit() and not _process_alive(int(pid), int(started) if started.isdigit() else None):
            dead.append(document_id)
    if dead:
        Document.objects.filter(pk__in=dead).update(lease_owner="", lease_expires_at=None)
        metrics.count(metrics.SWEEPER_TAKEOVERS, len(dead), how="process_gone")
    return len(dead)


def _process_alive(pid: int, started: int | None) -> bool:
    """Is the process that took the lease still running? A process with its pid but another
    start time is a stranger (a restarted container reuses pids from 1); a lease of an older
    version (no start time) trusts the pid."""
    # A killed pool process stays a zombie until its new parent, PID 1 once the worker's main
    # process died with it, reaps it; a signal still reaches a zombie, so only its state tells.
    try:
        process = psutil.Process(pid)
        if started is not None and _started(process) != started:
            return False
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True


def _queued_wakeups() -> int:
    """How many turns wait in the broker's queue (Redis), or 0 when it cannot be told."""
    url = settings.CELERY_BROKER_URL
    if not url.startswith(("redis://", "rediss://")):
        return 0
    try:
        return int(redis.Redis.from_url(url, socket_timeout=2).llen("celery"))
    except redis.RedisError:
        return 0


def sweep() -> dict[str, int]:
    """Wake workers for documents that are due (a run died, a backoff ended, a wake-up was lost),
    queue the graph rebuilds that are due and run the synonym searches left behind. Runs every
    INGEST_SWEEP_SECONDS (Celery beat) and when a worker starts."""
    due = Document.objects.filter(_claimable()).count()
    wakeups = max(0, min(due, MAX_QUEUED_WAKEUPS) - _queued_wakeups())
    for _ in range(wakeups):
        current_app.send_task(INGEST_TASK)
    now = timezone.now()
    rebuilds = list(GraphRebuild.objects.filter(next_attempt_at__lte=now).values_list("pk", flat=True)[:20])
    # Pushed back while queued, so the next sweep does not queue them twice.
    GraphRebuild.objects.filter(pk__in=rebuilds).update(
        next_attempt_at=now + timedelta(seconds=settings.INGEST_LEASE_SECONDS * 5)
    )
    for rebuild_id in rebuilds:
        current_app.send_task(REBUILD_TASK, args=[rebuild_id])
    # Those of entities whose publisher died before it could search (graph.synonyms).
    synonyms = graph.run_synonym_searches(due_before=now)
    return {"due_documents": due, "wakeups": wakeups, "rebuilds": len(rebuilds), "synonym_searches": synonyms}
