"""Fixtures of the knowledge tests.

`served*`: one daphne per test module, serving the test database with the OpenAI double as its
model, for the tests that drive our OpenAI, Ollama and MCP APIs with their real client libraries.

The team graph's query texts are embedded onto the axes its vectors lean towards, and the
double answers the keyword call with the graph's keywords and every answer call with ANSWER.
"""

import json

import pytest
from django.conf import settings

from knowledge.models import Role
from knowledge.services.api_tokens import api_token_create
from tests.factories import make_user, make_workspace
from tests.knowledge.team_graph import HIGH, LOW, QUESTION, axis, build_team_graph
from tests.openai_double import OpenAIDouble
from tests.processes import daphne, process_env

QUESTION_TEXT = "Who works with whom?"
ANSWER = "Bob works with Carol [R1]; they met Alice [S2]."
# The served process's question limit: an hour's window, so a test that spends it in this process
# and asks daphne right after meets the same window.
SERVED_ASK_LIMIT = (1000, 3600)
KEYWORDS = {"high_level_keywords": ["collaboration"], "low_level_keywords": ["Alice", "Bob"]}


def answers(body: dict) -> str:
    """The double's reply: the keywords to a keyword call, ANSWER to anything else."""
    system = str(body["messages"][0].get("content") or "")
    return json.dumps(KEYWORDS) if "high_level_keywords" in system else ANSWER


@pytest.fixture(scope="module")
def served_model():
    double = OpenAIDouble(dim=settings.EMBEDDING_DIM).start()
    axes = {"Alice, Bob": axis(LOW), "collaboration": axis(HIGH), QUESTION_TEXT: axis(QUESTION)}
    default = double.embedding_handler
    double.embedding_handler = lambda text: axes.get(text) or default(text)
    yield double
    double.stop()


@pytest.fixture
def served_double(served_model):
    """The module's double, reset for each test."""
    served_model.clear()
    served_model.reply(answers)
    served_model.token_delay = 0.0
    served_model.hold_last_token = None
    return served_model


@pytest.fixture(scope="module")
def served(served_model, django_db_setup):
    env = process_env(
        LLM_BASE_URL=served_model.base_url,
        LLM_API_KEY="test-key",
        LLM_MODEL="double-chat",
        EMBEDDING_BASE_URL=served_model.base_url,
        EMBEDDING_API_KEY="test-key",
        EMBEDDING_MODEL="double-embed",
        LLM_RETRY_BACKOFF=0,
        LLM_MAX_RETRIES=0,
        RATE_LIMIT_ASK=f"{SERVED_ASK_LIMIT[0]}/hour",
    )
    with daphne(env) as process:
        yield process


@pytest.fixture
def served_team(transactional_db, served, served_double):
    """The acme workspace with the team graph; its owner's token, and a stranger's."""
    owner, stranger = make_user("owner"), make_user("stranger")
    workspace = make_workspace(slug="acme", name="Acme", members={owner: Role.OWNER})
    make_workspace(slug="hidden", name="Hidden", members={stranger: Role.OWNER})
    make_workspace(slug="empty", name="Empty", members={owner: Role.VIEWER})
    entities, _relations, chunks = build_team_graph(workspace)
    return {
        "entities": entities,
        "chunks": chunks,
        "url": served.url,
        "workspace": workspace,
        "token": api_token_create(user=owner, name="tests")[1],
        "stranger_token": api_token_create(user=stranger, name="tests")[1],
    }
