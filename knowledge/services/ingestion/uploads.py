"""Uploads: what is checked in the request (cheap things), what is stored, and waking a worker."""

import hashlib
import os
import re

from celery import current_app
from django.conf import settings
from django.core.files.base import ContentFile
from django.db import IntegrityError, transaction

from knowledge.models import Document, Workspace
from knowledge.rag import parsing
from knowledge.services import events
from knowledge.services.ingestion import versions
from knowledge.services.workspaces import audit_record

INGEST_TASK = "knowledge.tasks.ingest_next"
MAX_FILENAME_CHARS = 200
SNIFF_BYTES = 8192
_CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
_UNSAFE_IN_STORAGE = re.compile(r"[^\w.-]")


class DocumentRejected(Exception):
    """An upload refused before anything was stored; `str(err)` is shown to the user as is."""


def wake_workers(count: int = 1) -> None:
    """Ask for `count` ingestion turns once the current transaction commits. A turn claims whichever
    document is due, so a wake-up that finds nothing to do costs one query."""
    transaction.on_commit(lambda: [current_app.send_task(INGEST_TASK) for _ in range(count)])


def _title_for(workspace: Workspace, filename: str, text: str, title: str | None, pasted: bool) -> str:
    """Pasted text: its title, or its first line. A file: its name with the extension, or the
    path it had in a dropped folder (the upload passes that as `title`), so report.pdf and
    report.docx, or two folders' index.md, stay apart; a title already in the workspace gets
    " (2)", " (3)"."""
    if pasted:
        if title and title.strip():
            return title.strip()[:300]
        first_line = next((line.strip() for line in text.splitlines() if line.strip()), "Pasted text")
        return first_line[:80]
    base = ((title or "").strip() or filename)[:290]
    candidate, number = base, 1
    while Document.objects.filter(workspace=workspace, title=candidate).exists():
        number += 1
        candidate = f"{base} ({number})"
    return candidate


def clean_filename(filename: str) -> str:
    """The file's own name as its owner wrote it, or DocumentRejected when nothing usable is left.
    Folders are the door's to take off (a slash is only a folder where the door says so); the name
    is kept whole, `<`, `/` and quotes included, and escaped where it is shown."""
    name = filename.strip()
    if _CONTROL_CHARS.search(name):
        raise DocumentRejected(f"{_CONTROL_CHARS.sub('?', name)!r}: a file name must not contain control characters.")
    if not name or name in {".", ".."}:
        raise DocumentRejected("The file has no name; name it and upload it again.")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = name.encode("utf-8", "replace").decode()
        raise DocumentRejected(f"{shown!r}: a file name must be valid UTF-8; rename the file.") from None
    if len(name) > MAX_FILENAME_CHARS:
        stem, extension = os.path.splitext(name)
        name = stem[: MAX_FILENAME_CHARS - len(extension)] + extension
    return name


def _storage_name(filename: str) -> str:
    """A name the file system takes for the stored copy; the document keeps the real one."""
    stem, extension = os.path.splitext(filename)
    safe = _UNSAFE_IN_STORAGE.sub("_", stem).strip("._") or "upload"
    return safe + _UNSAFE_IN_STORAGE.sub("_", extension)


def upload_limit_bytes() -> int:
    return settings.UPLOAD_MAX_MB * 2**20


def check_upload_size(name: str, size: int) -> None:
    """The upload limit (UPLOAD_MAX_MB), for files and pasted text alike. Doors call it with the
    size they were told before reading anything; document_create calls it again."""
    if size > upload_limit_bytes():
        raise DocumentRejected(f"{name} is larger than the {settings.UPLOAD_MAX_MB} MB upload limit.")


def document_create(
    *,
    workspace: Workspace,
    user=None,
    filename: str,
    data: bytes | None = None,
    text: str | None = None,
    title: str | None = None,
    replace: Document | None = None,
    match_title: bool = True,
    tags: list[str] | None = None,
    enqueue: bool = True,
) -> Document:
    """Store an upload (or pasted `text`) as a pending document and wake a worker for it.

    Only cheap checks happen here: the name and type, emptiness, size and a byte-identical file
    already in the workspace; the worker parses the file. Refusals raise DocumentRejected and
    store nothing. `enqueue=False` is for callers that run `document_ingest` themselves (the
    `ingest` command).

    A file titled like a current document of the workspace (unless not `match_title`), or
    `replace` given, becomes that document's next version (knowledge.services.ingestion.versions):
    it takes the old one's place when it is published.
    """
    pasted = text is not None
    check_upload_size(filename, len(text.encode()) if pasted else len(data or b""))
    if pasted:
        content = parsing.clean_text(text)
        if not content:
            raise DocumentRejected(f"No text found in {filename}.")
        file_hash, content_hash = "", hashlib.sha256(content.encode()).hexdigest()
        duplicate = Document.objects.filter(workspace=workspace, content_hash=content_hash)
    else:
        filename = clean_filename(filename)
        data = data or b""
        try:
            kind = parsing.kind_of(filename)
            if not data:
                raise DocumentRejected(f"{filename} is empty.")
            if kind in parsing.TEXT_KINDS:
                # A look at the first bytes catches a binary file under a text name at once.
                parsing.decode_text(filename, data[:SNIFF_BYTES])
        except parsing.ParseError as err:
            raise DocumentRejected(str(err)) from err
        content, file_hash, content_hash = "", hashlib.sha256(data).hexdigest(), ""
        duplicate = Document.objects.filter(workspace=workspace, file_hash=file_hash)
        if replace is None and match_title:
            replace = versions.replaced_by_upload(workspace=workspace, title=(title or "").strip() or filename)
    existing = duplicate.current().only("title").first()
    if existing is not None and existing == replace:
        raise DocumentRejected(f"{filename} is unchanged: “{existing.title}” already has this text.")
    if existing is not None:
        raise DocumentRejected(f"{filename} has the same text as “{existing.title}”, already in this workspace.")
    problem = versions.replace_problem(document=replace) if replace is not None else ""
    if problem:
        raise DocumentRejected(f"{filename}: {problem}")
    document = Document(
        workspace=workspace,
        title=replace.title if replace is not None else _title_for(workspace, filename, content, title, pasted),
        original_filename="" if pasted else filename,
        text=content,
        content_hash=content_hash,
        file_hash=file_hash,
        created_by=user if user is not None and user.is_authenticated else None,
        **(versions.next_version_fields(replace) if replace is not None else {"tags": tags or []}),
    )
    try:
        with transaction.atomic():
            if not pasted:
                document.source_file.save(_storage_name(filename), ContentFile(data), save=False)
            document.save()
            audit_record(
                workspace=workspace,
                actor=user,
                action="document.upload",
                summary=f"Uploaded document “{document.title}”" if not pasted else f"Pasted “{document.title}”",
                detail={
                    "document_id": document.pk,
                    "title": document.title,
                    "filename": document.original_filename,
                    "bytes": len(data) if not pasted else len(content.encode()),
                },
            )
            if enqueue:
                wake_workers()
    except IntegrityError as err:
        # The same text pasted twice at once: the unique constraint decides, the loser goes.
        raise DocumentRejected(f"{filename} has the same text as a document just added to this workspace.") from err
    finally:
        if document.pk is None and document.source_file:
            document.source_file.delete(save=False)
    events.publish_document_progress(document)
    return document
