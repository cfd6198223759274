"""A scripted extraction model for ingestion tests: it answers from facts keyed by sentence."""

import re
import time

from knowledge.models import Entity, Relation, Workspace
from knowledge.rag import prompts

FACTS = {
    "Alice Smith founded Acme Corp.": [
        "entity<|>Alice Smith<|>person<|>Alice Smith is the founder of Acme Corp.",
        "entity<|>Acme Corp<|>organization<|>Acme Corp was founded by Alice Smith.",
        "relation<|>Alice Smith<|>Acme Corp<|>founding<|>Alice Smith founded Acme Corp.<|>8",
    ],
    "Acme Corp is based in Berlin.": [
        "entity<|>Acme Corp<|>organization<|>Acme Corp is based in Berlin.",
        "entity<|>Berlin<|>location<|>Berlin is home to Acme Corp.",
        "relation<|>Acme Corp<|>Berlin<|>headquarters<|>Acme Corp is based in Berlin.<|>6",
    ],
    "Bob Jones works for Acme Corp.": [
        "entity<|>Bob Jones<|>person<|>Bob Jones works for Acme Corp.",
        "entity<|>ACME corp<|>organization<|>Acme Corp employs Bob Jones.",
        "relation<|>Bob Jones<|>ACME corp<|>employment<|>Bob Jones works for Acme Corp.<|>7",
    ],
    "Alice Smith still advises Acme Corp.": [
        'entity<|>"Alice Smith"<|>person<|>Alice Smith advises Acme Corp.',
        "entity<|>Acme Corp<|>product<|>Acme Corp takes advice from its founder.",
        "relation<|>Acme Corp<|>Alice Smith<|>advice<|>Alice Smith advises Acme Corp.<|>3",
    ],
}
DOC_A = "Alice Smith founded Acme Corp.\n\nAcme Corp is based in Berlin."
DOC_B = "Bob Jones works for Acme Corp.\n\nAlice Smith still advises Acme Corp."
GLEANED = {"Bob Jones works for Acme Corp.": ["entity<|>Bob Jones<|>person<|>Bob Jones is an engineer."]}


def _chunk_text(body: dict) -> str:
    user = body["messages"][1]["content"]
    return user.removeprefix("Text:\n").removesuffix("\n\nOutput:")


def answer(body: dict) -> str:
    """Extraction, gleaning and summary answers, all deterministic."""
    system = body["messages"][0]["content"]
    if system.startswith("You merge descriptions"):
        fragments = re.findall(r"^- (.*)$", body["messages"][1]["content"], flags=re.M)
        return "Summary: " + " / ".join(fragments)
    text = _chunk_text(body)
    facts = FACTS if len(body["messages"]) == 2 else GLEANED
    lines = [line for sentence, found in facts.items() if sentence in text for line in found]
    return "\n".join([*lines, prompts.DONE_MARKER])


def graph_dump(workspace) -> dict:
    """Everything a user could see of the graph, keyed by names rather than ids."""
    entities = {
        entity.key: {
            "name": entity.name,
            "type": entity.type,
            "description": entity.description,
            "has_vector": entity.embedding is not None,
            "published": entity.published,
            "sources": sorted(
                (source.chunk.document.title, source.chunk.order, source.description)
                for source in entity.sources.select_related("chunk__document")
            ),
        }
        for entity in Entity.objects.filter(workspace=workspace)
    }
    relations = {
        tuple(sorted((relation.source.key, relation.target.key))): {
            "weight": relation.weight,
            "keywords": relation.keywords,
            "description": relation.description,
            "has_vector": relation.embedding is not None,
            "published": relation.published,
            "sources": sorted(
                (source.chunk.document.title, source.chunk.order, source.description, source.strength)
                for source in relation.sources.select_related("chunk__document")
            ),
        }
        for relation in Relation.objects.filter(workspace=workspace).select_related("source", "target")
    }
    return {"entities": entities, "relations": relations}


# A long document of numbered meetings, for runs that must be interrupted or overtaken.
PARTS = 40
LINE = "Part {index:02d}: Person {prefix}{index:02d} meets Shared Person."
MEETING = re.compile(r"Person ([A-Z]\d\d) meets Shared Person\.")


def parts(prefix: str = "A", count: int = PARTS) -> str:
    return "\n".join(LINE.format(index=index, prefix=prefix) for index in range(count))


def meetings(body: dict, delay: float = 0.0) -> str:
    """Extraction answers for the numbered parts; slow enough, with `delay`, to be interrupted."""
    system = body["messages"][0]["content"]
    if system.startswith("You merge descriptions"):
        return "Summary: " + " / ".join(re.findall(r"^- (.*)$", body["messages"][1]["content"], flags=re.M))
    if len(body["messages"]) > 2:
        return prompts.DONE_MARKER
    time.sleep(delay)
    lines = []
    for person in MEETING.findall(body["messages"][1]["content"]):
        lines += [
            f"entity<|>Person {person}<|>person<|>Person {person} took part in meeting {person}.",
            f"entity<|>Shared Person<|>person<|>Shared Person met Person {person}.",
            f"relation<|>Person {person}<|>Shared Person<|>meeting<|>They met at meeting {person}.<|>2",
        ]
    return "\n".join([*lines, prompts.DONE_MARKER])


def small_chunks(workspace: Workspace) -> Workspace:
    Workspace.objects.filter(pk=workspace.pk).update(chunk_token_size=14, chunk_overlap_tokens=0)
    workspace.refresh_from_db()
    return workspace
