"""Celery tasks: thin wrappers over knowledge.services.ingestion, which owns leases, turns and retries.

`ingest_next` is a wake-up, not an order: it runs one turn on whichever document is due. Uploads
send one, a turn that leaves work sends another, and the sweeper (Celery beat, every
INGEST_SWEEP_SECONDS) sends what is missing, so a lost or duplicated message costs nothing.

A stopping worker (Ctrl-C on `make run`, a deploy) finishes the step at hand and gives its
document back: the main process sets a flag on `worker_shutting_down` that the pool's
processes, forked after it was created, read between steps. The main process also loads the
models every run reads before the pool forks (ingestion.preload_models).
"""

import logging
import multiprocessing

from celery import concurrency, shared_task
from celery.concurrency import prefork
from celery.signals import worker_init, worker_ready, worker_shutting_down

from knowledge.services import ingestion, model_endpoints, sources

logger = logging.getLogger(__name__)

_stopping = None


@worker_init.connect
def _create_stop_flag(**kwargs) -> None:
    global _stopping
    _stopping = multiprocessing.Event()


@worker_init.connect
def _preload_models(sender, **kwargs) -> None:
    # The prefork pool's processes embed at the same time; a thread pool's threads take turns
    # on one model, which keeps every core.
    forks = issubclass(concurrency.get_implementation(sender.pool_cls), prefork.TaskPool)
    ingestion.preload_models(processes=sender.concurrency if forks and isinstance(sender.concurrency, int) else None)


@worker_shutting_down.connect
def _ask_runs_to_stop(**kwargs) -> None:
    if _stopping is not None:
        _stopping.set()


@worker_ready.connect
def _take_over_dead_runs(**kwargs) -> None:
    released = ingestion.release_dead_leases()
    if released:
        logger.info("took over %d document(s) whose run died on this host", released)
    ingestion.sweep()


def stop_requested() -> bool:
    return _stopping is not None and _stopping.is_set()


@shared_task(acks_late=True, reject_on_worker_lost=True)
def ingest_next() -> int | None:
    return ingestion.ingest_next(stop=stop_requested)


@shared_task
def sweep() -> dict:
    return ingestion.sweep()


@shared_task(acks_late=True, reject_on_worker_lost=True)
def rebuild_graph(rebuild_id: int) -> bool:
    return ingestion.graph_rebuild_run(rebuild_id=rebuild_id)


@shared_task(acks_late=True, reject_on_worker_lost=True)
def reembed_all(reembedding_id: int) -> str:
    return model_endpoints.reembedding_run(reembedding_id=reembedding_id).status


@shared_task
def sync_due_sources() -> list[int]:
    return sources.sources_claim_due()


@shared_task(acks_late=True, reject_on_worker_lost=True)
def sync_source(source_id: int) -> None:
    sources.source_sync(source_id=source_id)
