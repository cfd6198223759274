from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.db import connection, models
from django.db.models import F, Q
from django.utils import timezone
from pgvector.django import HalfVectorField, HnswIndex, VectorField

DEFAULT_ENTITY_TYPES = [
    "person",
    "organization",
    "location",
    "event",
    "product",
    "technology",
    "concept",
    "date",
    "work",
]


class Role(models.TextChoices):
    VIEWER = "viewer", "Viewer"
    EDITOR = "editor", "Editor"
    OWNER = "owner", "Owner"

    @property
    def rank(self) -> int:
        return ROLE_RANK[self.value]


ROLE_RANK = {Role.VIEWER: 1, Role.EDITOR: 2, Role.OWNER: 3}


def embedding_index(model_name: str, *, opclass: str = "vector_cosine_ops") -> HnswIndex:
    return HnswIndex(
        name=f"{model_name}_embedding_hnsw",
        fields=["embedding"],
        m=16,
        ef_construction=64,
        opclasses=[opclass],
    )


def vector_type(model: type[models.Model]) -> str:
    """The type of a model's `embedding` column without its size ("vector", "halfvec"): a vector
    compared with the column is cast to it, so that the column's HNSW index serves the comparison."""
    return model._meta.get_field("embedding").db_type(connection).partition("(")[0]


class Workspace(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(max_length=80, unique=True)
    description = models.TextField(blank=True)
    chunk_token_size = models.PositiveIntegerField(default=1200)
    chunk_overlap_tokens = models.PositiveIntegerField(default=100)
    gleaning_passes = models.PositiveSmallIntegerField(default=1)
    entity_types = models.JSONField(default=list, blank=True)
    # Row counts refreshed after every graph change; they pick the vector search strategy
    # and fill the workspace page without counting on each request.
    chunk_count = models.PositiveIntegerField(default=0)
    entity_count = models.PositiveIntegerField(default=0)
    relation_count = models.PositiveIntegerField(default=0)
    # Disabled current documents: while there are none, unscoped retrieval adds no filter at all.
    disabled_documents = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def get_entity_types(self) -> list[str]:
        return self.entity_types or DEFAULT_ENTITY_TYPES


class Membership(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "workspace"], name="membership_unique_user_workspace")]

    def __str__(self) -> str:
        return f"{self.user} in {self.workspace} ({self.role})"

    @property
    def rank(self) -> int:
        return ROLE_RANK[self.role]


class DocumentQuerySet(models.QuerySet):
    def current(self):
        """Documents as the workspace lists them: no older versions."""
        return self.filter(superseded_by__isnull=True)


