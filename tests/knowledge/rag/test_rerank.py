import pytest

from tests.knowledge.team_graph import ask, build_team_graph
from tests.rerank_double import RerankDouble


@pytest.fixture
def graph(workspace):
    return build_team_graph(workspace)


def erin_first(query: str, document: str) -> float:
    return 1.0 if "Erin" in document else 0.0


@pytest.fixture
def reranker(settings):
    double = RerankDouble(score=erin_first).start()
    settings.RERANK_BASE_URL = double.base_url
    settings.RERANK_MODEL = "double-rerank"
    settings.RERANK_API_KEY = "rerank-key"
    yield double
    double.stop()


def test_without_a_reranker_nothing_is_sent_and_the_fused_order_stays(graph, workspace, settings):
    assert settings.RERANK_BASE_URL == ""

    result = ask(workspace, "mix")

    assert "rerank" not in result.stats
    assert result.chunks[0].text == "The office is in Berlin."


def test_the_reranker_orders_the_sources_by_its_scores(graph, workspace, reranker):
    result = ask(workspace, "mix")

    assert result.stats["rerank"] == "applied"
    assert result.chunks[0].text == "Bob and Erin pair daily."
    assert [row.id for row in result.chunks] == [f"S{i}" for i in range(1, len(result.chunks) + 1)]
    body, headers = reranker.requests[0]
    assert body["query"] == "Who works with whom?"
    assert body["model"] == "double-rerank"
    assert headers["Authorization"] == "Bearer rerank-key"
    assert sorted(body["documents"]) == sorted(row.text for row in result.chunks)
    assert body["top_n"] == len(result.chunks)


def test_a_tei_reranker_answering_a_bare_list_is_understood(graph, workspace, settings):
    double = RerankDouble(tei=True, score=erin_first).start()
    settings.RERANK_BASE_URL = double.base_url
    try:
        result = ask(workspace, "mix")
    finally:
        double.stop()

    assert result.chunks[0].text == "Bob and Erin pair daily."


def test_a_failing_reranker_keeps_the_fused_order_and_says_so(graph, workspace, reranker):
    reranker.fail(1, status=503)

    result = ask(workspace, "mix")

    assert result.stats["rerank"].startswith("failed: The reranker at RERANK_BASE_URL")
    assert "503" in result.stats["rerank"]
    assert result.chunks[0].text == "The office is in Berlin."


def test_reranking_costs_no_sql_query(graph, workspace, reranker, django_assert_num_queries):
    with django_assert_num_queries(1):
        result = ask(workspace, "naive")

    assert result.stats["rerank"] == "applied"
