import re
import threading

import pytest
from django.db import transaction

from knowledge.models import EntitySource
from knowledge.rag.llm import embed
from knowledge.rag.retrieval import MODES, Budgets, Keywords, concurrent, nlp_keywords, parse_keywords, retrieve
from knowledge.rag.retrieval.searches import relations_among_entities
from knowledge.services.workspaces import workspace_refresh_counts
from tests.factories import make_chunk, make_document, make_entity, make_relation, make_workspace
from tests.knowledge.team_graph import ELSEWHERE, LOW, QUESTION, ask, axis, build_team_graph


@pytest.fixture
def graph(workspace):
    return build_team_graph(workspace)


def names(rows):
    return [row.name for row in rows]


def pairs(rows):
    return [f"{row.source}-{row.target}" for row in rows]


def test_it_ranks_local_entities_by_degree_not_similarity(graph, workspace):
    result = ask(workspace, "local")

    assert names(result.entities) == ["Bob", "Carol", "Alice"]
    assert [row.rank for row in result.entities] == [3, 2, 1]


def test_it_ranks_one_hop_relations_by_edge_rank_then_weight(graph, workspace):
    result = ask(workspace, "local")

    # Edge ranks: Bob-Carol 5, Bob-Frank 4, Bob-Erin 4, Carol-Gina 3, Alice-Dave 2.
    assert pairs(result.relations) == ["Bob-Carol", "Bob-Frank", "Bob-Erin", "Carol-Gina", "Alice-Dave"]
    assert [row.rank for row in result.relations] == [5, 4, 4, 3, 2]


def test_it_ranks_global_relations_by_edge_rank_and_adds_their_endpoints(graph, workspace):
    result = ask(workspace, "global")

    assert pairs(result.relations) == ["Bob-Erin", "Carol-Gina"]
    assert names(result.entities) == ["Bob", "Erin", "Carol", "Gina"]
    assert [row.rank for row in result.entities] == [3, 1, 2, 1]


def test_the_walk_puts_first_the_passage_that_mentions_the_most_found_entities(graph, workspace):
    result = ask(workspace, "local")

    assert result.chunks[0].text == "Alice, Bob and Carol met Dave."
    assert {row.text for row in result.chunks} == {
        "Alice, Bob and Carol met Dave.",
        "Bob and Erin pair daily.",
        "Alice joined in 2020.",
    }
    assert {row.found_by for row in result.chunks} == {"graph"}


def test_global_walks_from_the_endpoints_of_the_relations_it_found(graph, workspace):
    result = ask(workspace, "global")

    assert [row.text for row in result.chunks] == ["Bob and Erin pair daily.", "Alice, Bob and Carol met Dave."]


def test_it_interleaves_local_and_global_rows_in_hybrid_mode(graph, workspace):
    result = ask(workspace, "hybrid")

    assert names(result.entities) == ["Bob", "Carol", "Erin", "Alice", "Gina"]
    assert pairs(result.relations) == ["Bob-Carol", "Bob-Erin", "Bob-Frank", "Carol-Gina", "Alice-Dave"]


def test_it_adds_the_chunk_vector_search_in_mix_mode(graph, workspace):
    hybrid, mix = ask(workspace, "hybrid"), ask(workspace, "mix")

    assert "The office is in Berlin." not in [row.text for row in hybrid.chunks]
    assert mix.chunks[0].text == "The office is in Berlin."
    assert mix.chunks[0].found_by == "search"
    assert {row.text for row in hybrid.chunks} < {row.text for row in mix.chunks}
    assert names(mix.entities) == names(hybrid.entities)


@pytest.mark.parametrize(
    ("mode", "kinds"),
    [
        ("local", {"entities", "relations", "chunks"}),
        ("global", {"entities", "relations", "chunks"}),
        ("hybrid", {"entities", "relations", "chunks"}),
        ("mix", {"entities", "relations", "chunks"}),
        ("naive", {"chunks"}),
        ("bypass", set()),
    ],
)
def test_it_returns_the_kinds_of_rows_of_each_mode(graph, workspace, mode, kinds):
    result = ask(workspace, mode)

    found = {kind for kind in ("entities", "relations", "chunks") if getattr(result, kind)}
    assert found == kinds
    if mode == "naive":
        assert [row.found_by for row in result.chunks] == ["search"]


