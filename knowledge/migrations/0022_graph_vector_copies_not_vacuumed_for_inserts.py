from django.db import migrations

# The copies of the graph's vectors are not vacuumed because rows were inserted, only because rows
# died (decision 0170). Since Postgres 13, autovacuum also vacuums a table after inserts alone
# (1,000 plus a fifth of its rows), to keep its visibility map and freezing current. Nothing reads
# these tables by an index-only scan, and a vacuum that finds the few dead copies a vector change
# leaves runs pgvector's HNSW vacuum: a pass over the whole graph and a repair of the neighbours
# of each dead element, which on a 10M-token graph took minutes and grew with the graph. Dead
# copies still start a vacuum (a fifth of the table, Postgres' default), and wraparound still does.
TABLES = ("knowledge_entityvector", "knowledge_relationvector")


class Migration(migrations.Migration):
    dependencies = [("knowledge", "0021_graph_vector_copies_in_half_precision")]

    operations = [
        migrations.RunSQL(
            [f"ALTER TABLE {table} SET (autovacuum_vacuum_insert_threshold = -1)" for table in TABLES],
            reverse_sql=[f"ALTER TABLE {table} RESET (autovacuum_vacuum_insert_threshold)" for table in TABLES],
        )
    ]
