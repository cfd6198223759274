from django.core.management.base import BaseCommand, CommandError

from knowledge.models import Document
from knowledge.services import ingestion


class Command(BaseCommand):
    help = (
        "Delete documents of one workspace and exactly what the graph learned only from them; the rest "
        "is rebuilt once, in this process."
    )

    def add_arguments(self, parser):
        parser.add_argument("ids", nargs="+", type=int, help="Document ids (see the `documents` command).")

    def handle(self, *args, ids, **options):
        documents = list(Document.objects.select_related("workspace").filter(pk__in=ids).defer("text"))
        missing = sorted(set(ids) - {document.pk for document in documents})
        if missing:
            raise CommandError(f"No document with id {', '.join(map(str, missing))}.")
        if len({document.workspace_id for document in documents}) > 1:
            raise CommandError("These documents belong to different workspaces; delete them one workspace at a time.")
        ingestion.documents_delete(documents=documents)
        titles = ", ".join(f"{document.pk} ({document.title})" for document in documents)
        self.stdout.write(f"Deleted {titles} from workspace {documents[0].workspace.slug}.")
