"""Which documents a question may read: a scope of tags and documents, and the enabled flag.

The scope is a filter clause inside each search's own SQL (searches.py), never a query of its
own, so a question costs the same number of queries scoped or not. Chunks are filtered by their
document; entities and relations by their provenance: a row is in scope when a chunk of an
in-scope document supports it. With no scope and no disabled document in the workspace, no
clause is added at all (docs/asking.md, "Scopes").
"""

from collections.abc import Mapping
from dataclasses import dataclass

from django.db.models import Q, QuerySet

from knowledge.models import Document, Workspace

TAG_MAX_CHARS = 50
SCOPE_MAX_ITEMS = 200


@dataclass(frozen=True)
class Scope:
    """Documents carrying any of `tags`, or named in `documents` (ids); empty: every document."""

    tags: tuple[str, ...] = ()
    documents: tuple[int, ...] = ()

    @property
    def narrowed(self) -> bool:
        return bool(self.tags or self.documents)

    def as_json(self) -> dict:
        return {"tags": list(self.tags), "documents": list(self.documents)}

    @classmethod
    def coerce(cls, value: object) -> "Scope":
        """A scope from what a protocol carried: None, a Scope, or {"tags": [...], "documents": [...]}.
        Raises ValueError with a message for the asker."""
        if value is None:
            return cls()
        if isinstance(value, Scope):
            return value
        if not isinstance(value, Mapping):
            raise ValueError('\'filters\' must be an object such as {"tags": ["handbook"], "documents": [12]}.')
        unknown = sorted(set(value) - {"tags", "documents"})
        if unknown:
            raise ValueError(f"Unknown filter '{unknown[0]}': 'filters' takes 'tags' and 'documents'.")
        tags, documents = value.get("tags") or [], value.get("documents") or []
        if not isinstance(tags, list | tuple) or not all(isinstance(tag, str) and tag.strip() for tag in tags):
            raise ValueError("'filters.tags' must be a list of tag names.")
        if not isinstance(documents, list | tuple) or not all(
            isinstance(pk, int) and not isinstance(pk, bool) and pk > 0 for pk in documents
        ):
            raise ValueError("'filters.documents' must be a list of document ids.")
        if len(tags) + len(documents) > SCOPE_MAX_ITEMS:
            raise ValueError(f"'filters' names at most {SCOPE_MAX_ITEMS} tags and documents together.")
        return cls(
            tags=tuple(dict.fromkeys(normalize_tag(tag) for tag in tags)),
            documents=tuple(dict.fromkeys(documents)),
        )


def normalize_tag(tag: str) -> str:
    """Tags compare without case or surrounding spaces: "Handbook " is "handbook"."""
    return " ".join(tag.split()).casefold()[:TAG_MAX_CHARS]


def filtered(workspace: Workspace, scope: Scope | None) -> bool:
    """Whether the searches need a scope clause at all."""
    return (scope is not None and scope.narrowed) or workspace.disabled_documents > 0


_IN_SCOPE = (
    "FROM knowledge_document sd WHERE sd.workspace_id = %(scope_workspace)s AND sd.enabled "
    "AND (%(scope_all)s OR sd.tags && %(scope_tags)s::varchar(50)[] OR sd.id = ANY(%(scope_documents)s::bigint[]))"
)
_DOCUMENTS = f"SELECT sd.id {_IN_SCOPE}"


_SUPPORTED = {
    "entity": (
        " AND EXISTS (SELECT 1 FROM knowledge_entitysource ss JOIN knowledge_chunk sc ON sc.id = ss.chunk_id"
        " WHERE ss.entity_id = {column} AND sc.document_id IN ({documents}))"
    ),
    "relation": (
        " AND EXISTS (SELECT 1 FROM knowledge_relationsource ss JOIN knowledge_chunk sc ON sc.id = ss.chunk_id"
        " WHERE ss.relation_id = {column} AND sc.document_id IN ({documents}))"
    ),
}


# The entities or relations in scope, read from the scope's side: those a chunk of an in-scope
# document supports (once per supporting chunk).
_ROWS = {
    "entity": (
        "SELECT ss.entity_id AS id FROM knowledge_entitysource ss JOIN knowledge_chunk sc ON sc.id = ss.chunk_id"
        " WHERE sc.document_id IN ({documents})"
    ),
    "relation": (
        "SELECT ss.relation_id AS id FROM knowledge_relationsource ss JOIN knowledge_chunk sc ON sc.id = ss.chunk_id"
        " WHERE sc.document_id IN ({documents})"
    ),
}


def _params(workspace: Workspace, scope: Scope | None) -> dict:
    scope = scope or Scope()
    return {
        "scope_workspace": workspace.pk,
        "scope_all": not scope.narrowed,
        "scope_tags": list(scope.tags),
        "scope_documents": list(scope.documents),
    }


def chunk_clause(column: str, workspace: Workspace, scope: Scope | None) -> tuple[str, dict]:
    """` AND <column> IN (in-scope documents)` and its parameters, or nothing when unfiltered."""
    if not filtered(workspace, scope):
        return "", {}
    return f" AND {column} IN ({_DOCUMENTS})", _params(workspace, scope)


def hidden_clause(column: str, workspace: Workspace, scope: Scope | None) -> tuple[str, dict]:
    """` OR <column> NOT IN (in-scope documents)`, for a list of documents nothing is served from."""
    if not filtered(workspace, scope):
        return "", {}
    return f" OR {column} NOT IN ({_DOCUMENTS})", _params(workspace, scope)


def row_clause(kind: str, column: str, workspace: Workspace, scope: Scope | None) -> tuple[str, dict]:
    """` AND EXISTS (a chunk of an in-scope document supports <column>)`, for kind "entity" or
    "relation"; nothing when unfiltered."""
    if not filtered(workspace, scope):
        return "", {}
    return _SUPPORTED[kind].format(column=column, documents=_DOCUMENTS), _params(workspace, scope)


def rows_in_scope(kind: str) -> str:
    """SQL of the ids of kind "entity" or "relation" in scope, read from the in-scope documents (an
    id may repeat), for the searches that scan a small scope exactly. It takes the parameters of
    the clauses above."""
    return _ROWS[kind].format(documents=_DOCUMENTS)


def size_of_scope(kind: str) -> str:
    """SQL of how many rows of kind "chunk", "entity" or "relation" the scope holds, as its
    documents counted them when they were published: a bound, without reading the rows (an
    entity two documents support counts twice). It takes the parameters of the clauses above."""
    return f"SELECT coalesce(sum(sd.{kind}_count), 0) {_IN_SCOPE}"


def documents_in_scope(workspace: Workspace, scope: Scope | None) -> QuerySet[Document]:
    """The in-scope documents as a queryset, for the searches written with the ORM."""
    documents = Document.objects.filter(workspace=workspace, enabled=True)
    if scope is not None and scope.narrowed:
        documents = documents.filter(Q(tags__overlap=list(scope.tags)) | Q(pk__in=list(scope.documents)))
    return documents
