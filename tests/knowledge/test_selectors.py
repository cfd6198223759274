import numpy as np
import pytest
from django.contrib.auth.models import AnonymousUser
from django.db import connection
from django.http import Http404
from django.test.utils import CaptureQueriesContext

from knowledge.models import Entity, Relation, Role
from knowledge.rag.retrieval.searches import (
    chunks_nearest,
    entities_nearest,
    entity_degrees,
    identifier_terms,
    relation_ranks,
    relations_nearest,
)
from knowledge.selectors import workspace_for_user
from knowledge.services.workspaces import workspace_refresh_counts
from tests.factories import (
    make_chunk,
    make_document,
    make_entity,
    make_relation,
    make_user,
    make_workspace,
    random_vector,
)


@pytest.fixture
def star(workspace):
    """hub - a, hub - b, hub - c, a - b; d isolated."""
    hub, a, b, c, d = (make_entity(workspace, name) for name in ["Hub", "A", "B", "C", "D"])
    relations = {
        "hub-a": make_relation(hub, a, weight=1),
        "hub-b": make_relation(hub, b, weight=2),
        "hub-c": make_relation(hub, c, weight=3),
        "a-b": make_relation(a, b, weight=4),
    }
    return {"hub": hub, "a": a, "b": b, "c": c, "d": d}, relations


def test_it_computes_degrees_in_one_query(star, django_assert_num_queries):
    entities, _ = star

    with django_assert_num_queries(1):
        degrees = entity_degrees(entity_ids=[entity.pk for entity in entities.values()])

    assert degrees == {
        entities["hub"].pk: 3,
        entities["a"].pk: 2,
        entities["b"].pk: 2,
        entities["c"].pk: 1,
        entities["d"].pk: 0,
    }


def test_it_ranks_edges_by_the_sum_of_endpoint_degrees_in_one_query(star, django_assert_num_queries):
    _, relations = star

    with django_assert_num_queries(1):
        ranks = relation_ranks(relation_ids=[relation.pk for relation in relations.values()])

    assert ranks == {
        relations["hub-a"].pk: 5,
        relations["hub-b"].pk: 5,
        relations["hub-c"].pk: 4,
        relations["a-b"].pk: 4,
    }


def test_it_does_not_count_relations_of_other_entities(star, django_assert_num_queries):
    entities, _ = star
    other = make_workspace()
    make_relation(make_entity(other, "X"), make_entity(other, "Y"))

    assert entity_degrees(entity_ids=[entities["c"].pk]) == {entities["c"].pk: 1}


def _near(query, rng):
    """A unit vector at cosine 0.7-0.95 to `query`; random 384-d vectors sit at about 0 to it."""
    spread = rng.uniform(0.3, 1.0)
    vector = np.array(query) + spread * np.array(random_vector(rng))
    return (vector / np.linalg.norm(vector)).tolist()


def _fill_ten_workspaces(rng, query):
    """Ten workspaces with 30 entities, 29 relations and 30 chunks each. In every workspace the
    first five of each are near `query` and the rest random: the nearest rows overall are spread
    over all ten workspaces, so a search that ignored the workspace would return others' rows."""

    def vector(n):
        return _near(query, rng) if n < 5 else random_vector(rng)

    workspaces = []
    for index in range(10):
        workspace = make_workspace(slug=f"vec-{index}")
        document = make_document(workspace)
        entities = [make_entity(workspace, f"E{index}-{n}", embedding=vector(n)) for n in range(30)]
        for n in range(29):
            make_relation(entities[n], entities[n + 1], embedding=vector(n))
        for n in range(30):
            make_chunk(document, order=n, embedding=vector(n))
        workspace_refresh_counts(workspace_id=workspace.pk)
        workspace.refresh_from_db()
        workspaces.append(workspace)
    return workspaces


def _true_nearest(rows, query, k):
    matrix = np.array([row.embedding for row in rows])
    order = np.argsort(-(matrix @ np.array(query)), kind="stable")[:k]
    return [rows[i].pk for i in order]


