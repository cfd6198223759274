"""Channel-layer events: ingestion progress for everyone watching a workspace."""

import logging

from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from django.db import transaction

logger = logging.getLogger(__name__)


def workspace_group(workspace_id: int) -> str:
    return f"workspace-{workspace_id}"


def document_payload(document) -> dict:
    return {
        "id": document.pk,
        "title": document.title,
        "status": document.status,
        "chunks_done": document.chunks_done,
        "chunk_count": document.chunk_count,
        "entity_count": document.entity_count,
        "relation_count": document.relation_count,
        "prompt_tokens": document.prompt_tokens,
        "completion_tokens": document.completion_tokens,
        "error": document.error,
    }


def publish_document_progress(document) -> None:
    """Tell the workspace's group where this document stands, once the change is committed."""
    group = workspace_group(document.workspace_id)
    event = {"type": "document.progress", "document": document_payload(document)}
    transaction.on_commit(lambda: _send(group, event))


def _send(group: str, event: dict) -> None:
    layer = get_channel_layer()
    if layer is None:
        return
    try:
        async_to_sync(layer.group_send)(group, event)
    except Exception:
        # Progress is a courtesy to whoever is watching; a Redis hiccup must not fail an ingestion.
        logger.warning("could not publish progress to %s", group, exc_info=True)
