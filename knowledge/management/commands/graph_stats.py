import json

from django.core.management.base import BaseCommand
from django.db.models import Count, Sum

from knowledge.management import workspace_by_slug
from knowledge.models import Chunk, Document, Entity, Relation


class Command(BaseCommand):
    help = "Counts of a workspace's documents (by status), chunks, entities, relations and tokens."

    def add_arguments(self, parser):
        parser.add_argument("--workspace", required=True, help="Workspace slug.")
        parser.add_argument("--json", action="store_true", help="Print JSON instead of lines.")

    def handle(self, *args, workspace, **options):
        found = workspace_by_slug(workspace)
        documents = Document.objects.filter(workspace=found)
        totals = documents.aggregate(
            corpus_tokens=Sum("token_count"),
            prompt_tokens=Sum("prompt_tokens"),
            completion_tokens=Sum("completion_tokens"),
            llm_calls=Sum("llm_calls"),
        )
        stats = {
            "workspace": found.slug,
            "documents": documents.count(),
            "documents_by_status": dict(documents.order_by().values_list("status").annotate(n=Count("pk"))),
            "chunks": Chunk.objects.filter(workspace=found).count(),
            "entities": Entity.objects.filter(workspace=found).count(),
            "relations": Relation.objects.filter(workspace=found).count(),
            "tokens": {name: value or 0 for name, value in totals.items()},
        }
        if options["json"]:
            self.stdout.write(json.dumps(stats, indent=2))
            return
        for name, value in stats.items():
            self.stdout.write(f"{name}: {value}")
