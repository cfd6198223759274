"""A small hand-built graph whose vectors are chosen so every ranking rule shows, and helpers to query it."""

import math

from django.conf import settings

from knowledge.models import EntitySource, RelationSource
from knowledge.rag.retrieval import Keywords, QueryVectors, retrieve
from knowledge.services.workspaces import workspace_refresh_counts
from tests.factories import make_chunk, make_document, make_entity, make_relation

LOW, HIGH, QUESTION, ELSEWHERE = 0, 1, 2, 3


def leaning(axis: int, similarity: float, *, away: int = ELSEWHERE) -> list[float]:
    """A unit vector whose cosine with the `axis` basis vector is `similarity`."""
    vector = [0.0] * settings.EMBEDDING_DIM
    vector[axis] = similarity
    vector[away] = math.sqrt(1 - similarity**2)
    return vector


def axis(index: int) -> list[float]:
    return leaning(index, 1.0)


VECTORS = QueryVectors(low_level=axis(LOW), high_level=axis(HIGH), question=axis(QUESTION))
KEYWORDS = Keywords(high_level=("collaboration",), low_level=("Alice", "Bob"))


def ask(workspace, mode="mix", question="Who works with whom?", **options):
    options.setdefault("keywords", KEYWORDS)
    options.setdefault("vectors", VECTORS)
    return retrieve(workspace=workspace, question=question, mode=mode, **options)


def build_team_graph(workspace):
    """Alice, Bob and Carol match the low-level vector (0.9, 0.8, 0.7) with degrees 1, 3 and 2.

    Edges: Alice-Dave, Bob-Carol, Bob-Erin, Bob-Frank, Carol-Gina. Erin, Frank, Dave and Gina
    are far from every query. Only the Bob-Erin and Carol-Gina relations match the high-level vector.
    """
    far = axis(ELSEWHERE)
    names = {"Alice": leaning(LOW, 0.9), "Bob": leaning(LOW, 0.8), "Carol": leaning(LOW, 0.7)}
    names |= dict.fromkeys(["Dave", "Erin", "Frank", "Gina"], far)
    e = {
        name: make_entity(workspace, name, embedding=vector, description=f"{name} is a person.")
        for name, vector in names.items()
    }
    r = {
        "Alice-Dave": make_relation(e["Alice"], e["Dave"], weight=9, embedding=far),
        "Bob-Carol": make_relation(e["Bob"], e["Carol"], weight=1, embedding=far),
        "Bob-Erin": make_relation(e["Bob"], e["Erin"], weight=2, embedding=leaning(HIGH, 0.9)),
        "Bob-Frank": make_relation(e["Bob"], e["Frank"], weight=5, embedding=far),
        "Carol-Gina": make_relation(e["Carol"], e["Gina"], weight=7, embedding=leaning(HIGH, 0.6)),
    }
    for relation in r.values():
        relation.description = f"{relation.source.name} works with {relation.target.name}."
        relation.keywords = "collaboration"
        relation.save()
    document = make_document(workspace, title="Team notes")
    c = {
        "alice-only": make_chunk(document, order=0, text="Alice joined in 2020.", embedding=far),
        "shared": make_chunk(document, order=1, text="Alice, Bob and Carol met Dave.", embedding=far),
        "erin": make_chunk(document, order=2, text="Bob and Erin pair daily.", embedding=far),
        "unlinked": make_chunk(document, order=3, text="The office is in Berlin.", embedding=axis(QUESTION)),
    }
    for chunk_name, entity_names in {
        "alice-only": ["Alice"],
        "shared": ["Alice", "Bob", "Carol", "Dave"],
        "erin": ["Bob", "Erin"],
    }.items():
        for name in entity_names:
            EntitySource.objects.create(
                entity=e[name], chunk=c[chunk_name], name=name, description=f"{name} in {chunk_name}"
            )
    RelationSource.objects.create(relation=r["Alice-Dave"], chunk=c["shared"], description="Alice met Dave.")
    RelationSource.objects.create(relation=r["Bob-Erin"], chunk=c["erin"], description="Bob pairs with Erin.")
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()
    return e, r, c


SCIENCE = {
    "Marie Curie": "Marie Curie was a physicist and chemist who discovered radium and polonium.",
    "Pierre Curie": "Pierre Curie was a physicist who studied magnetism and radioactivity.",
    "Sourdough": "Sourdough bread is leavened with a fermented starter of flour and water.",
}
SCIENCE_TEXT = (
    "Marie Curie discovered radium in 1898 together with Pierre Curie. "
    "The Curies shared the Nobel Prize in Physics in 1903. "
    "Sourdough bakers keep their starter alive for years."
)


def build_science_graph(workspace):
    """Three entities embedded by the real embedding model, one document and its provenance."""
    from knowledge.rag.llm import embed

    vectors = embed([*(f"{name}: {text}" for name, text in SCIENCE.items()), SCIENCE_TEXT], purpose="passage")
    entities = {
        name: make_entity(workspace, name, type="person", description=text, embedding=vector)
        for (name, text), vector in zip(SCIENCE.items(), vectors, strict=False)
    }
    relation = make_relation(
        entities["Marie Curie"],
        entities["Pierre Curie"],
        weight=3,
        embedding=embed(["Marie and Pierre Curie discovered radium together."], purpose="passage")[0],
        description="Marie and Pierre Curie discovered radium together.",
        keywords="discovery, collaboration",
    )
    chunk = make_chunk(make_document(workspace, title="History of radium"), text=SCIENCE_TEXT, embedding=vectors[-1])
    for name in ["Marie Curie", "Pierre Curie"]:
        EntitySource.objects.create(entity=entities[name], chunk=chunk, name=name, description=SCIENCE[name])
    RelationSource.objects.create(relation=relation, chunk=chunk, description=relation.description)
    workspace_refresh_counts(workspace_id=workspace.pk)
    workspace.refresh_from_db()
    return entities
