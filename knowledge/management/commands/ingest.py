import sys
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from knowledge.models import Document, Membership, Role, Workspace
from knowledge.rag import parsing
from knowledge.services import ingestion


class Command(BaseCommand):
    help = (
        "Ingest files and folders (recursively) into a workspace, running the pipeline in this process; "
        "no worker needed. Accepted types: " + parsing.accepted_types()
    )

    def add_arguments(self, parser):
        parser.add_argument("paths", nargs="+", help="Files or folders.")
        parser.add_argument("--workspace", required=True, help="Workspace slug.")
        parser.add_argument("--create", action="store_true", help="Create the workspace if it does not exist.")
        parser.add_argument("--owner", help="With --create: the username who owns the new workspace.")

    def handle(self, *args, paths, workspace, create, owner, **options):
        target = self._workspace(workspace, create, owner)
        files = self._files(paths)
        tally = {"processed": 0, "failed": 0, "refused": 0}
        for path in files:
            shown = str(path).encode("utf-8", "backslashreplace").decode()
            try:
                document = ingestion.document_create(
                    workspace=target, filename=path.name, data=path.read_bytes(), enqueue=False
                )
            except (ingestion.DocumentRejected, OSError) as err:
                tally["refused"] += 1
                reason = err if isinstance(err, ingestion.DocumentRejected) else f"could not be read ({err.strerror})"
                self.stderr.write(f"refused  {shown}: {reason}")
                continue
            document = self._ingest(document, path)
            tally[document.status if document.status == Document.Status.PROCESSED else "failed"] += 1
        self.stdout.write(
            f"{tally['processed']} processed, {tally['failed']} failed, {tally['refused']} refused "
            f"into workspace {target.slug}."
        )
        if tally["failed"]:
            raise CommandError(f"{tally['failed']} document(s) failed; see the messages above.")

    def _workspace(self, slug: str, create: bool, owner: str | None) -> Workspace:
        workspace = Workspace.objects.filter(slug=slug).first()
        if workspace is not None:
            return workspace
        if not create:
            raise CommandError(f"No workspace {slug!r}. Pass --create to make it.")
        user = None
        if owner:
            user = get_user_model().objects.filter(username=owner).first()
            if user is None:
                raise CommandError(f"No user {owner!r} to own the new workspace.")
        workspace = Workspace.objects.create(name=slug, slug=slug)
        if user is not None:
            Membership.objects.create(workspace=workspace, user=user, role=Role.OWNER)
        self.stdout.write(f"Created workspace {slug}.")
        return workspace

    def _files(self, paths: list[str]) -> list[Path]:
        files = []
        for raw in paths:
            path = Path(raw)
            if path.is_dir():
                found = sorted(p for p in path.rglob("*") if p.is_file())
                accepted = [p for p in found if p.suffix.lower() in parsing.ACCEPTED_TYPES]
                for skipped in sorted(set(found) - set(accepted)):
                    shown = str(skipped).encode("utf-8", "backslashreplace").decode()
                    self.stderr.write(f"skipped  {shown}: not one of {parsing.accepted_types()}")
                files += accepted
            elif path.is_file():
                files.append(path)
            else:
                raise CommandError(f"{raw}: no such file or folder.")
        return files

    def _ingest(self, document: Document, path: Path) -> Document:
        interactive = sys.stdout.isatty()

        def progress(current: Document) -> None:
            if interactive and current.stage_total:
                width = 30
                filled = width * current.stage_done // current.stage_total
                bar = "#" * filled + "." * (width - filled)
                stage = f"{current.get_stage_display()} {current.stage_done}/{current.stage_total}"
                self.stdout.write(f"\r{path.name[:40]:40} [{bar}] {stage:40}", ending="")
                self.stdout.flush()

        try:
            result = ingestion.document_ingest(document_id=document.pk, progress=progress)
        except ingestion.IngestInterrupted as err:
            result = ingestion.document_fail(document_id=document.pk, error=err.public, detail=str(err))
        if interactive:
            self.stdout.write("")
        result = result or Document.objects.get(pk=document.pk)
        if result.status == Document.Status.PROCESSED:
            self.stdout.write(
                f"ok       {path}: {result.chunk_count} chunks, {result.entity_count} entities, "
                f"{result.relation_count} relations"
            )
        else:
            self.stderr.write(f"failed   {path}: {result.error_detail or result.error}")
        return result
