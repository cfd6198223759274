from django.core.management.base import BaseCommand, CommandError

from knowledge.management import workspace_by_slug
from knowledge.services.backup import workspace_backup


class Command(BaseCommand):
    help = (
        "Write a workspace to an archive (documents and their files, chunks with vectors, extraction records, "
        "the graph with its provenance, aliases and merge log) that restore_workspace imports without model calls."
    )

    def add_arguments(self, parser):
        parser.add_argument("workspace", help="Workspace slug.")
        parser.add_argument("--output", "-o", required=True, help="Archive to write (a .zip).")
        parser.add_argument(
            "--conversations", action="store_true", help="Include the workspace's chat conversations and messages."
        )

    def handle(self, *args, workspace, output, conversations, **options):
        found = workspace_by_slug(workspace)
        try:
            manifest = workspace_backup(workspace=found, path=output, conversations=conversations)
        except OSError as exc:
            raise CommandError(f"Cannot write {output}: {exc.strerror or exc}.") from exc
        counts = ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in manifest["counts"].items())
        self.stdout.write(f"Backed up {found.slug} to {output}: {counts}.")
        for name in manifest["missing_files"]:
            self.stderr.write(f"The stored file {name} is missing; its document was backed up without it.")