@pytest.mark.parametrize("exact_scan_max", [1_000_000, 0], ids=["exact-scan", "hnsw"])
@pytest.mark.parametrize(
    ("selector", "rows_of"),
    [
        (entities_nearest, lambda ws: list(ws.entities.all())),
        (relations_nearest, lambda ws: list(ws.relations.all())),
        (chunks_nearest, lambda ws: list(ws.chunks.all())),
    ],
    ids=["entities", "relations", "chunks"],
)
def test_it_finds_the_true_nearest_rows_of_one_workspace_among_ten(
    db, settings, selector, rows_of, exact_scan_max, django_assert_num_queries
):
    settings.VECTOR_EXACT_SCAN_MAX = exact_scan_max
    rng = np.random.default_rng(7)
    query = random_vector(rng)
    workspaces = _fill_ten_workspaces(rng, query)
    target = workspaces[3]

    with django_assert_num_queries(1):
        found = selector(workspace=target, vector=query, k=5)

    # The HNSW path is exact here too: its worst case, random vectors all nearly equidistant,
    # made recall a matter of the index's random levels (3 of 5 in one CI run); the near rows
    # are what a search must not miss, and the graph leads to them from any entry point.
    assert [row.pk for row in found] == _true_nearest(rows_of(target), query, 5)
    assert {row.workspace_id for row in found} == {target.pk}
    assert [row.distance for row in found] == sorted(row.distance for row in found)


@pytest.mark.parametrize(
    ("selector", "k"), [(entities_nearest, 5), (relations_nearest, 4)], ids=["entities", "relations"]
)
def test_the_index_scan_goes_on_until_it_has_a_small_workspaces_rows(db, settings, selector, k):
    # The path of a workspace above the threshold, on the HNSW index, for a workspace whose rows
    # are 5 of 1,506 (4 of 1,504 relations): the first hnsw.ef_search (200) candidates hold about one of them, which is
    # all pgvector < 0.8 returned. Iterative scans (settings.HNSW_ITERATIVE_SCAN) find them all.
    #
    # The vectors lie in a 16-dimensional subspace, as real embeddings gather on few directions.
    # Uniform 384-d vectors, all nearly equidistant, are HNSW's hard case: some nodes are hard to
    # reach, and in one full run the scan came back with 4 of the 5. (The index also holds the
    # rows earlier tests rolled back, until a vacuum; they lie far from this subspace.)
    settings.VECTOR_EXACT_SCAN_MAX = 0
    rng = np.random.default_rng(11)
    basis = np.linalg.qr(rng.normal(size=(settings.EMBEDDING_DIM, 16)))[0].T

    def vector():
        point = rng.normal(size=16) @ basis
        return (point / np.linalg.norm(point)).tolist()

    big = make_workspace(slug="big")
    crowd = Entity.objects.bulk_create(
        Entity(workspace=big, name=f"B{n}", key=f"b{n}", type="concept", embedding=vector()) for n in range(1501)
    )
    Relation.objects.bulk_create(
        Relation(workspace=big, source=crowd[n], target=crowd[n + 1], embedding=vector()) for n in range(1500)
    )
    small = make_workspace(slug="small")
    entities = [make_entity(small, f"S{n}", embedding=vector()) for n in range(5)]
    for n in range(4):
        make_relation(entities[n], entities[n + 1], embedding=vector())
    workspace_refresh_counts(workspace_id=small.pk)
    small.refresh_from_db()
    with connection.cursor() as cursor:
        # Small as it is, the planner would read the workspace's rows; this leaves it the index.
        cursor.execute("SET LOCAL enable_sort = off")

    with CaptureQueriesContext(connection) as queries:
        found = selector(workspace=small, vector=vector(), k=k)

    assert len(queries) == 1
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + queries[0]["sql"])
        assert "_embedding_hnsw" in " ".join(row[0] for row in cursor.fetchall())
    assert len(found) == k
    assert {row.workspace_id for row in found} == {small.pk}
    assert [row.distance for row in found] == sorted(row.distance for row in found)


def test_every_connection_scans_hnsw_iteratively(db, settings):
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('hnsw.iterative_scan'), current_setting('hnsw.max_scan_tuples')")
        assert cursor.fetchone() == (settings.HNSW_ITERATIVE_SCAN, str(settings.HNSW_MAX_SCAN_TUPLES))


def test_it_drops_rows_below_the_similarity_floor(workspace):
    rng = np.random.default_rng(1)
    near = random_vector(rng)
    make_entity(workspace, "Near", embedding=near)
    make_entity(workspace, "Far", embedding=[-x for x in near])

    found = entities_nearest(workspace=workspace, vector=near, k=10, min_similarity=0.5)

    assert [entity.name for entity in found] == ["Near"]


