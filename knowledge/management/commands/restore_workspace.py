from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from knowledge.services.backup import ArchiveError, workspace_restore


class Command(BaseCommand):
    help = (
        "Restore a workspace archive written by backup_workspace, as a new workspace, without any model call. "
        "Refused when the address is taken (pass --slug) or the embedding model differs."
    )

    def add_arguments(self, parser):
        parser.add_argument("archive", help="Archive written by backup_workspace.")
        parser.add_argument("--slug", help="Address of the restored workspace (default: the archived one).")
        parser.add_argument("--owner", help="Username to make its owner (members whose usernames exist keep roles).")

    def handle(self, *args, archive, slug, owner, **options):
        user = None
        if owner:
            user = get_user_model().objects.filter(username=owner).first()
            if user is None:
                raise CommandError(f"No user named {owner!r}.")
        try:
            report = workspace_restore(path=archive, slug=slug, owner=user)
        except ArchiveError as exc:
            raise CommandError(str(exc)) from exc
        counts = ", ".join(f"{count} {name.replace('_', ' ')}" for name, count in report.counts.items())
        self.stdout.write(f"Restored {report.workspace.slug}: {counts}.")
        for table, usernames in report.skipped.items():
            self.stderr.write(
                f"Skipped {len(usernames)} {table.replace('_', ' ')} of users missing here: "
                f"{', '.join(sorted(set(usernames)))}."
            )
        for name in report.missing_files:
            self.stderr.write(f"The backup had no copy of {name}; its document has no stored file.")
