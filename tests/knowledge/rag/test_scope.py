"""Scopes: a question scoped to tags or documents reads only those documents, in as many queries
as an unscoped one, and a disabled document is read by no question."""

import json
import random

import pytest
from django.conf import settings
from django.db import connection
from django.test.utils import CaptureQueriesContext
from pgvector.django import CosineDistance

from knowledge.models import Chunk, Document, Entity, EntitySource, Relation, RelationSource
from knowledge.rag.retrieval import MODES, QueryVectors, Scope
from knowledge.rag.retrieval.searches import chunks_nearest, entities_nearest, relations_nearest
from knowledge.services.workspaces import workspace_refresh_counts
from tests.factories import make_chunk, make_document, make_entity, make_relation
from tests.knowledge.team_graph import ask, build_team_graph

pytestmark = pytest.mark.django_db

TAGS = ("handbook", "legal", "sales", "engineering")


def _vector(rng: random.Random) -> list[float]:
    return [rng.uniform(-1, 1) for _ in range(settings.EMBEDDING_DIM)]


def _corpus(workspace, rng: random.Random, documents: int = 8, people: int = 12) -> list[Document]:
    """Documents with random tags; each chunk mentions a few shared people and relates two of them,
    so most entities and relations are supported by several documents."""
    entities = [make_entity(workspace, f"Person {n}", embedding=_vector(rng)) for n in range(people)]
    relations = {}
    made = []
    for index in range(documents):
        document = make_document(workspace, title=f"Document {index}")
        document.tags = rng.sample(TAGS, rng.randint(0, 2))
        document.save(update_fields=["tags"])
        made.append(document)
        for order in range(4):
            chunk = make_chunk(document, order=order, text=f"Document {index} part {order}.", embedding=_vector(rng))
            a, b = sorted(rng.sample(entities, 2), key=lambda entity: entity.pk)
            for entity in (a, b):
                EntitySource.objects.get_or_create(
                    entity=entity, chunk=chunk, defaults={"name": entity.name, "description": chunk.text}
                )
            relation = relations.get((a.pk, b.pk))
            if relation is None:
                relation = relations[a.pk, b.pk] = make_relation(
                    a, b, embedding=_vector(rng), description=f"{a.name} and {b.name}."
                )
            RelationSource.objects.get_or_create(relation=relation, chunk=chunk, defaults={"description": chunk.text})
    for document in made:  # as publishing counts them
        Document.objects.filter(pk=document.pk).update(
            chunk_count=4,
            entity_count=EntitySource.objects.filter(chunk__document=document).values("entity").distinct().count(),
            relation_count=RelationSource.objects.filter(chunk__document=document)
            .values("relation")
            .distinct()
            .count(),
        )
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()
    return made


def _in_scope(documents: list[Document], scope: Scope) -> set[int]:
    return {
        document.pk
        for document in documents
        if document.enabled and (set(document.tags) & set(scope.tags) or document.pk in scope.documents)
    }


def _read_documents(result) -> set[int]:
    """Every document the result reads or cites: its chunks, citations, and the provenance of its rows."""
    read = {row.document_id for row in result.chunks}
    read |= {citation["document_id"] for citation in result.citations if citation.get("document_id")}
    return read


def _rows_outside(result, allowed: set[int]) -> list[str]:
    """Entities and relations of the result that no chunk of an allowed document supports."""
    outside = []
    for row in result.entities:
        if not EntitySource.objects.filter(entity_id=row.entity_id, chunk__document_id__in=allowed).exists():
            outside.append(row.name)
    for row in result.relations:
        if not RelationSource.objects.filter(relation_id=row.relation_id, chunk__document_id__in=allowed).exists():
            outside.append(f"{row.source}-{row.target}")
    return outside


@pytest.fixture
def no_floor(settings):
    """Random vectors are nearly orthogonal: every row must count as near enough to be found."""
    settings.RETRIEVAL_MIN_SIMILARITY = -1.0


def test_a_scoped_question_never_reads_or_cites_outside_its_scope_over_random_scopes(workspace, no_floor):
    rng = random.Random(26)
    documents = _corpus(workspace, rng)
    Document.objects.filter(pk=documents[0].pk).update(enabled=False)
    workspace.disabled_documents = 1
    workspace.save(update_fields=["disabled_documents"])
    documents[0].enabled = False
    checked = 0
    for _ in range(40):
        scope = Scope(
            tags=tuple(rng.sample(TAGS, rng.randint(0, 2))),
            documents=tuple(document.pk for document in rng.sample(documents, rng.randint(0, 2))),
        )
        if not scope.narrowed:
            continue
        allowed = _in_scope(documents, scope)
        question = _vector(rng)
        vectors = QueryVectors(low_level=question, high_level=_vector(rng), question=question)
        for mode in ("mix", "local", "global", "naive"):
            result = ask(workspace, mode, scope=scope, vectors=vectors, top_k=10, chunk_top_k=10)
            assert _read_documents(result) <= allowed, (scope, mode)
            assert _rows_outside(result, allowed) == [], (scope, mode)
            checked += bool(result.chunks)
    assert checked > 20  # the scopes found something to read, most of the time