class Document(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending", "Pending"
        PROCESSING = "processing", "Processing"
        PROCESSED = "processed", "Processed"
        FAILED = "failed", "Failed"

    class Stage(models.TextChoices):
        QUEUED = "queued", "Queued"
        PARSING = "parsing", "Reading the file"
        EMBEDDING = "embedding", "Embedding chunks"
        EXTRACTING = "extracting", "Extracting"
        BUILDING = "building", "Building the graph"
        PUBLISHING = "publishing", "Publishing"
        DONE = "done", "Done"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="documents")
    title = models.CharField(max_length=300)
    original_filename = models.CharField(max_length=300, blank=True)
    source_file = models.FileField(upload_to="documents/%Y/%m/", blank=True)
    text = models.TextField(blank=True)
    content_hash = models.CharField(max_length=64)
    # Where the text's sections, pages, slides and sheets are (parsing.ParsedDocument.to_json()).
    structure = models.JSONField(default=dict, blank=True)
    # Detected when the text is read (knowledge.rag.language.detect); each chunk is still read by
    # the pipeline of its own language, so a document that mixes two is read right in both.
    language = models.CharField(
        max_length=8,
        blank=True,
        default="",
        help_text="ISO 639-1 code of the text's language, as detected when it was read.",
    )
    status = models.CharField(max_length=12, choices=Status.choices, default=Status.PENDING, db_index=True)
    # What every member reads; never an endpoint, key or stack trace.
    error = models.TextField(blank=True)
    # What owners (and the log) read: the provider's own words, endpoint host included, secrets masked.
    error_detail = models.TextField(blank=True)
    chunk_count = models.PositiveIntegerField(default=0)
    chunks_done = models.PositiveIntegerField(default=0)
    entity_count = models.PositiveIntegerField(default=0)
    relation_count = models.PositiveIntegerField(default=0)
    token_count = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    processed_at = models.DateTimeField(null=True, blank=True)
    # Where a run stands, for the document list: the stage and its progress (units of the stage:
    # chunks, graph rows), and the seconds each stage has taken so far (for estimates and benchmarks).
    stage = models.CharField(max_length=12, choices=Stage.choices, default=Stage.QUEUED)
    stage_done = models.PositiveIntegerField(default=0)
    stage_total = models.PositiveIntegerField(default=0)
    timings = models.JSONField(default=dict, blank=True)
    # Lease of the run that holds the document (knowledge.services.ingestion): a heartbeat extends it while
    # the run is alive, so a run that died is taken over once it expires.
    lease_owner = models.CharField(max_length=200, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Runs take turns: the claimable document whose turn came first goes next.
    next_attempt_at = models.DateTimeField(default=timezone.now)
    # Transient failures (model or database unreachable) in a row; too many fail the document.
    attempts = models.PositiveSmallIntegerField(default=0)
    # sha256 of the uploaded bytes: the same file twice is refused at upload, before parsing.
    file_hash = models.CharField(max_length=64, blank=True)
    # Versions (knowledge.services.ingestion.versions): a new version is a document of its own that
    # `replaces` the current one and takes its place when it is published; from then on the old
    # one points at the current version (`superseded_by`), keeps its text and chunks for the
    # history and the citations made from it, and serves nothing.
    version = models.PositiveIntegerField(default=1)
    replaces = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    superseded_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.CASCADE, related_name="older_versions"
    )
    superseded_at = models.DateTimeField(null=True, blank=True)
    # Scopes: a disabled document stays but is not retrieved; tags name the groups a question
    # can be scoped to (knowledge.rag.retrieval.scope).
    enabled = models.BooleanField(default=True)
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    # Brought by a source (knowledge.services.sources): where in it (a path, a URL), what the
    # source said of it last time (mtime and size, ETag or Last-Modified, a git blob id), and
    # since when the source no longer has it (removed once the source's grace period is over).
    source = models.ForeignKey("Source", null=True, blank=True, on_delete=models.SET_NULL, related_name="documents")
    source_key = models.CharField(max_length=1000, blank=True)
    source_fingerprint = models.CharField(max_length=300, blank=True)
    source_missing_since = models.DateTimeField(null=True, blank=True)

    objects = DocumentQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # The text's hash is known once the worker has parsed the file. Older versions may
            # share a text with the current one (a change undone).
            models.UniqueConstraint(
                fields=["workspace", "content_hash"],
                condition=~Q(content_hash="") & Q(superseded_by__isnull=True),
                name="document_unique_content_per_workspace",
            )
        ]
        indexes = [
            models.Index(
                fields=["next_attempt_at", "id"],
                condition=Q(status__in=["pending", "processing"]),
                name="document_claimable",
            ),
            models.Index(fields=["workspace", "file_hash"], name="document_file_hash"),
            GinIndex(fields=["tags"], name="document_tags"),
            # What retrieval must not serve yet, read by every question: a handful of rows in a
            # workspace of thousands of published documents (decision 0165).
            models.Index(fields=["workspace"], condition=~Q(status="processed"), name="document_unpublished"),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def retryable(self) -> bool:
        """Failed, or held by a run that died (its lease ran out before anyone took it over)."""
        if self.status == self.Status.FAILED:
            return True
        expired = self.lease_expires_at is not None and self.lease_expires_at < timezone.now()
        return self.status == self.Status.PROCESSING and expired


class Source(models.Model):
    """Where a workspace's documents live: a server folder, web pages or a sitemap, a git
    repository. Synced on its schedule by the beat (knowledge.services.sources), or on demand."""

    class Kind(models.TextChoices):
        FOLDER = "folder", "Server folder"
        WEB = "web", "Web pages or a sitemap"
        GIT = "git", "Git repository"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="sources")
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    # A folder under SOURCES_ROOTS; page URLs, one a line, or a sitemap's URL; a repository's
    # https URL or a local path under SOURCES_ROOTS.
    location = models.TextField()
    branch = models.CharField(max_length=200, blank=True)
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    interval_minutes = models.PositiveIntegerField(default=60)
    grace_hours = models.PositiveIntegerField(default=24)
    enabled = models.BooleanField(default=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    # The schedule and the outcome of the last sync, for the source's page.
    next_sync_at = models.DateTimeField(default=timezone.now)
    last_sync_at = models.DateTimeField(null=True, blank=True)
    last_success_at = models.DateTimeField(null=True, blank=True)
    last_error = models.TextField(blank=True)
    counts = models.JSONField(default=dict, blank=True)
    # A sync holds the source until it ends or this passes (a worker that died lets go).
    sync_until = models.DateTimeField(null=True, blank=True)
    # What the last sync saw that the next one compares with (the git commit).
    state = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="source_unique_name")]
        indexes = [models.Index(fields=["next_sync_at"], condition=Q(enabled=True), name="source_due")]

    def __str__(self) -> str:
        return self.name


