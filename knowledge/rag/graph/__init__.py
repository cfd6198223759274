"""The graph: merging chunk records into entities and relations, and rebuilding them from provenance.

Merging is additive and cheap: per batch of chunks, one transaction inserts the new entities
and relations and the provenance rows. Descriptions, types, weights,
keywords and vectors are then rebuilt from provenance (`rebuild_entities`,
`rebuild_relations`), once per document for everything it touched, and again after a
deletion or a curation merge. Rebuilding from provenance is what makes deletion exact.

Concurrency: every write to an entity holds a transaction-scoped advisory lock on its key, and
every write to a relation's provenance or to what is derived from it a lock on the relation
(`locks`). A rebuild computes outside the locks (summaries and embeddings can be slow) and
writes under them only if the provenance it read is still what is there; otherwise it
computes again.
"""

from knowledge.rag.graph.embedding import entity_text, entity_vectors, relation_text, relation_vectors
from knowledge.rag.graph.locks import lock_entity_keys, lock_relations
from knowledge.rag.graph.merge import MergeResult, merge_chunks
from knowledge.rag.graph.rebuild import RebuildResult, rebuild_entities, rebuild_relations
from knowledge.rag.graph.synonyms import link_synonyms, queue_synonym_search, run_synonym_searches
from knowledge.rag.graph.vectors import (
    embed_published,
    reembed_workspace,
    resize_vector_columns,
    update_rows,
    vector_dimensions,
)
from knowledge.rag.names import entity_key

__all__ = [
    "MergeResult",
    "RebuildResult",
    "embed_published",
    "entity_text",
    "entity_vectors",
    "entity_key",
    "link_synonyms",
    "lock_entity_keys",
    "lock_relations",
    "merge_chunks",
    "queue_synonym_search",
    "rebuild_entities",
    "rebuild_relations",
    "reembed_workspace",
    "relation_text",
    "relation_vectors",
    "resize_vector_columns",
    "run_synonym_searches",
    "update_rows",
    "vector_dimensions",
]
