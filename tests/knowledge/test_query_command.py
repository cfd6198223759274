import json
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from knowledge.models import ApiToken
from knowledge.services.api_tokens import user_for_api_token
from tests.knowledge.team_graph import build_science_graph

# The ask service retrieves on pool threads with connections of their own, which see only what
# is committed.
pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def science(workspace, settings):
    settings.LLM_BASE_URL = settings.LLM_API_KEY = ""
    return build_science_graph(workspace)


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=StringIO())
    return out.getvalue()


def test_it_prints_a_cited_answer_and_its_sources(science):
    output = run("query", "--workspace", "acme", "--mode", "local", "Who discovered radium?")

    assert output.startswith("- ")
    assert "Marie Curie discovered radium in 1898 together with Pierre Curie. [S1]" in output
    assert "\nSources:\n  [S1] History of radium, characters 0-" in output


def test_it_prints_everything_as_one_json_object(science):
    output = run("query", "--workspace", "acme", "--mode", "mix", "--top-k", "2", "--json", "Who discovered radium?")

    data = json.loads(output)
    assert set(data) >= {
        "answer",
        "mode",
        "keywords",
        "entities",
        "relations",
        "chunks",
        "citations",
        "subgraph",
        "stats",
    }
    assert data["mode"] == "mix"
    assert data["entities"][0]["name"] == "Marie Curie"
    assert len(data["entities"]) <= 3
    assert data["stats"]["sql_queries"] > 0
    assert set(data["stats"]["timings"]) >= {"keywords", "embedding", "search", "graph", "lookups", "context"}
    assert "[S1]" in data["answer"]


def test_it_prints_only_the_context_when_asked(science):
    output = run("query", "--workspace", "acme", "--mode", "global", "--context-only", "Who discovered radium?")

    assert output.startswith("-----Entities-----")
    assert "Marie and Pierre Curie discovered radium together." in output
    assert "[S1]" not in output


def test_it_refuses_an_unknown_workspace(db):
    with pytest.raises(CommandError, match="No workspace with slug 'nope'"):
        run("query", "--workspace", "nope", "Anything?")


def test_it_creates_an_api_token_shown_once(owner):
    secret = run("create_api_token", "--user", "owner", "--name", "ci-bot").strip()

    token = ApiToken.objects.get()
    assert token.name == "ci-bot"
    assert secret not in token.token_hash
    assert user_for_api_token(secret) == owner
    assert user_for_api_token(secret + "x") is None


def test_it_refuses_a_token_for_an_unknown_user(db):
    with pytest.raises(CommandError, match="No user named 'ghost'"):
        run("create_api_token", "--user", "ghost", "--name", "x")


def test_it_lists_every_row_of_a_grouped_citation(workspace, openai_double, settings):
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    build_science_graph(workspace)
    keywords = {"high_level_keywords": ["discovery"], "low_level_keywords": ["radium", "Marie Curie"]}
    openai_double.reply(
        lambda body: "Marie Curie discovered radium [S1, E1]." if body.get("stream") else json.dumps(keywords)
    )

    output = run("query", "--workspace", "acme", "--mode", "local", "Who discovered radium?")

    sources = output.split("\nSources:\n", 1)[1]
    assert sources.startswith("  [S1] ")
    assert "\n  [E1] Marie Curie: " in sources
