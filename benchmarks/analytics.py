"""The analytics page of a workspace with many recorded questions.

    .venv/bin/python benchmarks/analytics.py                    # 100,000 questions over 90 days
    .venv/bin/python benchmarks/analytics.py --questions 300000 --documents 2000

Seeds one workspace with `--documents` processed documents and `--questions` recorded answers
spread over 90 days (modes, models, outcomes, cited documents, first-token times and tokens
drawn at random in SQL; 5% rated, a third of those down, half with comments), next to a second workspace
with as many rows, so the workspace filter has something to filter. Then renders the owner's
analytics page (7, 30 and 90 days) and the CSV through Django's test client, and prints, per
page: the SQL queries and the time, best of `--repeat`. Runs in its own database (suffix
_bench_analytics), dropped at the end unless --keep.
"""

import argparse
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ANSWERS_SQL = """
    INSERT INTO knowledge_answer (
        uuid, workspace_id, user_id, door, question, mode, model, outcome, text, sources, source_count,
        cited_documents, prompt_tokens, completion_tokens, llm_calls, first_token_ms, total_ms, created_at
    )
    SELECT md5(%(slug)s || n)::uuid, %(workspace)s, %(user)s,
           (ARRAY['chat','chat','chat','api','openai','openai','ollama','mcp'])[1 + floor(random() * 8)::int],
           'Question number ' || n || ' about the handbook?',
           (ARRAY['mix','mix','mix','mix','mix','local','local','hybrid','naive','global'])
               [1 + floor(random() * 10)::int],
           picked.model, picked.outcome,
           'An answer of about a paragraph, citing its sources [S1] [S2].', '[]'::jsonb,
           cardinality(picked.cited), picked.cited,
           CASE WHEN picked.model = 'extractive' THEN 0 ELSE 2000 + floor(random() * 10000)::int END,
           CASE WHEN picked.model = 'extractive' THEN 0 ELSE 50 + floor(random() * 750)::int END,
           CASE WHEN picked.model = 'extractive' THEN 0 ELSE 2 END,
           CASE WHEN picked.outcome = 'failed' THEN NULL ELSE 200 + floor(random() * random() * 4000)::int END,
           CASE WHEN picked.outcome = 'failed' THEN NULL ELSE 1000 + floor(random() * 6000)::int END,
           now() - random() * interval '90 days'
    FROM generate_series(1, %(questions)s) AS n
    CROSS JOIN LATERAL (
        SELECT CASE WHEN random() < 0.2 THEN 'extractive' ELSE 'gpt-4o-mini' END AS model,
               CASE WHEN random() < 0.02 THEN 'failed' ELSE 'answered' END AS outcome,
               -- Zero to three distinct documents: a slice of three picked from the row's number.
               (ARRAY[
                   %(first_document)s + (n::bigint * 7919) %% %(documents)s,
                   %(first_document)s + (n::bigint * 104729 + 1) %% %(documents)s,
                   %(first_document)s + (n::bigint * 1299709 + 2) %% %(documents)s
               ]::bigint[])[1:floor(random() * 4)::int] AS cited
        -- Refers to the row, so the draws are made for every row rather than once.
        WHERE n IS NOT NULL
    ) AS picked
"""
FEEDBACK_SQL = """
    INSERT INTO knowledge_feedback (answer_id, user_id, rating, comment, created_at, updated_at)
    SELECT id, %(user)s, CASE WHEN random() < 0.33 THEN -1 ELSE 1 END,
           CASE WHEN random() < 0.5 THEN 'It missed the point.' ELSE '' END, now(), now()
    FROM knowledge_answer WHERE workspace_id = %(workspace)s AND random() < 0.05
"""


def seed(workspace, user, *, questions: int, documents: list[int]) -> None:
    """Recorded questions over 90 days: modes, models, outcomes, cited documents, first-token
    times and tokens drawn at random in SQL (seeded), 5% rated, a third of those down."""
    from django.db import connection

    values = {
        "slug": workspace.slug,
        "workspace": workspace.pk,
        "user": user.pk,
        "questions": questions,
        "first_document": min(documents),
        "documents": len(documents),
    }
    with connection.cursor() as cursor:
        cursor.execute("SELECT setseed(0.25)")
        cursor.execute(ANSWERS_SQL, values)
        cursor.execute(FEEDBACK_SQL, values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--questions", type=int, default=100_000)
    parser.add_argument("--documents", type=int, default=500)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    os.environ.update(
        {
            "DJANGO_SETTINGS_MODULE": "config.settings",
            "LOG_LEVEL": "WARNING",
            "TEST_DB_SUFFIX": "_bench_analytics",
            "MODEL_PRICES": "gpt-4o-mini=0.15/0.60",
        }
    )
    import django

    django.setup()
    from django.conf import settings
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext, setup_databases, teardown_databases
    from django.urls import reverse

    from knowledge.models import Document, Membership, Role, Workspace

    settings.ALLOWED_HOSTS = ["testserver"]
    settings.SECURE_SSL_REDIRECT = False
    databases = setup_databases(verbosity=0, interactive=False, keepdb=args.keep, serialized_aliases=set())
    try:
        from django.contrib.auth import get_user_model

        owner = get_user_model().objects.create_user("bench-owner", "owner@example.org", "x")
        workspaces = []
        started = time.perf_counter()
        for slug in ("measured", "neighbour"):
            workspace = Workspace.objects.create(name=slug.title(), slug=slug)
            Membership.objects.create(workspace=workspace, user=owner, role=Role.OWNER)
            ids = [
                document.pk
                for document in Document.objects.bulk_create(
                    Document(
                        workspace=workspace,
                        title=f"Document {index}",
                        content_hash=uuid.uuid4().hex,
                        status=Document.Status.PROCESSED,
                    )
                    for index in range(args.documents)
                )
            ]
            seed(workspace, owner, questions=args.questions, documents=ids)
            workspaces.append(workspace)
        with connection.cursor() as cursor:
            # As autovacuum would soon after a load: statistics, and the visibility map that lets
            # the covering index answer without reading the rows.
            cursor.execute("VACUUM ANALYZE knowledge_answer")
            cursor.execute("VACUUM ANALYZE knowledge_feedback")
            cursor.execute("ANALYZE knowledge_document")
        print(
            f"seeded {args.questions:,} questions in each of 2 workspaces, {args.documents} documents each "
            f"({time.perf_counter() - started:.1f} s)"
        )
        client = Client()
        client.force_login(owner)
        pages = [
            (f"page, {days} days", f"{reverse('knowledge:analytics', args=['measured'])}?days={days}")
            for days in (7, 30, 90)
        ]
        pages.append(("CSV, 90 days", f"{reverse('knowledge:analytics_csv', args=['measured'])}?days=90"))
        print(f"{'':<20} {'queries':>8} {'best ms':>9} {'median ms':>10}")
        for label, url in pages:
            client.get(url)  # warm the caches, as a page viewed twice would be
            times = []
            for _ in range(args.repeat):
                with CaptureQueriesContext(connection) as queries:
                    start = time.perf_counter()
                    response = client.get(url)
                    times.append((time.perf_counter() - start) * 1000)
                assert response.status_code == 200, response.status_code
            print(f"{label:<20} {len(queries):>8} {min(times):>9.1f} {statistics.median(times):>10.1f}")
        slowest = max(queries.captured_queries, key=lambda query: float(query["time"]))
        print(f"slowest query of the last page: {float(slowest['time']) * 1000:.1f} ms: {slowest['sql'][:160]}...")
    finally:
        if not args.keep:
            connection.close()
            teardown_databases(databases, verbosity=0)


if __name__ == "__main__":
    main()
