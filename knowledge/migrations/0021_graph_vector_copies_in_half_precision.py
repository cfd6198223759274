import pgvector.django.halfvec
import pgvector.django.indexes
from django.conf import settings
from django.db import migrations

# The copies of the graph's vectors, and their HNSW indexes, in half precision (decision 0166). The
# copies keep the size their columns have now: `reembed` may have resized them since EMBEDDING_DIM
# was read.
KINDS = ("entity", "relation")


def _convert(schema_editor, to_type: str, opclass: str) -> None:
    with schema_editor.connection.cursor() as cursor:
        for kind in KINDS:
            cursor.execute(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = %s::regclass AND attname = 'embedding'",
                [f"knowledge_{kind}vector"],
            )
            dimensions = int(cursor.fetchone()[0])
            size = f"({dimensions})" if dimensions > 0 else ""
            cursor.execute(f"DROP INDEX IF EXISTS {kind}vector_embedding_hnsw")
            cursor.execute(
                f"ALTER TABLE knowledge_{kind}vector ALTER COLUMN embedding TYPE {to_type}{size} "
                f"USING embedding::{to_type}{size}"
            )
            # One build from the converted rows, with the parameters of knowledge.models.embedding_index.
            cursor.execute(
                f"CREATE INDEX {kind}vector_embedding_hnsw ON knowledge_{kind}vector "
                f"USING hnsw (embedding {opclass}) WITH (m = 16, ef_construction = 64)"
            )


def to_half(apps, schema_editor):
    _convert(schema_editor, "halfvec", "halfvec_cosine_ops")


def to_single(apps, schema_editor):
    _convert(schema_editor, "vector", "vector_cosine_ops")


def _index(kind: str, opclass: str):
    return pgvector.django.indexes.HnswIndex(
        ef_construction=64, fields=["embedding"], m=16, name=f"{kind}vector_embedding_hnsw", opclasses=[opclass]
    )


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0020_unpublished_documents"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(to_half, to_single)],
            state_operations=[
                operation
                for kind in KINDS
                for operation in (
                    migrations.RemoveIndex(model_name=f"{kind}vector", name=f"{kind}vector_embedding_hnsw"),
                    migrations.AlterField(
                        model_name=f"{kind}vector",
                        name="embedding",
                        field=pgvector.django.halfvec.HalfVectorField(dimensions=settings.EMBEDDING_DIM),
                    ),
                    migrations.AddIndex(model_name=f"{kind}vector", index=_index(kind, "halfvec_cosine_ops")),
                )
            ],
        ),
    ]