class Chunk(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="chunks")
    # Foreign keys marked db_index=False here and below lead a unique constraint's index already;
    # every index is written for every row version, and these tables take the most writes.
    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="chunks", db_index=False)
    order = models.PositiveIntegerField()
    text = models.TextField()
    token_count = models.PositiveIntegerField()
    char_start = models.PositiveIntegerField()
    char_end = models.PositiveIntegerField()
    # Where the chunk sits: "Title > Chapter > Section", the pages (or slides, sheets) it covers
    # and a label for people ("p. 4", "pp. 4-5", "slide 3", "sheet Revenue").
    section = models.TextField(blank=True, default="")
    page_start = models.PositiveIntegerField(null=True, blank=True)
    page_end = models.PositiveIntegerField(null=True, blank=True)
    location = models.CharField(max_length=80, blank=True, default="")
    # The document page's anchor for that place: "page-4", "slide-3", "sheet-2", "section-5".
    anchor = models.CharField(max_length=40, blank=True, default="")
    embedding = VectorField(dimensions=settings.EMBEDDING_DIM, null=True, blank=True)
    # The table also has `search`, a tsvector generated from section and text with a GIN index
    # (migrations 0007 and 0009: CJK runs indexed as pairs of characters), the lexical index
    # beside the vector one. It is not a model field, so no ORM query reads it; only the hybrid
    # search (knowledge/rag/retrieval/searches.py, chunks_nearest) does.

    class Meta:
        ordering = ["document_id", "order"]
        constraints = [models.UniqueConstraint(fields=["document", "order"], name="chunk_unique_order")]
        indexes = [embedding_index("chunk")]

    def __str__(self) -> str:
        return f"{self.document_id}#{self.order}"


class GraphQuerySet(models.QuerySet):
    def published(self):
        """Rows a reader may see: supported by at least one published document. Everything that
        shows or searches the graph starts here (docs/ingestion.md, "Publishing")."""
        return self.filter(published=True)


class Entity(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="entities", db_index=False)
    name = models.CharField(max_length=300)
    key = models.CharField(max_length=300, help_text="Normalized name: one entity per key in a workspace.")
    # The name without case, punctuation, spaces or a plural ending (knowledge.rag.names.surface_form):
    # entities that share it are synonyms (EntityLink), "Enum" and "Enums", "GraphRAG" and "Graph RAG".
    form = models.CharField(max_length=300, blank=True, db_default="")
    type = models.CharField(max_length=80, blank=True)
    description = models.TextField(blank=True)
    embedding = VectorField(dimensions=settings.EMBEDDING_DIM, null=True, blank=True)
    # Set with the vector when the first document that supports the entity is published; until
    # then nothing serves it (knowledge.services.ingestion, "Publishing").
    published = models.BooleanField(default=False)
    # The last LLM summary folded into the description, the last source (provenance id) it folded
    # and how many: later sources are added below it until they cross SUMMARY_TRIGGER
    # (knowledge.rag.graph.describe).
    summary = models.TextField(blank=True, db_default="")
    summary_through = models.BigIntegerField(db_default=0)
    summary_sources = models.PositiveIntegerField(db_default=0)
    # What the values above count of the provenance, so that a document's build reads only the
    # sources after it: the last source id and how many up to it, the tallies of types and
    # spellings, whether the description was cut (knowledge.rag.graph.rebuild).
    folded = models.JSONField(null=True, blank=True)
    # Like Chunk, the table has a generated `search` tsvector of the name (unstemmed, CJK as pairs
    # of characters) with a GIN index, read only by the lookup of low-level keywords by name
    # (entities_nearest in knowledge/rag/retrieval/searches.py).
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = GraphQuerySet.as_manager()

    class Meta:
        verbose_name_plural = "entities"
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["workspace", "key"], name="entity_unique_key")]
        indexes = [
            models.Index(fields=["workspace", "form"], name="entity_form"),
            # The few rows of documents in flight, which vector searches skip (GraphVector).
            models.Index(fields=["workspace"], condition=Q(published=False), name="entity_unpublished"),
        ]

    def __str__(self) -> str:
        return self.name


