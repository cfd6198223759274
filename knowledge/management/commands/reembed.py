from django.core.management.base import BaseCommand, CommandError

from knowledge.management import workspace_by_slug
from knowledge.models import Workspace
from knowledge.rag import graph, llm


class Command(BaseCommand):
    help = (
        "Re-embed chunks, entities and relations with the configured embedding model. Without --workspace, "
        "first resize the vector columns to the model's dimension (EMBEDDING_DIM, or the one picked on the "
        "Models page) if they differ."
    )

    def add_arguments(self, parser):
        parser.add_argument("--workspace", help="Only this workspace (the columns must already match).")

    def handle(self, *args, workspace, **options):
        current, wanted = graph.vector_dimensions(), llm.embedding_dimensions()
        if workspace:
            found = workspace_by_slug(workspace)
            if current != wanted:
                raise CommandError(
                    f"The vector columns hold {current} dimensions but the embedding model makes {wanted}; "
                    "run `reembed` without --workspace to resize them and re-embed everything."
                )
            workspaces = [found]
        else:
            if current != wanted:
                self.stdout.write(f"Resizing vector columns from {current} to {wanted} dimensions.")
                graph.resize_vector_columns(wanted)
            workspaces = list(Workspace.objects.order_by("pk"))
        self.stdout.write(f"Embedding with {llm.engine_description()['embedding']}.")
        for target in workspaces:
            counts = graph.reembed_workspace(workspace_id=target.pk)
            self.stdout.write(
                f"{target.slug}: {counts['chunks']} chunks, {counts['entities']} entities, "
                f"{counts['relations']} relations re-embedded."
            )
