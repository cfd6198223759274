"""Graph export, backup and restore on a synthetic workspace.

    .venv/bin/python benchmarks/backup_export.py                     # 20000 entities, 40000 relations
    .venv/bin/python benchmarks/backup_export.py --entities 50000

Builds a workspace with `--entities` published entities, twice as many relations, a chunk per
four entities (every row with a 384-dimensional vector) and a provenance row for every entity
and relation, then times each export format (bytes written, and the peak of Python memory while
it streams, which stays flat whatever the size), a backup, and a restore beside the original
(checking its counts). No model is called. Runs in its own database (suffix _bench_backup),
dropped at the end unless --keep.
"""

import argparse
import os
import sys
import tempfile
import time
import tracemalloc
import uuid
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(label: str, work):
    start = time.perf_counter()
    result = work()
    print(f"{label:<34} {time.perf_counter() - start:8.2f} s")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--entities", type=int, default=20000)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    os.environ.update(
        {"DJANGO_SETTINGS_MODULE": "config.settings", "LOG_LEVEL": "WARNING", "TEST_DB_SUFFIX": "_bench_backup"}
    )
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    databases = setup_databases(verbosity=0, interactive=False, keepdb=args.keep, serialized_aliases=set())
    settings.MEDIA_ROOT = tempfile.mkdtemp(prefix="bench-media-")

    from knowledge.models import Chunk, Document, Entity, EntitySource, Relation, RelationSource, Workspace
    from knowledge.services import export
    from knowledge.services.backup import workspace_backup, workspace_restore
    from knowledge.services.workspaces import workspace_refresh_counts

    rng = np.random.default_rng(7)
    dim = settings.EMBEDDING_DIM

    def vectors(count: int) -> np.ndarray:
        rows = rng.normal(size=(count, dim)).astype(np.float32)
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    try:
        workspace = Workspace.objects.create(name="Backup benchmark", slug=f"bench-{uuid.uuid4().hex[:8]}")
        document = Document.objects.create(
            workspace=workspace, title="Corpus", content_hash=uuid.uuid4().hex, status=Document.Status.PROCESSED
        )
        chunk_count = max(1, args.entities // 4)
        chunks = Chunk.objects.bulk_create(
            (
                Chunk(
                    workspace=workspace,
                    document=document,
                    order=i,
                    text=f"Chunk {i} says something about a few entities. " * 8,
                    token_count=80,
                    char_start=0,
                    char_end=400,
                    embedding=vector.tolist(),
                )
                for i, vector in enumerate(vectors(chunk_count))
            ),
            batch_size=1000,
        )
        entities = Entity.objects.bulk_create(
            (
                Entity(
                    workspace=workspace,
                    name=f"Entity {i}",
                    key=f"entity {i}",
                    type=("person", "organization", "concept")[i % 3],
                    description=f"Entity {i} is described in a sentence or two of plain prose.",
                    embedding=vector.tolist(),
                    published=True,
                )
                for i, vector in enumerate(vectors(args.entities))
            ),
            batch_size=1000,
        )
        EntitySource.objects.bulk_create(
            (
                EntitySource(entity=entity, chunk=chunks[i % chunk_count], name=entity.name, description="Said.")
                for i, entity in enumerate(entities)
            ),
            batch_size=2000,
        )
        pairs = set()
        while len(pairs) < 2 * args.entities:
            a, b = rng.choice(args.entities, size=2, replace=False)
            pairs.add(tuple(sorted((entities[a].pk, entities[b].pk))))
        relations = Relation.objects.bulk_create(
            (
                Relation(
                    workspace=workspace,
                    source_id=a,
                    target_id=b,
                    keywords="related",
                    description="They are related.",
                    weight=float(rng.integers(1, 10)),
                    embedding=vector.tolist(),
                    published=True,
                )
                for (a, b), vector in zip(sorted(pairs), vectors(len(pairs)), strict=True)
            ),
            batch_size=1000,
        )
        RelationSource.objects.bulk_create(
            (
                RelationSource(relation=relation, chunk=chunks[i % chunk_count], description="Related.")
                for i, relation in enumerate(relations)
            ),
            batch_size=2000,
        )
        workspace_refresh_counts(workspace_id=workspace.pk)
        workspace.refresh_from_db()
        print(
            f"workspace: {workspace.entity_count:,} entities, {workspace.relation_count:,} relations, "
            f"{workspace.chunk_count:,} chunks, {dim}-dimensional vectors"
        )

        for name, chosen in export.FORMATS.items():
            tracemalloc.start()
            size = timed(f"export {name}", lambda chosen=chosen: sum(len(block) for block in chosen.write(workspace)))
            peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
            print(f"{'':<34} {size / 1e6:8.1f} MB, Python memory peak {peak / 1e6:.1f} MB")

        with tempfile.TemporaryDirectory() as folder:
            path = Path(folder) / "backup.zip"
            timed("backup", lambda: workspace_backup(workspace=workspace, path=path))
            print(f"{'':<34} {path.stat().st_size / 1e6:8.1f} MB")
            report = timed("restore beside the original", lambda: workspace_restore(path=path, slug="restored"))
        restored = report.workspace
        same = (restored.entity_count, restored.relation_count, restored.chunk_count) == (
            workspace.entity_count,
            workspace.relation_count,
            workspace.chunk_count,
        )
        print(f"restored counts equal the original's: {same}")
    finally:
        connection.close()
        if not args.keep:
            teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
