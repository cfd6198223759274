import json

from django.core.management.base import BaseCommand

from knowledge.management import workspace_by_slug
from knowledge.models import Document

FIELDS = ["id", "title", "status", "chunk_count", "chunks_done", "entity_count", "relation_count", "token_count"]
COUNTERS = ["prompt_tokens", "completion_tokens", "llm_calls"]


class Command(BaseCommand):
    help = "List a workspace's documents with their status, counts and error."

    def add_arguments(self, parser):
        parser.add_argument("--workspace", required=True, help="Workspace slug.")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

    def handle(self, *args, workspace, **options):
        found = workspace_by_slug(workspace)
        rows = list(Document.objects.filter(workspace=found).order_by("pk").values(*FIELDS, *COUNTERS, "error"))
        if options["json"]:
            self.stdout.write(_dumps(rows))
            return
        for row in rows:
            self.stdout.write(
                f"{row['id']:>6}  {row['status']:<10}  {row['chunks_done']:>5}/{row['chunk_count']:<5} chunks  "
                f"{row['entity_count']:>6} entities  {row['relation_count']:>6} relations  {row['title']}"
                + (f"\n        error: {row['error']}" if row["error"] else "")
            )


def _dumps(value) -> str:
    return json.dumps(value, indent=2, ensure_ascii=False)