class Relation(models.Model):
    """An undirected edge: one row per unordered pair, stored with source_id < target_id."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="relations", db_index=False)
    # Indexed below, with what graph walks read, so they never touch the wide rows.
    source = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="+", db_index=False)
    target = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="+", db_index=False)
    keywords = models.TextField(blank=True)
    description = models.TextField(blank=True)
    weight = models.FloatField(default=0.0)
    embedding = VectorField(dimensions=settings.EMBEDDING_DIM, null=True, blank=True)
    # As Entity.published; degrees count published relations only (triggers, migration 0005).
    published = models.BooleanField(default=False)
    # As Entity.summary: the last LLM summary folded into the description, and which sources it folded.
    summary = models.TextField(blank=True, db_default="")
    summary_through = models.BigIntegerField(db_default=0)
    summary_sources = models.PositiveIntegerField(db_default=0)
    # As Entity.folded, without tallies (the weight and keywords are sums and unions).
    folded = models.JSONField(null=True, blank=True)

    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    objects = GraphQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["workspace", "source", "target"], name="relation_unique_pair"),
            models.CheckConstraint(condition=Q(source__lt=F("target")), name="relation_pair_ordered"),
        ]
        # Covering indexes: one-hop expansion and the edges among a subgraph's nodes are
        # index-only scans, where a heap fetch would read a page of vectors per relation.
        indexes = [
            models.Index(
                fields=["source"],
                include=["target", "workspace", "weight", "id", "published"],
                name="relation_by_source",
            ),
            models.Index(
                fields=["target"],
                include=["source", "workspace", "weight", "id", "published"],
                name="relation_by_target",
            ),
            models.Index(fields=["workspace"], condition=Q(published=False), name="relation_unpublished"),
        ]

    def __str__(self) -> str:
        return f"{self.source_id} - {self.target_id}"


class EntityDegree(models.Model):
    """How many published relations touch an entity: written only by triggers on knowledge_relation
    (migrations 0003 and 0005), so every writer of relations (merge, deletion, curation, undo, raw SQL)
    keeps it exact. Entities without relations have no row.

    Ranking reads the degrees of hundreds of entities per query, and counting them from the
    relation table costs more than the rest of the query. It is a table of its own because
    updating a column of Entity would write a new row version, and with it a new HNSW entry
    for an unchanged vector.
    """

    entity = models.OneToOneField(Entity, on_delete=models.CASCADE, primary_key=True, related_name="degree_row")
    degree = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return f"entity {self.entity_id}: {self.degree}"


class GraphVector(models.Model):
    """The vector of an entity or relation, kept in a table of its own for its HNSW index.

    On the graph row itself, every non-HOT update (a new weight, a longer description: most updates
    of a relation, whose covering indexes hold its weight) inserted the unchanged vector into HNSW
    again, so the index held several entries per row and grew past the memory meant for it
    (decision 0156). Triggers on the graph table (migrations 0016, 0018) write the copy when a
    published row's vector changes, so every writer (publishing, rebuilds, curation, restores, raw
    SQL) keeps it exact. A new row's copy is written before that, when its document stages the
    vector (graph.vectors.copy_staged_vectors), so that the HNSW insert happens outside the
    publishing transaction and its locks (decision 0162); searches skip the copies of unpublished
    rows (searches._SERVED_COPY). The id is the graph row's; the row's deletion deletes it (a
    foreign key ON DELETE CASCADE in the database, not in Django's collector). Searches read it as
    they read the graph table: `id`, `workspace_id`, `embedding`.

    The copy is in half precision (decision 0166): it only chooses the nearest rows, whose
    distances are then read from the graph row's own vector, and its index takes half the memory,
    which is what an insert into a large graph's index spends its time reading.
    """

    workspace_id = models.BigIntegerField()
    embedding = HalfVectorField(dimensions=settings.EMBEDDING_DIM)

    class Meta:
        abstract = True


class EntityVector(GraphVector):
    entity = models.OneToOneField(
        Entity, on_delete=models.DO_NOTHING, db_constraint=False, primary_key=True, db_column="id", related_name="+"
    )

    class Meta:
        # An exact scan of a small workspace's vectors starts from its rows (searches._vector_order).
        indexes = [
            embedding_index("entityvector", opclass="halfvec_cosine_ops"),
            models.Index(fields=["workspace_id"], name="entityvector_workspace"),
        ]

    def __str__(self) -> str:
        return f"vector of entity {self.entity_id}"


class RelationVector(GraphVector):
    relation = models.OneToOneField(
        Relation, on_delete=models.DO_NOTHING, db_constraint=False, primary_key=True, db_column="id", related_name="+"
    )

    class Meta:
        # An exact scan of a small workspace's vectors starts from its rows (searches._vector_order).
        indexes = [
            embedding_index("relationvector", opclass="halfvec_cosine_ops"),
            models.Index(fields=["workspace_id"], name="relationvector_workspace"),
        ]

    def __str__(self) -> str:
        return f"vector of relation {self.relation_id}"


class EntitySource(models.Model):
    """Provenance: this chunk said this about this entity."""

    entity = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="sources", db_index=False)
    chunk = models.ForeignKey(Chunk, on_delete=models.CASCADE, related_name="entity_sources")
    name = models.CharField(max_length=300, help_text="The name as written in this chunk.")
    type = models.CharField(max_length=80, blank=True)
    description = models.TextField(blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["entity", "chunk"], name="entitysource_unique")]
        # A build reads a row's sources after the last one it folded (knowledge.rag.graph.rebuild).
        indexes = [models.Index(fields=["entity", "id"], include=["chunk"], name="entitysource_by_entity")]

    def __str__(self) -> str:
        return f"{self.name} in chunk {self.chunk_id}"


class RelationSource(models.Model):
    relation = models.ForeignKey(Relation, on_delete=models.CASCADE, related_name="sources", db_index=False)
    chunk = models.ForeignKey(Chunk, on_delete=models.CASCADE, related_name="relation_sources")
    description = models.TextField(blank=True)
    keywords = models.TextField(blank=True)
    strength = models.FloatField(default=1.0)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["relation", "chunk"], name="relationsource_unique")]
        indexes = [models.Index(fields=["relation", "id"], include=["chunk"], name="relationsource_by_relation")]

    def __str__(self) -> str:
        return f"relation {self.relation_id} in chunk {self.chunk_id}"


class ChunkExtraction(models.Model):
    """The parsed extraction output of one chunk, so a re-run or a resumed crash costs nothing."""

    chunk = models.OneToOneField(Chunk, on_delete=models.CASCADE, related_name="extraction")
    engine = models.CharField(max_length=20)
    records = models.JSONField(default=dict)
    skipped_lines = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"extraction of chunk {self.chunk_id}"


class PendingVector(models.Model):
    """A vector computed for a document that is not published yet.

    Chunk, entity and relation vectors of a run are kept here (no HNSW index to maintain) and
    moved onto their rows in the transaction that publishes the document, so a run that dies
    keeps its embeddings and nobody sees half a document.
    """

    class Kind(models.TextChoices):
        CHUNK = "chunk"
        ENTITY = "entity"
        RELATION = "relation"

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="pending_vectors", db_index=False)
    kind = models.CharField(max_length=8, choices=Kind.choices)
    row_id = models.BigIntegerField()
    # The embedded text's hash: another document may reuse the vector for the same row and text.
    text_hash = models.CharField(max_length=32)
    embedding = VectorField(dimensions=settings.EMBEDDING_DIM)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["document", "kind", "row_id"], name="pendingvector_unique_row"),
        ]
        indexes = [models.Index(fields=["kind", "row_id", "text_hash"], name="pendingvector_by_row")]

    def __str__(self) -> str:
        return f"{self.kind} {self.row_id} of document {self.document_id}"


class PendingRow(models.Model):
    """What a document's build computed for a graph row it shares, applied in the transaction that
    publishes the document.

    A published row keeps serving the values of published documents until then; `sources` is the
    fingerprint (count, lowest and highest id) of the provenance the values were computed from,
    so publishing applies them only while it still holds and builds them again otherwise.
    """

    document = models.ForeignKey(Document, on_delete=models.CASCADE, related_name="pending_rows", db_index=False)
    kind = models.CharField(max_length=8, choices=PendingVector.Kind.choices)
    row_id = models.BigIntegerField()
    values = models.JSONField()
    sources = models.JSONField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["document", "kind", "row_id"], name="pendingrow_unique_row"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.row_id} as document {self.document_id} builds it"


class GraphRebuild(models.Model):
    """Graph rows to rebuild from their provenance, recorded with the change that requires it
    (a document deletion, a failed document's cleanup) and retried until the model and the
    embeddings are reachable, so deletions converge however long an endpoint is down."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="graph_rebuilds")
    entity_ids = models.JSONField(default=list)
    relation_ids = models.JSONField(default=list)
    reason = models.CharField(max_length=300)
    attempts = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    next_attempt_at = models.DateTimeField(default=timezone.now, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"rebuild after {self.reason}"


class LLMCacheEntry(models.Model):
    key = models.CharField(
        max_length=64,
        primary_key=True,
        help_text="sha256 of model, messages and parameters.",
    )
    kind = models.CharField(max_length=20)
    model = models.CharField(max_length=200)
    response = models.TextField()
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "LLM cache entry"
        verbose_name_plural = "LLM cache entries"

    def __str__(self) -> str:
        return f"{self.kind} {self.key[:12]}"


class EntityLink(models.Model):
    """Two entities that are one thing under two surface forms (knowledge.rag.graph.synonyms):
    the walk of retrieval crosses from one to the other, and the duplicates page lists them first.
    Stored once per pair, source_id < target_id."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="+", db_index=False)
    source = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="+", db_index=False)
    target = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="+")
    # The cosine of the two name vectors when they linked by vector; None when they share a form.
    cosine = models.FloatField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["source", "target"], name="entitylink_unique_pair"),
            models.CheckConstraint(condition=Q(source__lt=F("target")), name="entitylink_ordered"),
        ]
        indexes = [models.Index(fields=["workspace", "source"], name="entitylink_source")]

    def __str__(self) -> str:
        return f"{self.source_id} = {self.target_id}"


class SynonymSearch(models.Model):
    """A published entity whose synonyms are still to be looked for (decision 0164).

    Written in the transaction that publishes the entity, done right after it commits, when every
    entity published before is visible to the search, and deleted then: two documents published
    at once each see the other's entities, and a worker that dies between the two leaves the row
    for the sweeper. The search runs outside the publishing locks."""

    entity = models.OneToOneField(Entity, on_delete=models.CASCADE, primary_key=True, related_name="+")
    # When the sweeper may take the search over from the worker that published the entity.
    due_at = models.DateTimeField(db_index=True)

    def __str__(self) -> str:
        return f"synonyms of {self.entity_id}"


class EntityAlias(models.Model):
    """A merged-away name: later mentions of `key` land on `entity`."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="aliases")
    key = models.CharField(max_length=300)
    name = models.CharField(max_length=300)
    entity = models.ForeignKey(Entity, on_delete=models.CASCADE, related_name="aliases")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name_plural = "entity aliases"
        constraints = [models.UniqueConstraint(fields=["workspace", "key"], name="entityalias_unique_key")]

    def __str__(self) -> str:
        return f"{self.name} -> {self.entity_id}"


class MergeLog(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="merge_logs")
    survivor = models.ForeignKey(Entity, null=True, on_delete=models.SET_NULL, related_name="+")
    survivor_name = models.CharField(max_length=300)
    merged_names = models.JSONField(default=list)
    snapshot = models.JSONField(default=dict, help_text="The rows as they were before the merge, for undo.")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    undone_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"merge into {self.survivor_name}"


class AuditEvent(models.Model):
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="audit_events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=40)
    summary = models.CharField(max_length=500)
    detail = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return self.summary


class ApiToken(models.Model):
    """A bearer token for the HTTP APIs; only the sha256 of the secret is stored."""

    class Scope(models.TextChoices):
        # Each allows what the ones above it do; the user's role in a workspace still decides
        # what the token may do there (writing needs an editor, as in the browser).
        READ = "read", "Read: workspaces, models, documents, the graph, answers"
        ASK = "ask", "Ask: read, ask questions and give feedback"
        WRITE = "write", "Write: ask, upload and delete documents"

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    token_hash = models.CharField(max_length=64, unique=True)
    scope = models.CharField(max_length=8, choices=Scope.choices, default=Scope.ASK)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True, help_text="Empty: never expires.")
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    last_used_ip = models.GenericIPAddressField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name

    def allows(self, scope: str) -> bool:
        """May this token do what `scope` names (that scope or a wider one)?"""
        order = list(self.Scope.values)
        return self.scope in order and order.index(self.scope) >= order.index(scope)


# --- Evaluation (issue 7): question sets, runs of two systems, judged answers ----------------


class EvaluationSet(models.Model):
    """Questions imagined for a workspace's corpus, answered and judged by evaluation runs."""

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="evaluation_sets")
    name = models.CharField(max_length=200)
    corpus_description = models.TextField(blank=True)
    generation = models.JSONField(
        default=dict, blank=True, help_text="How the questions were made: model, counts, usage."
    )
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [models.UniqueConstraint(fields=["workspace", "name"], name="evaluationset_unique_name")]

    def __str__(self) -> str:
        return self.name


class EvaluationQuestion(models.Model):
    evaluation_set = models.ForeignKey(EvaluationSet, on_delete=models.CASCADE, related_name="questions")
    order = models.PositiveIntegerField(default=0)
    persona = models.CharField(max_length=500, blank=True, help_text="The imagined user who asks.")
    task = models.CharField(max_length=500, blank=True, help_text="The task the user is working on.")
    text = models.TextField()

    class Meta:
        ordering = ["evaluation_set_id", "order", "id"]

    def __str__(self) -> str:
        return self.text[:80]


class EvaluationRun(models.Model):
    """Two systems answering one evaluation set, every pair judged twice with the order swapped."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        FAILED = "failed", "Failed"

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="evaluation_runs")
    evaluation_set = models.ForeignKey(EvaluationSet, on_delete=models.CASCADE, related_name="runs")
    system_a = models.CharField(max_length=20)
    system_b = models.CharField(max_length=20)
    answer_model = models.CharField(max_length=200, blank=True)
    judge_model = models.CharField(max_length=200, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    error = models.TextField(blank=True)
    summary = models.JSONField(default=dict, blank=True, help_text="Win rates per criterion and cost per system.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.system_a} vs {self.system_b} on {self.evaluation_set_id}"


class EvaluationAnswer(models.Model):
    """One system's answer to one question, with what it cost."""

    run = models.ForeignKey(EvaluationRun, on_delete=models.CASCADE, related_name="answers")
    question = models.ForeignKey(EvaluationQuestion, on_delete=models.CASCADE, related_name="answers")
    system = models.CharField(max_length=20)
    text = models.TextField(blank=True)
    error = models.TextField(blank=True)
    context_tokens = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    retrieval_stats = models.JSONField(default=dict, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "question", "system"], name="evaluationanswer_unique_system")
        ]

    def __str__(self) -> str:
        return f"{self.system} on question {self.question_id}"


