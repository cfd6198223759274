from django.core.management.base import BaseCommand, CommandError

from knowledge import ingestion
from knowledge.models import Document


class Command(BaseCommand):
    help = "Delete a document and exactly what the graph learned only from it (the rest is rebuilt)."

    def add_arguments(self, parser):
        parser.add_argument("id", type=int, help="Document id (see the `documents` command).")

    def handle(self, *args, id, **options):  # noqa: A002 - the argument's name on the command line
        document = Document.objects.select_related("workspace").filter(pk=id).first()
        if document is None:
            raise CommandError(f"No document with id {id}.")
        ingestion.document_delete(document=document)
        self.stdout.write(f"Deleted document {id} ({document.title}) from workspace {document.workspace.slug}.")
