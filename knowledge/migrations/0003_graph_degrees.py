import django.db.models.deletion
from django.db import migrations, models

# Inserts and deletes: statement-level triggers with transition tables, so one aggregated write per
# statement however many relations it touches, degree rows upserted in id order. Every writer of
# relations already holds the advisory locks of both endpoints' keys, so these row locks add no
# deadlock.
TRIGGERS = """
CREATE FUNCTION knowledge_relation_inserted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO knowledge_entitydegree AS d (entity_id, degree)
    SELECT id, count(*) FROM (SELECT source_id AS id FROM added UNION ALL SELECT target_id FROM added) ends
    GROUP BY id ORDER BY id
    ON CONFLICT (entity_id) DO UPDATE SET degree = d.degree + EXCLUDED.degree;
    RETURN NULL;
END $$;

CREATE FUNCTION knowledge_relation_deleted() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE knowledge_entitydegree AS d SET degree = d.degree - ends.n
    FROM (
        SELECT id, count(*) AS n
        FROM (SELECT source_id AS id FROM removed UNION ALL SELECT target_id FROM removed) e GROUP BY id
    ) ends
    WHERE d.entity_id = ends.id;
    RETURN NULL;
END $$;

-- Only curation moves a relation's endpoints, one row at a time; rebuilds rewrite text, weight
-- and vectors of many rows and must not pay for this, hence a row trigger behind a WHEN.
CREATE FUNCTION knowledge_relation_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    UPDATE knowledge_entitydegree SET degree = degree - 1 WHERE entity_id IN (OLD.source_id, OLD.target_id);
    INSERT INTO knowledge_entitydegree AS d (entity_id, degree)
    SELECT id, 1 FROM unnest(ARRAY[NEW.source_id, NEW.target_id]) AS id ORDER BY id
    ON CONFLICT (entity_id) DO UPDATE SET degree = d.degree + 1;
    RETURN NULL;
END $$;

CREATE TRIGGER relation_inserted_degrees AFTER INSERT ON knowledge_relation
    REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION knowledge_relation_inserted();
CREATE TRIGGER relation_deleted_degrees AFTER DELETE ON knowledge_relation
    REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION knowledge_relation_deleted();
CREATE TRIGGER relation_moved_degrees AFTER UPDATE OF source_id, target_id ON knowledge_relation FOR EACH ROW
    WHEN (OLD.source_id <> NEW.source_id OR OLD.target_id <> NEW.target_id)
    EXECUTE FUNCTION knowledge_relation_moved();

INSERT INTO knowledge_entitydegree (entity_id, degree)
SELECT id, count(*) FROM (SELECT source_id AS id FROM knowledge_relation UNION ALL SELECT target_id FROM knowledge_relation) ends
GROUP BY id;
"""

DROP_TRIGGERS = """
DROP TRIGGER relation_inserted_degrees ON knowledge_relation;
DROP TRIGGER relation_deleted_degrees ON knowledge_relation;
DROP TRIGGER relation_moved_degrees ON knowledge_relation;
DROP FUNCTION knowledge_relation_inserted();
DROP FUNCTION knowledge_relation_deleted();
DROP FUNCTION knowledge_relation_moved();
"""


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0002_evaluation"),
    ]

    operations = [
        migrations.CreateModel(
            name="EntityDegree",
            fields=[
                (
                    "entity",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.CASCADE,
                        primary_key=True,
                        related_name="degree_row",
                        serialize=False,
                        to="knowledge.entity",
                    ),
                ),
                ("degree", models.PositiveIntegerField(default=0)),
            ],
        ),
        migrations.AlterField(
            model_name="relation",
            name="source",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="knowledge.entity"
            ),
        ),
        migrations.AlterField(
            model_name="relation",
            name="target",
            field=models.ForeignKey(
                db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="+", to="knowledge.entity"
            ),
        ),
        migrations.AddIndex(
            model_name="relation",
            index=models.Index(
                fields=["source"], include=("target", "workspace", "weight", "id"), name="relation_by_source"
            ),
        ),
        migrations.AddIndex(
            model_name="relation",
            index=models.Index(
                fields=["target"], include=("source", "workspace", "weight", "id"), name="relation_by_target"
            ),
        ),
        migrations.RunSQL(TRIGGERS, DROP_TRIGGERS),
    ]