class EvaluationJudgement(models.Model):
    """One judge call. `verdicts` is already mapped back from answer positions to systems."""

    class Order(models.TextChoices):
        A_FIRST = "ab", "A shown first"
        B_FIRST = "ba", "B shown first"

    run = models.ForeignKey(EvaluationRun, on_delete=models.CASCADE, related_name="judgements")
    question = models.ForeignKey(EvaluationQuestion, on_delete=models.CASCADE, related_name="judgements")
    order = models.CharField(max_length=2, choices=Order.choices)
    raw = models.TextField(blank=True, help_text="The judge's reply as received.")
    verdicts = models.JSONField(
        default=dict, blank=True, help_text='Per criterion: {"winner": "a" | "b", "reason": "..."}.'
    )
    error = models.TextField(blank=True, help_text="Why (part of) the reply could not be read.")
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run", "question", "order"], name="evaluationjudgement_unique_order")
        ]

    def __str__(self) -> str:
        return f"judgement {self.order} of question {self.question_id}"


# --- People (issue 25): invitations, every answered question, feedback on answers -----------


class Invitation(models.Model):
    """An owner's invitation of an email address into a workspace with a role.

    The link carries a signature of (id, nonce, expiry) made with the secret key
    (knowledge.services.invitations); the row says whether it is still good: single use
    (`accepted_at`), revocable, and a resend draws a new nonce, so an older link stops working.
    """

    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField()
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)
    invited_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    nonce = models.CharField(max_length=32)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    sent_at = models.DateTimeField(null=True, blank=True)
    send_error = models.CharField(max_length=300, blank=True)
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            # One open invitation per address and workspace, however many owners click at once.
            models.UniqueConstraint(
                fields=["workspace", "email"],
                condition=Q(accepted_at__isnull=True, revoked_at__isnull=True),
                name="invitation_one_open_per_email",
            )
        ]

    def __str__(self) -> str:
        return f"{self.email} to {self.workspace_id} as {self.role}"

    @property
    def pending(self) -> bool:
        return self.accepted_at is None and self.revoked_at is None


