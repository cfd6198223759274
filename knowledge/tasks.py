"""Celery tasks: thin wrappers that own the retry policy; the work is in knowledge.ingestion.

Redelivery after a worker crash (acks_late): the document is still `processing` with a recent
heartbeat, so the claim fails. The task then retries itself after the stale window
(ingestion.ingest_stale_after); by then a live worker would have refreshed the heartbeat, so
only a dead run's document is taken over, and the resumed run skips what was already done.
"""

import logging

from celery import shared_task
from django.conf import settings

from knowledge import ingestion
from knowledge.models import Document

logger = logging.getLogger(__name__)

MAX_RETRIES = 6
RETRY_BACKOFF_SECONDS = 60


@shared_task(
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=MAX_RETRIES,
    time_limit=settings.CELERY_TASK_TIME_LIMIT,
    soft_time_limit=settings.CELERY_TASK_SOFT_TIME_LIMIT,
)
def ingest_document(self, document_id: int) -> str:
    try:
        document = ingestion.document_ingest(document_id=document_id)
    except ingestion.IngestInterrupted as err:
        if self.request.retries >= self.max_retries:
            ingestion.document_fail(document_id=document_id, error=f"{err} (gave up after {self.max_retries} retries)")
            return "failed"
        raise self.retry(exc=err, countdown=RETRY_BACKOFF_SECONDS * 2**self.request.retries) from err
    if document is not None:
        return document.status
    status = Document.objects.filter(pk=document_id).values_list("status", flat=True).first()
    if status == Document.Status.PROCESSING and self.request.retries < self.max_retries:
        # Someone holds it: a live worker (this is a duplicate) or a dead one (come back once it is stale).
        raise self.retry(countdown=int(ingestion.ingest_stale_after().total_seconds()) + 5)
    return status or "deleted"
