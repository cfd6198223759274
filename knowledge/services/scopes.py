"""Tags and the enabled flag of documents: what a question can be scoped to, and what no question reads.

Retrieval applies them (knowledge/rag/retrieval/scope.py); this module writes them.
"""

from django.db import transaction
from django.db.models import Count, Q

from knowledge.models import Document, Workspace
from knowledge.rag.retrieval.scope import TAG_MAX_CHARS, normalize_tag
from knowledge.services.workspaces import audit_record

TAGS_PER_DOCUMENT = 20
# Model names carry a tag after "/" and a mode after ":" (knowledge/api/protocols.py); a comma
# separates tags where people type them.
_RESERVED = set("/:,")


class TagsInvalid(Exception):
    """Tags that cannot be stored; `str(err)` is shown as is."""


def parse_tags(text: str) -> list[str]:
    """Tags typed as "Handbook, legal": normalized, without repeats, in the order given."""
    tags = list(dict.fromkeys(normalize_tag(part) for part in text.split(",") if part.strip()))
    for tag in tags:
        if _RESERVED & set(tag):
            raise TagsInvalid(f"“{tag}”: a tag cannot contain “/” or “:”.")
    if any(len(" ".join(part.split())) > TAG_MAX_CHARS for part in text.split(",")):
        raise TagsInvalid(f"A tag has at most {TAG_MAX_CHARS} characters.")
    if len(tags) > TAGS_PER_DOCUMENT:
        raise TagsInvalid(f"A document has at most {TAGS_PER_DOCUMENT} tags.")
    return tags


def document_label(*, document: Document, tags: list[str], enabled: bool, actor=None) -> Document:
    """Set a document's tags and whether questions read it; the workspace's count of disabled
    documents changes in the same transaction, so retrieval's filter is never missing."""
    with transaction.atomic():
        Document.objects.filter(pk=document.pk).update(tags=tags, enabled=enabled)
        _count_disabled(document.workspace_id)
        audit_record(
            workspace=document.workspace,
            actor=actor,
            action="document.label",
            summary=f"“{document.title}”: tags {', '.join(tags) or 'none'}, {'enabled' if enabled else 'disabled'}",
            detail={"document_id": document.pk, "tags": tags, "enabled": enabled},
        )
    document.tags, document.enabled = tags, enabled
    return document


def _count_disabled(workspace_id: int) -> None:
    disabled = (
        Document.objects.current()
        .filter(workspace_id=workspace_id)
        .aggregate(n=Count("pk", filter=Q(enabled=False)))["n"]
    )
    Workspace.objects.filter(pk=workspace_id).update(disabled_documents=disabled)
