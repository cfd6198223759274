"""What retrieval returns: the context rows, the result, and the knobs a caller may pass."""

from dataclasses import asdict, dataclass, field, replace

from knowledge.rag.retrieval.keywords import Keywords


@dataclass(frozen=True)
class Budgets:
    """Token budgets of the context tables; whole rows are dropped from the bottom to fit."""

    entities: int = 6000
    relations: int = 8000
    total: int = 30000

    @classmethod
    def coerce(cls, value) -> "Budgets":
        if value is None:
            return cls()
        if isinstance(value, Budgets):
            return value
        unknown = set(value) - {"entities", "relations", "total"}
        if unknown:
            raise ValueError(f"Unknown budget {sorted(unknown)[0]!r}: use entities, relations or total.")
        overrides = {name: amount for name, amount in value.items() if amount is not None}
        for name, amount in overrides.items():
            if not isinstance(amount, int) or isinstance(amount, bool) or amount < 1:
                raise ValueError(f"The {name} budget must be a positive number of tokens, got {amount!r}.")
        return replace(cls(), **overrides)


@dataclass(frozen=True)
class QueryVectors:
    """Precomputed query embeddings; retrieve() embeds whatever is missing, in one batch."""

    low_level: list[float] | None = None
    high_level: list[float] | None = None
    question: list[float] | None = None


@dataclass
class EntityRow:
    id: str
    entity_id: int
    name: str
    type: str
    description: str
    rank: int


@dataclass
class RelationRow:
    id: str
    relation_id: int
    source_id: int
    target_id: int
    source: str
    target: str
    keywords: str
    description: str
    weight: float
    rank: int


@dataclass
class ChunkRow:
    id: str
    chunk_id: int
    document_id: int
    document_title: str
    text: str
    token_count: int
    char_start: int
    char_end: int
    support: int
    # "graph" (provenance of retrieved entities and relations) or "search" (the hybrid chunk search).
    found_by: str
    # Where the chunk sits (see Chunk): section path, pages, label and the document page's anchor.
    section: str = ""
    location: str = ""
    page_start: int | None = None
    page_end: int | None = None
    anchor: str = ""


@dataclass
class RetrievalResult:
    mode: str
    question: str
    keywords: Keywords = field(default_factory=Keywords)
    entities: list[EntityRow] = field(default_factory=list)
    relations: list[RelationRow] = field(default_factory=list)
    chunks: list[ChunkRow] = field(default_factory=list)
    subgraph: dict = field(default_factory=lambda: {"nodes": [], "edges": []})
    citations: list[dict] = field(default_factory=list)
    context: str = ""
    stats: dict = field(default_factory=dict)
    # The earlier questions a follow-up was retrieved with (retrieval.history); none for a
    # question that stands on its own.
    referred: tuple[str, ...] = ()

    def to_json(self, *, include_context: bool = False) -> dict:
        data = {
            "mode": self.mode,
            "keywords": self.keywords.to_json(),
            "entities": [asdict(row) for row in self.entities],
            "relations": [asdict(row) for row in self.relations],
            "chunks": [asdict(row) for row in self.chunks],
            "citations": self.citations,
            "subgraph": self.subgraph,
            "stats": self.stats,
            "referred": list(self.referred),
        }
        if include_context:
            data["context"] = self.context
        return data
