from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from knowledge.management import workspace_by_slug
from knowledge.models import Workspace
from knowledge.rag import graph, llm


class Command(BaseCommand):
    help = (
        "Re-embed chunks, entities and relations with the configured embedding model. Without --workspace, "
        "first resize the vector columns to EMBEDDING_DIM if they differ (needed after changing the model)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--workspace", help="Only this workspace (the columns must already match).")

    def handle(self, *args, workspace, **options):
        current = graph.vector_dimensions()
        if workspace:
            found = workspace_by_slug(workspace)
            if current != settings.EMBEDDING_DIM:
                raise CommandError(
                    f"The vector columns hold {current} dimensions but EMBEDDING_DIM is {settings.EMBEDDING_DIM}; "
                    "run `reembed` without --workspace to resize them and re-embed everything."
                )
            workspaces = [found]
        else:
            if current != settings.EMBEDDING_DIM:
                self.stdout.write(f"Resizing vector columns from {current} to {settings.EMBEDDING_DIM} dimensions.")
                graph.resize_vector_columns(settings.EMBEDDING_DIM)
            workspaces = list(Workspace.objects.order_by("pk"))
        self.stdout.write(f"Embedding with {llm.engine_description()['embedding']}.")
        for target in workspaces:
            counts = graph.reembed_workspace(workspace_id=target.pk)
            self.stdout.write(
                f"{target.slug}: {counts['chunks']} chunks, {counts['entities']} entities, "
                f"{counts['relations']} relations re-embedded."
            )