def test_a_disabled_document_is_read_by_no_question(workspace, no_floor):
    documents = _corpus(workspace, random.Random(7), documents=3)
    Document.objects.filter(pk=documents[1].pk).update(enabled=False)
    workspace.disabled_documents = 1
    for mode in ("mix", "naive"):
        result = ask(workspace, mode, top_k=40, chunk_top_k=40)
        read = _read_documents(result)
        assert documents[1].pk not in read
        assert read


@pytest.mark.parametrize(
    ("mode", "queries"), [("bypass", 0), ("naive", 1), ("global", 4), ("local", 5), ("hybrid", 6), ("mix", 7)]
)
def test_a_scoped_question_costs_the_queries_of_an_unscoped_one(workspace, mode, queries, django_assert_num_queries):
    build_team_graph(workspace)
    Document.objects.filter(workspace=workspace).update(tags=["team"])
    with django_assert_num_queries(queries):
        result = ask(workspace, mode, scope=Scope(tags=("team",)))
    assert result.stats["sql_queries"] == queries


def _branch_run(sql: str) -> str:
    """Which branch of a scoped vector search ran: "exact" (the scope read from its own side) or
    "index" (the filtered HNSW scan), from the plan Postgres executed."""
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}")
        plan = cursor.fetchone()[0]
        plan = json.loads(plan) if isinstance(plan, str) else plan
    ran = set()
    stack = [plan[0]["Plan"]]
    while stack:
        node = stack.pop()
        if "One-Time Filter" in node and node["Plans"][0]["Actual Loops"] > 0:
            ran.add("exact" if " <= " in node["One-Time Filter"] else "index")
        stack.extend(node.get("Plans", []))
    assert len(ran) == 1, ran
    return ran.pop()


@pytest.mark.parametrize(("exact_max", "branch"), [(10_000, "exact"), (1, "index")])
def test_a_scoped_vector_search_finds_the_nearest_rows_in_scope_by_either_branch(
    workspace, no_floor, settings, exact_max, branch
):
    """A scope of at most VECTOR_EXACT_SCAN_MAX rows is scanned exactly from its own side (a
    filtered HNSW scan loses recall when the scope is small); a larger one goes through the index.
    The query picks the branch itself, and either way returns the nearest rows in scope."""
    rng = random.Random(11)
    documents = _corpus(workspace, rng)
    settings.VECTOR_EXACT_SCAN_MAX = exact_max
    # Every earlier test's rolled-back vectors stay in the HNSW indexes until a vacuum, and on a
    # long run the filtered scan of this dozen live rows found none of them (twice in full runs,
    # never alone). What is pinned here is the branch and its answer, so the indexes are rebuilt
    # from the live rows, inside the test's transaction.
    with connection.cursor() as cursor:
        for table in ("knowledge_chunk", "knowledge_entityvector", "knowledge_relationvector"):
            cursor.execute(f"REINDEX TABLE {table}")
    scope = Scope(tags=("handbook",))
    allowed = _in_scope(documents, scope)
    assert allowed
    vector = _vector(rng)

    def nearest(model, ids, k):
        rows = model.objects.filter(pk__in=ids).annotate(distance=CosineDistance("embedding", vector))
        return list(rows.order_by("distance", "pk").values_list("pk", flat=True)[:k])

    chunks = Chunk.objects.filter(document_id__in=allowed).values_list("pk", flat=True)
    entities = EntitySource.objects.filter(chunk__document_id__in=allowed).values_list("entity_id", flat=True)
    relations = RelationSource.objects.filter(chunk__document_id__in=allowed).values_list("relation_id", flat=True)
    with CaptureQueriesContext(connection) as queries:
        found = [row.pk for row in chunks_nearest(workspace=workspace, vector=vector, k=3, scope=scope)]
    assert found == nearest(Chunk, chunks, 3)
    assert _branch_run(queries.captured_queries[0]["sql"]) == branch
    found = [row.pk for row in entities_nearest(workspace=workspace, vector=vector, k=3, scope=scope)]
    assert found == nearest(Entity, entities, 3)
    with CaptureQueriesContext(connection) as queries:
        found = [row.pk for row in relations_nearest(workspace=workspace, vector=vector, k=3, scope=scope)]
    assert found == nearest(Relation, relations, 3)
    assert _branch_run(queries.captured_queries[0]["sql"]) == branch


def test_a_scope_that_matches_nothing_reads_nothing(workspace):
    build_team_graph(workspace)
    for mode in MODES:
        result = ask(workspace, mode, scope=Scope(tags=("nowhere",)))
        assert (result.entities, result.relations, result.chunks) == ([], [], [])


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("handbook", "must be an object"),
        ({"tag": ["a"]}, "Unknown filter 'tag'"),
        ({"tags": "a"}, "list of tag names"),
        ({"documents": ["12"]}, "list of document ids"),
        ({"documents": [True]}, "list of document ids"),
    ],
)
def test_a_malformed_scope_is_refused_with_what_to_send(value, message):
    with pytest.raises(ValueError, match=message):
        Scope.coerce(value)


def test_tags_compare_without_case_or_spaces():
    assert Scope.coerce({"tags": [" Hand  Book ", "hand book"], "documents": [3, 3]}) == Scope(
        tags=("hand book",), documents=(3,)
    )