class Answer(models.Model):
    """One question asked through any door (the chat, the HTTP, OpenAI, Ollama and MCP APIs) and
    what answered it: the row analytics count and feedback attaches to. Written by the ask
    service when the question starts and completed when its stream ends, however it ends."""

    class Door(models.TextChoices):
        CHAT = "chat", "Chat"
        API = "api", "HTTP API"
        OPENAI = "openai", "OpenAI API"
        OLLAMA = "ollama", "Ollama API"
        MCP = "mcp", "MCP"

    class Outcome(models.TextChoices):
        # Still streaming, or its process died before the end.
        STARTED = "started", "Started"
        ANSWERED = "answered", "Answered"
        STOPPED = "stopped", "Stopped"
        FAILED = "failed", "Failed"

    # Given to API clients as the answer's id (OpenAI's `chatcmpl-<uuid>`), never guessable.
    uuid = models.UUIDField(unique=True)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="answers", db_index=False)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    door = models.CharField(max_length=8, choices=Door.choices)
    question = models.TextField()
    mode = models.CharField(max_length=10)
    # The chat model's name, or "extractive" when the sources' own sentences answered.
    model = models.CharField(max_length=200)
    outcome = models.CharField(max_length=10, choices=Outcome.choices, default=Outcome.STARTED)
    text = models.TextField(blank=True)
    # The rows the answer cites (or, citing none, the passages it was given), as the APIs list them.
    sources = models.JSONField(default=list, blank=True)
    source_count = models.PositiveIntegerField(default=0)
    # The distinct documents behind `sources`, for "most cited" without reading the JSON.
    cited_documents = ArrayField(models.BigIntegerField(), default=list, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    llm_calls = models.PositiveIntegerField(default=0)
    first_token_ms = models.PositiveIntegerField(null=True, blank=True)
    total_ms = models.PositiveIntegerField(null=True, blank=True)
    # The chat's conversation and saved answer, when the chat asked.
    conversation_id = models.BigIntegerField(null=True, blank=True)
    message_id = models.BigIntegerField(null=True, blank=True, unique=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        # Covering: the analytics' aggregates over a period are index-only scans, never reading the
        # wide rows (question, text, sources) of 100,000 answers.
        indexes = [
            models.Index(
                fields=["workspace", "created_at"],
                include=[
                    "id",
                    "mode",
                    "model",
                    "outcome",
                    "source_count",
                    "llm_calls",
                    "prompt_tokens",
                    "completion_tokens",
                    "first_token_ms",
                    "cited_documents",
                ],
                name="answer_by_workspace_day",
            )
        ]

    def __str__(self) -> str:
        return self.question[:80]


class Feedback(models.Model):
    """A member's thumbs up or down on an answer, with an optional comment; one per member and
    answer (giving it again changes it). The answer row holds the question, mode, sources and model."""

    class Rating(models.IntegerChoices):
        UP = 1, "Helpful"
        DOWN = -1, "Not helpful"

    answer = models.ForeignKey(Answer, on_delete=models.CASCADE, related_name="feedback")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    rating = models.SmallIntegerField(choices=Rating.choices)
    comment = models.TextField(blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "feedback"
        constraints = [models.UniqueConstraint(fields=["answer", "user"], name="feedback_one_per_user")]

    def __str__(self) -> str:
        return f"{self.get_rating_display()} on answer {self.answer_id}"


class ModelEndpoint(models.Model):
    """A model server an administrator connected in the browser: OpenAI-compatible or Ollama.

    The key is stored encrypted with a key derived from SECRET_KEY (knowledge/services/model_endpoints.py)
    and never leaves the server again: no page, log, export or backup shows it."""

    class Kind(models.TextChoices):
        OPENAI = "openai", "OpenAI-compatible"
        OLLAMA = "ollama", "Ollama"

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=10, choices=Kind.choices, default=Kind.OPENAI)
    # OpenAI-compatible: the API's base (…/v1); Ollama: the server's root (http://host:11434).
    base_url = models.CharField(max_length=500)
    api_key_encrypted = models.TextField(blank=True)
    # What the last connection test found: the served models, or what went wrong.
    served_models = models.JSONField(default=list, blank=True)
    checked_at = models.DateTimeField(null=True, blank=True)
    check_error = models.TextField(blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class ModelChoice(models.Model):
    """The model in use for chat or for embeddings, installation-wide; no row means the
    environment's settings (LLM_*, EMBEDDING_*)."""

    class Purpose(models.TextChoices):
        CHAT = "chat", "Chat"
        EMBEDDING = "embedding", "Embeddings"

    purpose = models.CharField(max_length=10, choices=Purpose.choices, unique=True)
    endpoint = models.ForeignKey(ModelEndpoint, on_delete=models.PROTECT, related_name="choices")
    model = models.CharField(max_length=200)
    # Embeddings only: the vector size the model returned when it was picked.
    dimensions = models.PositiveIntegerField(null=True, blank=True)
    chosen_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    chosen_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.purpose}: {self.model} at {self.endpoint}"


class Reembedding(models.Model):
    """One re-embedding of every stored vector after the embedding model changed, run by a worker."""

    class Status(models.TextChoices):
        RUNNING = "running", "Running"
        FINISHED = "finished", "Finished"
        FAILED = "failed", "Failed"

    model = models.CharField(max_length=300, help_text="The embedding model, as the page names it.")
    dimensions = models.PositiveIntegerField()
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.RUNNING)
    total = models.PositiveIntegerField(default=0)
    done = models.PositiveIntegerField(default=0)
    error = models.TextField(blank=True)
    started_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(fields=["status"], condition=Q(status="running"), name="one_reembedding_at_a_time")
        ]

    def __str__(self) -> str:
        return f"re-embedding with {self.model} ({self.status})"