def test_it_cites_only_rows_that_are_in_the_context(graph, workspace):
    result = ask(workspace, "mix")

    ids = [citation["id"] for citation in result.citations]
    assert ids == [row.id for row in [*result.entities, *result.relations, *result.chunks]]
    for row_id in ids:
        assert re.search(rf"^{row_id},", result.context, re.MULTILINE), row_id
    by_label = {citation["label"]: citation for citation in result.citations}
    assert by_label["Alice"]["document_title"] == "Team notes"
    assert by_label["Alice"]["excerpt"] == "Alice in shared"
    assert by_label["Alice"]["chunk_id"] == graph[2]["shared"].pk
    assert by_label["Gina"]["chunk_id"] is None
    assert by_label["Gina"]["excerpt"] == "Gina is a person."


def test_it_drops_whole_rows_to_fit_each_budget(graph, workspace):
    full = ask(workspace, "hybrid")
    tight = ask(workspace, "hybrid", budgets={"entities": 60, "relations": 80})

    assert 0 < len(tight.entities) < len(full.entities)
    assert 0 < len(tight.relations) < len(full.relations)
    assert names(tight.entities) == names(full.entities)[: len(tight.entities)]
    assert tight.stats["tokens"]["entities"] <= 60
    assert tight.stats["tokens"]["relations"] <= 80
    for row in tight.entities:
        assert f"{row.id},{row.name},{row.type},{row.description},{row.rank}\n" in tight.context
    for row in full.entities[len(tight.entities) :]:
        assert row.name not in tight.context.split("-----Relationships-----")[0]


def test_it_gives_the_sources_what_the_total_budget_leaves(graph, workspace):
    full = ask(workspace, "mix")
    tokens = full.stats["tokens"]
    total = tokens["prompt_overhead"] + tokens["entities"] + tokens["relations"] + tokens["chunks"] - 1

    result = ask(workspace, "mix", budgets=Budgets(total=total))

    assert [row.chunk_id for row in result.chunks] == [row.chunk_id for row in full.chunks][:-1]
    assert result.stats["tokens"]["context"] <= total - tokens["prompt_overhead"]


def test_it_draws_the_retrieved_subgraph(graph, workspace):
    e, r, _ = graph
    result = ask(workspace, "local")

    nodes = {node["label"]: node for node in result.subgraph["nodes"]}
    assert list(nodes)[:3] == ["Bob", "Carol", "Alice"]
    assert set(nodes) == {"Alice", "Bob", "Carol", "Dave", "Erin", "Frank", "Gina"}
    assert nodes["Bob"]["degree"] == 3
    assert nodes["Bob"]["row"] == "E1"
    assert nodes["Dave"]["row"] is None
    edge_ids = {edge["id"] for edge in result.subgraph["edges"]}
    assert edge_ids == {f"r{relation.pk}" for relation in r.values()}


@pytest.mark.parametrize("mode", ["local", "global", "hybrid", "mix"])
def test_it_describes_every_node_and_edge_of_the_subgraph_from_what_it_read(graph, workspace, mode):
    e, r, _ = graph
    result = ask(workspace, mode)

    assert result.subgraph["nodes"]
    for node in result.subgraph["nodes"]:
        assert node["description"] == f"{node['label']} is a person."
    descriptions = {f"r{relation.pk}": relation.description for relation in r.values()}
    for edge in result.subgraph["edges"]:
        assert edge["description"] == descriptions[edge["id"]]


def test_it_never_retrieves_from_another_workspace(graph, workspace):
    other = make_workspace(slug="other")
    secret = make_entity(other, "Zebulon", embedding=axis(LOW), description="Zebulon is a secret.")
    secret_doc = make_document(other, title="Secret")
    chunk = make_chunk(secret_doc, text="Zebulon's plans.", embedding=axis(QUESTION))
    EntitySource.objects.create(entity=secret, chunk=chunk, name="Zebulon")
    workspace_refresh_counts(workspace_id=other.pk)

    for mode in MODES:
        result = ask(workspace, mode)
        assert "Zebulon" not in result.context
        assert "Zebulon" not in str(result.to_json())


