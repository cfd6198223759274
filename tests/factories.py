"""Small builders for test data. Vectors are deterministic and unit length."""

import itertools

import numpy as np
from django.conf import settings
from django.contrib.auth import get_user_model

from knowledge.models import Chunk, Document, Entity, Membership, Relation, Role, Workspace
from knowledge.rag.names import surface_form

_seq = itertools.count(1)


def make_user(username: str | None = None, password: str = "pw-for-tests-1", **extra):
    username = username or f"user{next(_seq)}"
    return get_user_model().objects.create_user(
        username=username, password=password, email=f"{username}@example.com", **extra
    )


def make_workspace(*, slug: str | None = None, members: dict | None = None, **extra) -> Workspace:
    slug = slug or f"ws-{next(_seq)}"
    workspace = Workspace.objects.create(name=extra.pop("name", slug.title()), slug=slug, **extra)
    for user, role in (members or {}).items():
        Membership.objects.create(user=user, workspace=workspace, role=role)
    return workspace


def random_vector(rng: np.random.Generator, dim: int | None = None) -> list[float]:
    vector = rng.normal(size=dim or settings.EMBEDDING_DIM)
    return (vector / np.linalg.norm(vector)).tolist()


def make_document(workspace: Workspace, *, title: str = "Doc", text: str = "Some text.") -> Document:
    return Document.objects.create(
        workspace=workspace, title=title, text=text, content_hash=f"hash-{next(_seq)}", status=Document.Status.PROCESSED
    )


def make_chunk(document: Document, *, order: int = 0, text: str = "chunk text", embedding=None) -> Chunk:
    return Chunk.objects.create(
        workspace=document.workspace,
        document=document,
        order=order,
        text=text,
        token_count=len(text.split()),
        char_start=0,
        char_end=len(text),
        embedding=embedding,
    )


def make_entity(
    workspace: Workspace, name: str, *, type: str = "concept", embedding=None, published: bool = True, **extra
) -> Entity:
    """A row of the graph as it is served (published); pass published=False for one still in flight."""
    return Entity.objects.create(
        workspace=workspace,
        name=name,
        key=name.casefold(),
        form=surface_form(name),
        type=type,
        embedding=embedding,
        published=published,
        **extra,
    )


def make_relation(
    a: Entity, b: Entity, *, weight: float = 1.0, embedding=None, published: bool = True, **extra
) -> Relation:
    source, target = sorted([a, b], key=lambda entity: entity.pk)
    return Relation.objects.create(
        workspace=a.workspace,
        source=source,
        target=target,
        weight=weight,
        embedding=embedding,
        published=published,
        **extra,
    )


__all__ = ["Role"]
