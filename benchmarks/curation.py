"""Curation and graph-browser costs on a synthetic graph.

    .venv/bin/python benchmarks/curation.py                       # 5000 entities, hubs of 500 relations
    .venv/bin/python benchmarks/curation.py --entities 20000 --hub 2000

Builds a workspace with `--entities` entities (random unit vectors, names with a share of
one-letter typos), two duplicate hubs with `--hub` relations each, and provenance for every row,
then times: the possible-duplicates scan, merging the two hubs, undoing that merge, one page of
the entity browser (degrees and document counts) and the graph view's top 2000 by degree.
Model calls (summaries, embeddings) go to the protocol-level OpenAI double, which answers at once,
so the numbers are the application's own cost. Runs in its own database (suffix
_bench_curation), dropped at the end unless --keep.
"""

import argparse
import os
import sys
import time
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(label: str, work):
    start = time.perf_counter()
    result = work()
    print(f"{label:<34} {time.perf_counter() - start:8.3f} s")
    return result


def name(rng: np.random.Generator, index: int) -> str:
    letters = "abcdefghijklmnopqrstuvwxyz"
    return "".join(rng.choice(list(letters), size=8)).title() + f" {index}"


def typo(text: str, rng: np.random.Generator) -> str:
    position = int(rng.integers(1, len(text) - 3))
    return text[:position] + text[position + 1] + text[position] + text[position + 2 :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=5000)
    parser.add_argument("--hub", type=int, default=500, help="Relations of each of the two duplicate hubs.")
    parser.add_argument("--typos", type=float, default=0.02, help="Share of entities with a misspelt twin.")
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()

    from tests.openai_double import OpenAIDouble

    dim = int(os.environ.get("EMBEDDING_DIM", "384"))
    double = OpenAIDouble(dim=dim).start()
    double.reply("Summary.")
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "LLM_BASE_URL": double.base_url,
            "LLM_API_KEY": "bench",
            "EMBEDDING_BASE_URL": double.base_url,
            "EMBEDDING_API_KEY": "bench",
            "LOG_LEVEL": "WARNING",
            "TEST_DB_SUFFIX": "_bench_curation",
        }
    )
    import django

    django.setup()
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    databases = setup_databases(verbosity=0, interactive=False, keepdb=args.keep, serialized_aliases=set())

    from knowledge.models import Chunk, Document, Entity, EntitySource, Relation, RelationSource, Workspace
    from knowledge.selectors import entities_browse, graph_top
    from knowledge.services.curation import entity_merge, entity_merge_undo, possible_duplicates
    from knowledge.services.workspaces import workspace_refresh_counts

    rng = np.random.default_rng(11)
    try:
        workspace = Workspace.objects.create(name="Curation benchmark", slug=f"bench-{uuid.uuid4().hex[:8]}")
        document = Document.objects.create(workspace=workspace, title="Corpus", content_hash=uuid.uuid4().hex)
        chunks = Chunk.objects.bulk_create(
            Chunk(workspace=workspace, document=document, order=i, text="text", token_count=1, char_start=0, char_end=4)
            for i in range(200)
        )
        names = [name(rng, i) for i in range(args.entities)]
        picked = rng.choice(args.entities, size=int(args.entities * args.typos), replace=False)
        twins = {typo(names[i], rng) for i in picked}
        names += sorted(twins - set(names))  # swapping two equal letters makes no twin
        names += ["Hub Corporation", "Hub Corp"]
        vectors = rng.normal(size=(len(names), dim)).astype(np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        entities = Entity.objects.bulk_create(
            Entity(
                workspace=workspace,
                name=text,
                key=text.casefold(),
                type="concept",
                embedding=vector.tolist(),
                published=True,
            )
            for text, vector in zip(names, vectors, strict=True)
        )
        EntitySource.objects.bulk_create(
            EntitySource(entity=entity, chunk=chunks[i % len(chunks)], name=entity.name, description=f"{entity.name}.")
            for i, entity in enumerate(entities)
        )
        hub, twin, others = entities[-2], entities[-1], entities[: args.entities]
        pairs = {tuple(sorted((hub.pk, other.pk))) for other in others[: args.hub]}
        pairs |= {tuple(sorted((twin.pk, other.pk))) for other in others[args.hub // 2 : args.hub // 2 + args.hub]}
        for _ in range(args.entities):
            a, b = rng.choice(len(others), size=2, replace=False)
            pairs.add(tuple(sorted((others[a].pk, others[b].pk))))
        relations = Relation.objects.bulk_create(
            Relation(
                workspace=workspace,
                source_id=a,
                target_id=b,
                weight=1.0,
                embedding=vectors[0].tolist(),
                published=True,
            )
            for a, b in sorted(pairs)
        )
        RelationSource.objects.bulk_create(
            RelationSource(relation=relation, chunk=chunks[i % len(chunks)], description="Related.", strength=1.0)
            for i, relation in enumerate(relations)
        )
        workspace_refresh_counts(workspace_id=workspace.pk)
        workspace.refresh_from_db()
        print(f"graph: {workspace.entity_count:,} entities, {workspace.relation_count:,} relations")

        found = timed("possible duplicates", lambda: possible_duplicates(workspace=workspace))
        print(f"{'':<34} {len(found)} pairs")
        log = timed(
            f"merge two hubs ({args.hub} relations each)", lambda: entity_merge(survivor=hub, others=[twin], actor=None)
        )
        timed("undo that merge", lambda: entity_merge_undo(merge_log=log, actor=None))
        timed(
            "entity browser, first page of 50",
            lambda: list(entities_browse(workspace=workspace, order="degree")[:50]),
        )
        timed("entity browser, search 'hub'", lambda: list(entities_browse(workspace=workspace, query="hub")[:50]))
        graph = timed("graph view, top 2000 by degree", lambda: graph_top(workspace=workspace, limit=2000))
        print(f"{'':<34} {len(graph['nodes'])} nodes, {len(graph['edges'])} edges")
    finally:
        connection.close()
        if not args.keep:
            teardown_databases(databases, verbosity=0)
        double.stop()


if __name__ == "__main__":
    main()
