from importlib import import_module

from django.db import migrations, models

# A new row's vector copy is now written when its document stages the vector, before publishing
# (knowledge.models.GraphVector). Publishing then updates the graph row, and the trigger must leave
# a copy that already holds the vector alone: an update of it would insert into HNSW again.
TRIGGER = """
CREATE OR REPLACE FUNCTION knowledge_graph_vector() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.embedding IS NULL OR NOT NEW.published THEN
        EXECUTE format('DELETE FROM %I WHERE id = $1', TG_ARGV[0]) USING NEW.id;
    ELSE
        EXECUTE format(
            'INSERT INTO %I AS c (id, workspace_id, embedding) VALUES ($1, $2, $3) '
            'ON CONFLICT (id) DO UPDATE SET workspace_id = EXCLUDED.workspace_id, embedding = EXCLUDED.embedding '
            'WHERE (c.workspace_id, c.embedding) IS DISTINCT FROM (EXCLUDED.workspace_id, EXCLUDED.embedding)',
            TG_ARGV[0]
        ) USING NEW.id, NEW.workspace_id, NEW.embedding;
    END IF;
    RETURN NULL;
END $$;
"""

# Back to 0016's function, as it was defined there.
PREVIOUS = import_module("knowledge.migrations.0016_graph_vector_tables").TRIGGERS.replace(
    "CREATE FUNCTION", "CREATE OR REPLACE FUNCTION", 1
)


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0017_folded_provenance"),
    ]

    operations = [
        migrations.AddIndex(
            model_name="entity",
            index=models.Index(
                condition=models.Q(("published", False)), fields=["workspace"], name="entity_unpublished"
            ),
        ),
        migrations.AddIndex(
            model_name="relation",
            index=models.Index(
                condition=models.Q(("published", False)), fields=["workspace"], name="relation_unpublished"
            ),
        ),
        migrations.RunSQL(TRIGGER, PREVIOUS),
    ]
