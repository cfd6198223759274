"""Languages: each document's detected language, and full-text search that works for CJK text.

Postgres' parser takes a run of kana or ideographs between spaces for one word, so
"LightRAGの二段階検索とは" was one token and nothing inside it could be found. `cjk_bigrams`
cuts every such run into overlapping pairs of characters ("二段階検索" becomes "二段 段階 階検
検索"), for the indexed text and for the query alike: a quoted query term becomes a phrase of
its pairs, so it matches exactly where the same characters follow each other (decision 0141).
The characters are those of knowledge.rag.language.CJK_CHARACTERS; a test checks both agree.
"""

from django.db import migrations, models

CJK = (
    r"\u1100-\u11ff\u3005-\u3007\u3040-\u309f\u30a0-\u30fa\u30fc-\u30ff\u3130-\u318f\u31f0-\u31ff"
    r"\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff\uff66-\uff9f"
)

CREATE_FUNCTION = """
CREATE FUNCTION cjk_bigrams(input text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $$
    SELECT coalesce(string_agg(
        CASE
            WHEN piece !~ '^[CJK]' THEN piece
            WHEN length(piece) = 1 THEN ' ' || piece || ' '
            ELSE ' ' || (
                SELECT string_agg(substr(piece, i, 2), ' ' ORDER BY i) FROM generate_series(1, length(piece) - 1) i
            ) || ' '
        END, '' ORDER BY n), '')
    FROM regexp_matches(input, '[CJK]+|[^CJK]+', 'g') WITH ORDINALITY AS m (parts, n),
         LATERAL (SELECT parts[1] AS piece) p
$$
""".replace("CJK", CJK)


def detect_languages(apps, schema_editor):
    from knowledge.rag.language import detect

    Document = apps.get_model("knowledge", "Document")
    for document in Document.objects.exclude(text="").only("pk", "text").iterator(chunk_size=200):
        Document.objects.filter(pk=document.pk).update(language=detect(document.text))


class Migration(migrations.Migration):
    dependencies = [
        ("knowledge", "0008_api_token_limits_and_error_detail"),
    ]

    operations = [
        migrations.AddField(
            model_name="document",
            name="language",
            field=models.CharField(
                blank=True,
                default="",
                help_text="ISO 639-1 code of the text's language, as detected when it was read.",
                max_length=8,
            ),
        ),
        migrations.RunPython(detect_languages, migrations.RunPython.noop, elidable=True),
        migrations.RunSQL(
            sql=[
                CREATE_FUNCTION,
                "ALTER TABLE knowledge_chunk DROP COLUMN search",
                "ALTER TABLE knowledge_chunk ADD COLUMN search tsvector GENERATED ALWAYS AS ("
                "setweight(to_tsvector('english'::regconfig, cjk_bigrams(coalesce(section, ''))), 'A') || "
                "setweight(to_tsvector('english'::regconfig, cjk_bigrams(text)), 'D')) STORED",
                "CREATE INDEX chunk_search_gin ON knowledge_chunk USING gin (search)",
                "ALTER TABLE knowledge_entity DROP COLUMN search",
                "ALTER TABLE knowledge_entity ADD COLUMN search tsvector GENERATED ALWAYS AS ("
                "to_tsvector('simple'::regconfig, cjk_bigrams(name))) STORED",
                "CREATE INDEX entity_search_gin ON knowledge_entity USING gin (search)",
            ],
            reverse_sql=[
                "ALTER TABLE knowledge_entity DROP COLUMN search",
                "ALTER TABLE knowledge_entity ADD COLUMN search tsvector GENERATED ALWAYS AS ("
                "to_tsvector('simple'::regconfig, name)) STORED",
                "CREATE INDEX entity_search_gin ON knowledge_entity USING gin (search)",
                "ALTER TABLE knowledge_chunk DROP COLUMN search",
                "ALTER TABLE knowledge_chunk ADD COLUMN search tsvector GENERATED ALWAYS AS ("
                "setweight(to_tsvector('english'::regconfig, coalesce(section, '')), 'A') || "
                "setweight(to_tsvector('english'::regconfig, text), 'D')) STORED",
                "CREATE INDEX chunk_search_gin ON knowledge_chunk USING gin (search)",
                "DROP FUNCTION cjk_bigrams(text)",
            ],
        ),
    ]