@pytest.mark.parametrize(
    ("mode", "queries"), [("bypass", 0), ("naive", 1), ("global", 4), ("local", 5), ("hybrid", 6), ("mix", 7)]
)
@pytest.mark.parametrize("top_k", [5, 60])
def test_it_builds_each_context_in_a_fixed_number_of_queries(
    graph, workspace, mode, queries, top_k, django_assert_num_queries
):
    with django_assert_num_queries(queries):
        result = ask(workspace, mode, top_k=top_k, chunk_top_k=top_k)

    assert result.stats["sql_queries"] == queries


def _comparable(result) -> dict:
    data = result.to_json(include_context=True)
    data["stats"] = {name: value for name, value in data["stats"].items() if name != "timings"}
    return data


def test_outside_a_transaction_the_independent_queries_run_on_pool_threads_with_the_same_result(
    graph, workspace, transactional_db, monkeypatch
):
    threads = []
    run_on_pool = concurrent._on_own_connection

    def spy(call, wrapper):
        threads.append(threading.current_thread().name)
        return run_on_pool(call, wrapper)

    monkeypatch.setattr(concurrent, "_on_own_connection", spy)
    for mode, queries in [("global", 4), ("local", 5), ("hybrid", 6), ("mix", 7)]:
        threads.clear()
        side_by_side = ask(workspace, mode)
        assert threads, mode
        assert all(name.startswith("retrieval") for name in threads)
        with transaction.atomic():
            threads.clear()
            one_connection = ask(workspace, mode)
            assert threads == []

        assert _comparable(side_by_side) == _comparable(one_connection)
        assert side_by_side.stats["sql_queries"] == queries


def test_it_parses_keywords_from_a_chatty_fenced_reply():
    reply = (
        "Sure! Here you go:\n```json\n"
        '{"high_level_keywords": ["trade policy"], "low_level_keywords": "tariffs, Germany"}\n'
        "```\nHope it helps {"
    )

    keywords = parse_keywords(reply)

    assert keywords == Keywords(high_level=("trade policy",), low_level=("tariffs", "Germany"), source="llm")
    assert parse_keywords("I cannot help with that.") is None


def test_it_extracts_keywords_without_a_model():
    keywords = nlp_keywords("How did Alice Smith influence the growth of Acme Corporation in Berlin?")

    assert keywords.low_level == ("Alice Smith", "growth", "Acme Corporation", "Berlin")
    # The themes: what the question names; the verb it asks with is no theme.
    assert keywords.high_level == ("Alice Smith", "growth", "Acme Corporation", "Berlin")


def test_verbs_never_become_high_level_keywords():
    keywords = nlp_keywords("Do the two versions of the travel policy differ, and does a waiver exist?")

    assert not {"differ", "exist", "do"} & {keyword.casefold() for keyword in keywords.high_level}
    assert "the travel policy" in keywords.high_level or "travel policy" in keywords.high_level


def test_it_finds_entities_through_real_embeddings_end_to_end(workspace):
    texts = {
        "Marie Curie": "Marie Curie was a physicist who discovered radium and polonium.",
        "Sourdough": "Sourdough bread is leavened with a fermented starter.",
        "Volcano": "A volcano is a rupture in the crust where lava escapes.",
    }
    vectors = embed([f"{name}: {text}" for name, text in texts.items()], purpose="passage")
    for (name, text), vector in zip(texts.items(), vectors, strict=True):
        make_entity(workspace, name, description=text, embedding=vector)
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()

    result = retrieve(workspace=workspace, question="Who discovered radium?", mode="local", top_k=1)

    assert result.keywords.source == "nlp"
    assert names(result.entities) == ["Marie Curie"]


def _located_chunk(workspace, text, *, section="", location="", anchor="", page=None):
    from knowledge.models import Chunk

    chunk = make_chunk(make_document(workspace, title="report.pdf"), text=text, embedding=axis(ELSEWHERE))
    Chunk.objects.filter(pk=chunk.pk).update(
        section=section, location=location, anchor=anchor, page_start=page, page_end=page
    )
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()
    return chunk


def test_a_question_naming_an_identifier_finds_its_chunk_first_though_its_vector_is_far(graph, workspace):
    startup = _located_chunk(workspace, "Set PYTHONSTARTUP to the name of a file of start-up commands.")

    for mode in ("naive", "mix"):
        result = ask(workspace, mode, question="What is PYTHONSTARTUP for?")

        assert result.chunks[0].chunk_id == startup.pk, mode
    assert ask(workspace, "naive").chunks[0].text == "The office is in Berlin."


