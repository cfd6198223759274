import django.db.models.deletion
import pgvector.django.indexes
import pgvector.django.vector
from django.conf import settings
from django.db import migrations, models

# The vectors of entities and relations move their HNSW index to tables of their own, copies kept by
# row triggers that fire only when a vector changes (knowledge.models.GraphVector says why). A row
# trigger with a column list and a WHEN costs nothing to the many updates that leave the vector
# alone; a statement trigger would have to capture every updated row to find the few that changed.
TRIGGERS = """
CREATE FUNCTION knowledge_graph_vector() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.embedding IS NULL OR NOT NEW.published THEN
        EXECUTE format('DELETE FROM %I WHERE id = $1', TG_ARGV[0]) USING NEW.id;
    ELSE
        EXECUTE format(
            'INSERT INTO %I (id, workspace_id, embedding) VALUES ($1, $2, $3) '
            'ON CONFLICT (id) DO UPDATE SET workspace_id = EXCLUDED.workspace_id, embedding = EXCLUDED.embedding',
            TG_ARGV[0]
        ) USING NEW.id, NEW.workspace_id, NEW.embedding;
    END IF;
    RETURN NULL;
END $$;
"""

PER_TABLE = """
ALTER TABLE knowledge_{kind}vector ADD CONSTRAINT {kind}vector_row
    FOREIGN KEY (id) REFERENCES knowledge_{kind} (id) ON DELETE CASCADE;
CREATE TRIGGER {kind}_vector_inserted AFTER INSERT ON knowledge_{kind} FOR EACH ROW
    WHEN (NEW.embedding IS NOT NULL AND NEW.published) EXECUTE FUNCTION knowledge_graph_vector('knowledge_{kind}vector');
CREATE TRIGGER {kind}_vector_updated AFTER UPDATE OF embedding, published, workspace_id ON knowledge_{kind}
    FOR EACH ROW WHEN (
        NEW.embedding IS DISTINCT FROM OLD.embedding OR NEW.published <> OLD.published
        OR NEW.workspace_id <> OLD.workspace_id
    )
    EXECUTE FUNCTION knowledge_graph_vector('knowledge_{kind}vector');
INSERT INTO knowledge_{kind}vector (id, workspace_id, embedding)
SELECT id, workspace_id, embedding FROM knowledge_{kind} WHERE embedding IS NOT NULL AND published;
"""

DROP_PER_TABLE = """
DROP TRIGGER {kind}_vector_inserted ON knowledge_{kind};
DROP TRIGGER {kind}_vector_updated ON knowledge_{kind};
"""


def match_dimensions(apps, schema_editor):
    """`reembed` may have resized the graph's vector columns since EMBEDDING_DIM was read: the copies
    take the size the columns have now."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'knowledge_entity'::regclass AND attname = 'embedding'"
        )
        dimensions = cursor.fetchone()[0]
        if dimensions > 0:
            for kind in ("entity", "relation"):
                cursor.execute(
                    f"ALTER TABLE knowledge_{kind}vector ALTER COLUMN embedding TYPE vector({int(dimensions)})"  # noqa: S608
                )


def link_synonyms(apps, schema_editor):
    """The synonym links of the published entities, as a document's entities get them when it
    publishes, in a database that has none yet (0011 left them for now that their index exists)."""
    from knowledge.rag.graph.synonyms import link_synonyms

    Entity, EntityLink = apps.get_model("knowledge", "Entity"), apps.get_model("knowledge", "EntityLink")
    if EntityLink.objects.exists():
        return
    published = list(Entity.objects.filter(published=True).values_list("pk", flat=True))
    for start in range(0, len(published), 1000):
        link_synonyms(published[start : start + 1000])


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0015_versions_scopes_sources"),
    ]

    operations = [
        migrations.CreateModel(
            name="EntityVector",
            fields=[
                ("workspace_id", models.BigIntegerField()),
                ("embedding", pgvector.django.vector.VectorField(dimensions=settings.EMBEDDING_DIM)),
                (
                    "entity",
                    models.OneToOneField(
                        db_column="id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="knowledge.entity",
                    ),
                ),
            ],
        ),
        migrations.CreateModel(
            name="RelationVector",
            fields=[
                ("workspace_id", models.BigIntegerField()),
                ("embedding", pgvector.django.vector.VectorField(dimensions=settings.EMBEDDING_DIM)),
                (
                    "relation",
                    models.OneToOneField(
                        db_column="id",
                        db_constraint=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        primary_key=True,
                        related_name="+",
                        serialize=False,
                        to="knowledge.relation",
                    ),
                ),
            ],
        ),
        migrations.RunPython(match_dimensions, migrations.RunPython.noop),
        migrations.RemoveIndex(model_name="entity", name="entity_embedding_hnsw"),
        migrations.RemoveIndex(model_name="relation", name="relation_embedding_hnsw"),
        migrations.RunSQL(
            TRIGGERS + "".join(PER_TABLE.format(kind=kind) for kind in ("entity", "relation")),
            "".join(DROP_PER_TABLE.format(kind=kind) for kind in ("entity", "relation"))
            + "DROP FUNCTION knowledge_graph_vector();",
        ),
        # After the copy: one index build is much cheaper than as many inserts.
        migrations.AddIndex(
            model_name="entityvector",
            index=pgvector.django.indexes.HnswIndex(
                ef_construction=64,
                fields=["embedding"],
                m=16,
                name="entityvector_embedding_hnsw",
                opclasses=["vector_cosine_ops"],
            ),
        ),
        migrations.AddIndex(
            model_name="relationvector",
            index=pgvector.django.indexes.HnswIndex(
                ef_construction=64,
                fields=["embedding"],
                m=16,
                name="relationvector_embedding_hnsw",
                opclasses=["vector_cosine_ops"],
            ),
        ),
        migrations.AddIndex(
            model_name="entityvector",
            index=models.Index(fields=["workspace_id"], name="entityvector_workspace"),
        ),
        migrations.AddIndex(
            model_name="relationvector",
            index=models.Index(fields=["workspace_id"], name="relationvector_workspace"),
        ),
        migrations.RunPython(link_synonyms, migrations.RunPython.noop),
    ]
