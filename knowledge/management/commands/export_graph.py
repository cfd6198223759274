import sys

from django.core.management.base import BaseCommand, CommandError

from knowledge.management import workspace_by_slug
from knowledge.services import export


class Command(BaseCommand):
    help = (
        "Write a workspace's published graph as GraphML, CSV (a zip of entities.csv, relations.csv and "
        "provenance.csv) or JSON (networkx node-link), to a file or to standard output."
    )

    def add_arguments(self, parser):
        parser.add_argument("--workspace", required=True, help="Workspace slug.")
        parser.add_argument("--format", choices=sorted(export.FORMATS), default="graphml")
        parser.add_argument(
            "--output", "-o", default="-", help="File to write (default: standard output; '-' likewise)."
        )

    def handle(self, *args, workspace, format, output, **options):  # noqa: A002 - the option's name
        found = workspace_by_slug(workspace)
        chosen = export.FORMATS[format]
        if output == "-":
            if chosen.name == "csv" and sys.stdout.isatty():
                raise CommandError("The CSV export is a zip; pass --output FILE or redirect standard output.")
            target = getattr(self.stdout._out, "buffer", None)
            if target is None:
                raise CommandError("Standard output takes no bytes here; pass --output FILE.")
            for block in chosen.write(found):
                target.write(block)
            target.flush()
            return
        written = 0
        try:
            with open(output, "wb") as file:
                for block in chosen.write(found):
                    file.write(block)
                    written += len(block)
        except OSError as exc:
            raise CommandError(f"Cannot write {output}: {exc.strerror or exc}.") from exc
        self.stderr.write(f"Wrote {written:,} bytes of {chosen.label} to {output}.")