def test_an_identifier_with_dots_and_underscores_matches_as_a_phrase(graph, workspace):
    annotations = _located_chunk(workspace, "Call inspect.get_annotations() to read the annotations dict.")
    _located_chunk(workspace, "To inspect a value, get the annotations from its type.")

    result = ask(workspace, "naive", question="What does inspect.get_annotations do?")

    assert result.chunks[0].chunk_id == annotations.pk


def test_a_low_level_keyword_naming_an_entity_exactly_retrieves_it_whatever_its_vector(graph, workspace):
    vector_only = ask(workspace, "local", top_k=3)
    named = ask(workspace, "local", top_k=3, keywords=Keywords(high_level=(), low_level=("gina",)))

    assert "Gina" not in names(vector_only.entities)
    assert "Gina" in names(named.entities)
    assert len(named.entities) == 3


def test_sources_and_citations_say_where_a_chunk_sits(graph, workspace):
    _located_chunk(
        workspace,
        "Dual-level retrieval uses low_level and high_level keywords.",
        section="2 Method > 2.3 Dual-level retrieval",
        location="p. 4",
        anchor="page-4",
        page=4,
    )

    result = ask(workspace, "naive", question="How does dual-level retrieval use low_level keywords?")

    top = result.chunks[0]
    assert (top.section, top.location, top.page_start, top.anchor) == (
        "2 Method > 2.3 Dual-level retrieval",
        "p. 4",
        4,
        "page-4",
    )
    assert "id,document,location,section,text\n" in result.context
    assert (
        "S1,report.pdf,p. 4,2 Method > 2.3 Dual-level retrieval,Dual-level retrieval uses low_level" in result.context
    )
    citation = result.citations[0]
    assert (citation["section"], citation["location"], citation["anchor"]) == (
        "2 Method > 2.3 Dual-level retrieval",
        "p. 4",
        "page-4",
    )


def test_a_pdf_citation_carries_the_right_page_and_section_end_to_end(workspace, settings):
    from knowledge.services import ingestion
    from tests.knowledge.documents import pdf_report

    workspace.chunk_token_size, workspace.chunk_overlap_tokens = 24, 0
    workspace.save()
    document = ingestion.document_create(workspace=workspace, filename="report.pdf", data=pdf_report(), enqueue=False)
    ingestion.document_ingest(document_id=document.pk)
    workspace.refresh_from_db()

    result = retrieve(
        workspace=workspace, question="What kinds of keywords does dual-level retrieval use?", mode="naive"
    )

    source = result.citations[0]
    assert "Dual-level retrieval uses two kinds of keywords." in source["excerpt"]
    assert (source["location"], source["section"], source["anchor"]) == (
        "p. 2",
        "2 Method > 2.3 Dual-level retrieval",
        "page-2",
    )


def test_the_relations_among_drawn_entities_are_found_from_hubs_and_from_the_rest(workspace):
    # Two hubs (more relations than entities drawn) and two entities of few relations.
    hub, other_hub, small, tiny = (make_entity(workspace, name) for name in ("Hub", "Other hub", "Small", "Tiny"))
    for i in range(6):
        leaf = make_entity(workspace, f"Leaf {i}")
        make_relation(hub, leaf)
        make_relation(other_hub, leaf)
    make_relation(hub, other_hub, weight=4.0)
    make_relation(hub, small, weight=3.0)
    make_relation(small, tiny, weight=2.0)
    make_relation(other_hub, tiny, weight=1.0, published=False)  # in flight: not drawn

    among = relations_among_entities(
        workspace=workspace, entity_ids=[hub.pk, other_hub.pk, small.pk, tiny.pk], limit=10
    )
    heaviest_two = relations_among_entities(
        workspace=workspace, entity_ids=[hub.pk, other_hub.pk, small.pk, tiny.pk], limit=2
    )

    drawn = [{row["source_id"], row["target_id"]} for row in among]
    assert drawn == [{hub.pk, other_hub.pk}, {hub.pk, small.pk}, {small.pk, tiny.pk}]
    assert [row["weight"] for row in heaviest_two] == [4.0, 3.0]
    assert relations_among_entities(workspace=workspace, entity_ids=[], limit=10) == []