def test_words_find_chunks_of_one_workspace_only_and_fuse_with_the_vector_ranking(workspace):
    rng = np.random.default_rng(3)
    query = random_vector(rng)
    document = make_document(workspace)
    nearest = make_chunk(document, order=0, text="Unrelated words about lunch.", embedding=query)
    named = make_chunk(document, order=1, text="Set the SO_REUSEADDR option first.", embedding=random_vector(rng))
    both = make_chunk(document, order=2, text="SO_REUSEADDR lets a server restart: set SO_REUSEADDR.", embedding=query)
    other = make_workspace(slug="other")
    make_chunk(make_document(other), text="SO_REUSEADDR in another workspace.", embedding=query)
    for space in (workspace, other):
        workspace_refresh_counts(workspace_id=space.pk)
    workspace.refresh_from_db()

    found = chunks_nearest(workspace=workspace, vector=query, k=3, text="What does SO_REUSEADDR do?")

    # both: vector 2nd and words 1st; named: vector 3rd and words 2nd; nearest: vector 1st only.
    assert [chunk.pk for chunk in found] == [both.pk, named.pk, nearest.pk]
    assert [chunk.lexical_rank for chunk in found] == [1, 2, None]
    assert found[0].document_title == document.title
    assert [chunk.pk for chunk in chunks_nearest(workspace=workspace, vector=query, k=3, text="")][:2] == [
        nearest.pk,
        both.pk,
    ]


def test_only_identifier_like_words_search_the_text():
    assert identifier_terms("What is the PYTHONSTARTUP variable for?") == "'pythonstartup'"
    assert identifier_terms("Call setblocking(False), then functools.cmp_to_key and IPv4Interface") == (
        "'setblocking' | 'functools.cmp_to_key' | 'ipv4interface'"
    )
    assert identifier_terms("Where does the name of Python come from?") == ""


def test_a_name_finds_its_entity_exactly_then_names_holding_its_words(workspace):
    rng = np.random.default_rng(4)
    query = random_vector(rng)
    near = make_entity(workspace, "Near", embedding=query)
    exact = make_entity(workspace, "Ada Lovelace", embedding=random_vector(rng))
    longer = make_entity(workspace, "Ada Lovelace Institute", embedding=random_vector(rng))
    make_entity(workspace, "Lovelace", embedding=random_vector(rng))
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()

    found = entities_nearest(workspace=workspace, vector=query, k=3, names=["ada lovelace"])

    assert found[0].pk == exact.pk
    assert found[0].exact
    # "Lovelace" lacks a word of the name, so only its vector could bring it, and the vector's
    # second and third places rank no higher than the name's second.
    assert {entity.pk for entity in found} == {exact.pk, longer.pk, near.pk}
    assert entities_nearest(workspace=workspace, vector=query, k=1, names=[])[0].pk == near.pk


def test_neither_words_nor_names_find_what_is_not_published(workspace):
    rng = np.random.default_rng(5)
    query = random_vector(rng)
    make_entity(workspace, "Ada Lovelace", embedding=None, published=False)
    pending = make_chunk(make_document(workspace), text="SO_REUSEADDR is still in flight.", embedding=None)
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()

    assert entities_nearest(workspace=workspace, vector=query, k=3, names=["ada lovelace"]) == []
    assert pending.pk not in [c.pk for c in chunks_nearest(workspace=workspace, vector=query, k=3, text="SO_REUSEADDR")]


def test_it_gives_a_workspace_only_to_members_with_the_role(workspace, owner):
    viewer, stranger = make_user(), make_user()
    make_workspace(slug="elsewhere", members={stranger: Role.OWNER})
    workspace.memberships.create(user=viewer, role=Role.VIEWER)

    assert workspace_for_user(owner, "acme", Role.OWNER) == workspace
    assert workspace_for_user(viewer, "acme").role == Role.VIEWER
    for user, slug, role in [
        (viewer, "acme", Role.EDITOR),
        (stranger, "acme", Role.VIEWER),
        (AnonymousUser(), "acme", Role.VIEWER),
        (owner, "missing", Role.VIEWER),
        (owner, "elsewhere", Role.VIEWER),
    ]:
        with pytest.raises(Http404):
            workspace_for_user(user, slug, role)
