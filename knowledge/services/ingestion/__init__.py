"""Documents and their ingestion: upload, the runs that turn a document into graph rows, failure,
retry and deletion. Views, Celery tasks and management commands call these services.

How a document is ingested (knowledge/services/ingestion/runs.py and steps.py):

- An upload stores the file and queues the document; the worker reads it (parsing is bounded
  and never happens in the upload request).
- A run holds its document with a lease, which a heartbeat extends while the run is alive. A run
  that died (kill -9 of the worker or its pool child, a reboot) stops extending it; once it
  expires any worker may claim the document, and the sweeper (Celery beat) or a starting worker
  wakes one. Redis' visibility timeout decides nothing.
- Runs take turns: a run works for at most INGEST_SLICE_SECONDS, then gives its document back;
  the claimable document whose turn came first goes next, so a small document is never stuck
  behind a large one. Every step is checkpointed (chunks, vectors waiting to be published,
  extraction records, merged batches), so the next turn continues where this one stopped.
- A turn takes the next new small documents of its first one's workspace with it: each parsed
  alone, then embedded, extracted, built and published together; whatever fails goes on alone.
- Nothing is half-visible: the graph rows a document creates are unpublished until the document
  is, and one transaction publishes the chunks' vectors, its new rows and their vectors.
- A failed document leaves no trace in the graph: its provenance goes, rows only it supported
  go, and the rows it touched are rebuilt from what remains (GraphRebuild, retried until done).

The Celery tasks are named, not imported, so this package and knowledge.tasks (which imports it)
do not import each other.
"""

from knowledge.services.ingestion.cleanup import (
    document_delete,
    document_fail,
    documents_delete,
    graph_rebuild_run,
)
from knowledge.services.ingestion.runs import (
    IngestInterrupted,
    document_ingest,
    document_retry,
    documents_ingest,
    ingest_next,
    preload_models,
    release_dead_leases,
    sweep,
    worker_identity,
)
from knowledge.services.ingestion.steps import chunk_embedding_text
from knowledge.services.ingestion.uploads import (
    DocumentRejected,
    check_upload_size,
    document_create,
    upload_limit_bytes,
    wake_workers,
)
from knowledge.services.ingestion.versions import VersionRefused, version_prune, versions_of

__all__ = [
    "DocumentRejected",
    "VersionRefused",
    "IngestInterrupted",
    "check_upload_size",
    "chunk_embedding_text",
    "document_create",
    "document_delete",
    "document_fail",
    "document_ingest",
    "document_retry",
    "documents_delete",
    "documents_ingest",
    "graph_rebuild_run",
    "ingest_next",
    "preload_models",
    "release_dead_leases",
    "sweep",
    "upload_limit_bytes",
    "version_prune",
    "versions_of",
    "wake_workers",
    "worker_identity",
]
