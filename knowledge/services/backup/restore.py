"""Restoring a workspace archive (see knowledge.services.backup for the format).

The archive is checked whole before anything is written (its manifest, every member's name
and checksum, the embedding model), then every row goes in inside one transaction: any
failure leaves the database as it was, and the files saved so far are removed.
"""

import bisect
import hashlib
import json
import logging
import re
import zipfile
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.core.files.base import File
from django.core.files.storage import default_storage
from django.core.validators import validate_slug
from django.db import DatabaseError, connection, transaction

from knowledge.models import Document, Membership, Role, Workspace
from knowledge.rag import llm
from knowledge.rag.graph import vector_dimensions
from knowledge.services.backup.archive import FORMAT, FORMAT_VERSION, MANIFEST, file_member
from knowledge.services.backup.tables import TABLES, WORKSPACE, Table, walk_row
from knowledge.services.workspaces import audit_record, workspace_refresh_counts

logger = logging.getLogger(__name__)

# Rows per INSERT, within Postgres' 65,535 parameters for the widest table.
ROWS_PER_STATEMENT = 500
_FILE_MEMBER = re.compile(r"files/(\d+)/([^/\\]+)")


class ArchiveError(Exception):
    """The archive cannot be restored; `str(err)` says why and what to do."""


@dataclass
class RestoreReport:
    workspace: Workspace
    counts: dict[str, int]
    # Rows that need a user this installation does not have (memberships, conversations), by username.
    skipped: dict[str, list[str]] = field(default_factory=dict)
    missing_files: list[str] = field(default_factory=list)


# --- Reading and checking the archive ----------------------------------------------------


def _safe_member_name(name: str) -> bool:
    if not name or name.startswith("/") or "\\" in name or "\x00" in name or re.match(r"^[A-Za-z]:", name):
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


def _open(path: str | Path) -> zipfile.ZipFile:
    try:
        return zipfile.ZipFile(path)
    except FileNotFoundError as exc:
        raise ArchiveError(f"No archive at {path}.") from exc
    except (zipfile.BadZipFile, OSError) as exc:
        raise ArchiveError(f"{path} is not a readable workspace archive (truncated, or not a zip): {exc}.") from exc


def _read_manifest(archive: zipfile.ZipFile) -> dict:
    names = archive.namelist()
    unsafe = [name for name in names if not _safe_member_name(name)]
    if unsafe:
        raise ArchiveError(f"The archive holds a member with an unsafe name ({unsafe[0]!r}); it was not restored.")
    if len(set(names)) != len(names):
        raise ArchiveError("The archive holds the same member twice; it was not restored.")
    if MANIFEST not in names:
        raise ArchiveError("The archive has no manifest.json: it is not a workspace backup.")
    try:
        manifest = json.loads(_read(archive, MANIFEST))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ArchiveError(f"The archive's manifest is not valid JSON: {exc}.") from exc
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise ArchiveError("The archive's manifest does not describe a workspace backup.")
    if manifest.get("version") != FORMAT_VERSION:
        raise ArchiveError(
            f"The archive is in format version {manifest.get('version')!r}; this installation reads version "
            f"{FORMAT_VERSION}. Restore it with the version of the application that wrote it."
        )
    members = manifest.get("members")
    if not isinstance(members, dict):
        raise ArchiveError("The archive's manifest lists no members.")
    wanted = [table for table in TABLES if not table.added_later]
    expected = {table.member for table in wanted if manifest.get("conversations") or not table.conversations}
    allowed = {table.member for table in TABLES}
    for name in members:
        if not _safe_member_name(name) or not (name in allowed or _FILE_MEMBER.fullmatch(name)):
            raise ArchiveError(f"The manifest lists an unexpected member {name!r}; it was not restored.")
    if missing := sorted(expected - set(members)):
        raise ArchiveError(f"The manifest does not list {missing[0]}; the archive is incomplete.")
    if extra := sorted(set(names) - set(members) - {MANIFEST}):
        raise ArchiveError(f"The archive holds {extra[0]!r}, which its manifest does not list; it was not restored.")
    if absent := sorted(set(members) - set(names)):
        raise ArchiveError(f"The archive lacks {absent[0]}, which its manifest lists; it is incomplete.")
    return manifest


def _read(archive: zipfile.ZipFile, name: str) -> bytes:
    try:
        return archive.read(name)
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ArchiveError(f"{name} in the archive is damaged: {exc}.") from exc


def _lines(archive: zipfile.ZipFile, table: Table):
    """The rows of a table member, one JSON object per line."""
    try:
        with archive.open(table.member) as member:
            for number, line in enumerate(member, start=1):
                try:
                    row = json.loads(line)
                except ValueError as exc:
                    raise ArchiveError(f"{table.member}, line {number}, is not valid JSON: {exc}.") from exc
                if not isinstance(row, dict) or not isinstance(row.get("id"), int):
                    raise ArchiveError(f"{table.member}, line {number}, is not a row with an id.")
                yield row
    except (zipfile.BadZipFile, OSError, EOFError) as exc:
        raise ArchiveError(f"{table.member} in the archive is damaged: {exc}.") from exc


def _check_checksums(archive: zipfile.ZipFile, manifest: dict) -> None:
    for name, expected in manifest["members"].items():
        digest = hashlib.sha256()
        try:
            with archive.open(name) as member:
                while block := member.read(1024 * 1024):
                    digest.update(block)
        except (zipfile.BadZipFile, OSError, EOFError) as exc:
            raise ArchiveError(f"{name} in the archive is damaged: {exc}.") from exc
        if not isinstance(expected, dict) or digest.hexdigest() != expected.get("sha256"):
            raise ArchiveError(
                f"{name} does not match the checksum in the manifest: the archive was changed or damaged."
            )


def _check_embedding(manifest: dict) -> None:
    embedding = manifest.get("embedding") or {}
    model, dimensions = embedding.get("model"), embedding.get("dimensions")
    here_model, here_dimensions = llm.embedding_model_name(), vector_dimensions()
    if dimensions != here_dimensions or model != here_model:
        raise ArchiveError(
            f"The archive's vectors were made by {model} ({dimensions} dimensions); this installation embeds "
            f"with {here_model} ({here_dimensions} dimensions), so they cannot be searched here. Restore it on "
            f"an installation configured like the one that wrote it (EMBEDDING_MODEL={model}, "
            f"EMBEDDING_DIM={dimensions}), then re-embed there with `python manage.py reembed` after switching "
            "to this installation's model, and back it up again."
        )


# --- Ids ---------------------------------------------------------------------------------


class _Recorder:
    """Collects every id the rows hold, per table, in a first pass."""

    def __init__(self):
        self.seen: dict[str, set[int]] = defaultdict(set)

    def id(self, table: str, value):
        if value is not None:
            if not isinstance(value, int) or isinstance(value, bool):
                raise ArchiveError(f"The archive holds an id of {table} that is not a number: {value!r}.")
            self.seen[table].add(value)
        return value

    def floor(self, table: str, value):
        return value


class _Mapping:
    """Old ids to new ones, order kept, drawn from the target's sequences."""

    def __init__(self, seen: dict[str, set[int]], workspace_id: int):
        self.old: dict[str, list[int]] = {}
        self.new: dict[str, list[int]] = {}
        self.workspace_id = workspace_id
        models = {table.name: table.model for table in TABLES}
        for name, ids in seen.items():
            if name == WORKSPACE:
                continue
            self.old[name] = sorted(ids)
            self.new[name] = _allocate(models[name], len(ids))
        self.index = {name: {old: i for i, old in enumerate(olds)} for name, olds in self.old.items()}

    def id(self, table: str, value):
        if value is None:
            return None
        if table == WORKSPACE:
            return self.workspace_id
        return self.new[table][self.index[table][value]]

    def floor(self, table: str, value):
        olds = self.old.get(table, [])
        position = bisect.bisect_right(olds, value) - 1 if isinstance(value, int) else -1
        return self.new[table][position] if position >= 0 else 0


def _allocate(model, count: int) -> list[int]:
    """`count` fresh ids from the table's own sequence, so later rows made here never collide."""
    table = model._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute("SELECT nextval(pg_get_serial_sequence(%s, 'id')) FROM generate_series(1, %s)", [table, count])
        return sorted(row[0] for row in cursor.fetchall())


# --- Writing -----------------------------------------------------------------------------


def _users(usernames: set[str]) -> dict[str, int]:
    """The users of this installation that have the archived usernames."""
    return dict(get_user_model().objects.filter(username__in=usernames).values_list("username", "pk"))


class _Inserter:
    """Rows of one table in, with their columns converted as the model's fields do."""

    def __init__(self, table: Table):
        self.table = table
        self.fields = {field.attname: field for field in table.model._meta.concrete_fields}
        self.columns: list[str] | None = None
        self.pending: list[list] = []
        self.count = 0

    def add(self, row: dict) -> None:
        if self.columns is None:
            unknown = sorted(set(row) - set(self.fields))
            if unknown:
                raise ArchiveError(
                    f"{self.table.member} has a column this installation does not know ({unknown[0]}); restore "
                    "it with the version of the application that wrote it."
                )
            # Columns a newer installation added take their defaults.
            for name, model_field in self.fields.items():
                if name not in row and model_field.has_default():
                    row[name] = model_field.get_default()
            self.columns = list(row)
        elif set(row) != set(self.columns):
            raise ArchiveError(f"{self.table.member} has rows with different columns.")
        values = []
        for name in self.columns:
            model_field, value = self.fields[name], row[name]
            if value is not None:
                try:
                    value = model_field.get_db_prep_save(model_field.to_python(value), connection)
                except (ValidationError, TypeError, ValueError) as exc:
                    raise ArchiveError(f"{self.table.member}: {name} holds {str(value)[:80]!r}: {exc}") from exc
            values.append(value)
        self.pending.append(values)
        if len(self.pending) >= ROWS_PER_STATEMENT:
            self.flush()

    def flush(self) -> None:
        if not self.pending:
            return
        quote = connection.ops.quote_name
        columns = ", ".join(quote(self.fields[name].column) for name in self.columns)
        row = "(" + ", ".join(["%s"] * len(self.columns)) + ")"
        # One statement per batch: the degree triggers run per statement, and round trips add up.
        sql = f"INSERT INTO {quote(self.table.model._meta.db_table)} ({columns}) VALUES "  # noqa: S608 - names from the model
        with connection.cursor() as cursor:
            cursor.execute(
                sql + ", ".join([row] * len(self.pending)), [value for values in self.pending for value in values]
            )
        self.count += len(self.pending)
        self.pending = []


@dataclass
class _Restore:
    archive: zipfile.ZipFile
    manifest: dict
    tables: list[Table]
    users: dict[str, int]
    saved_files: list[str] = field(default_factory=list)
    skipped: dict[str, list[str]] = field(default_factory=lambda: defaultdict(list))
    missing_rows: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))

    def rows(self, table: Table, ids) -> Iterator[tuple[int, dict]]:
        for row in _lines(self.archive, table):
            if any(row.get(column) in self.missing_rows[target] for column, target in table.refs.items()):
                # A message of a conversation that was not restored.
                self.missing_rows[table.name].add(row["id"])
                continue
            old_id = row["id"]
            row = walk_row(table, row, ids)
            if not self._users(table, row, old_id):
                continue
            yield old_id, row

    def _users(self, table: Table, row: dict, old_id: int) -> bool:
        for column, key in table.users.items():
            username = row.pop(key, None)
            row[column] = self.users.get(username)
            if row[column] is None and table.user_required:
                self.skipped[table.name].append(username or "(none)")
                self.missing_rows[table.name].add(old_id)
                return False
        return True

    def document(self, old_id: int, row: dict) -> None:
        # A run of the old installation held it; here the sweeper hands it to a worker again.
        row["lease_owner"], row["lease_expires_at"] = "", None
        name = row.get("source_file") or ""
        if not name:
            return
        member = file_member(old_id, name)
        if member not in self.manifest["members"]:
            row["source_file"] = ""
            return
        upload = Document._meta.get_field("source_file").generate_filename(None, Path(member).name)
        with self.archive.open(member) as source:
            saved = default_storage.save(upload, File(source, name=Path(member).name))
        self.saved_files.append(saved)
        row["source_file"] = saved

    def remove_files(self) -> None:
        for name in self.saved_files:
            try:
                default_storage.delete(name)
            except OSError:
                logger.warning("Could not remove %s after a failed restore", name)


def _workspace_row(archive: zipfile.ZipFile, table: Table) -> dict:
    rows = list(_lines(archive, table))
    if len(rows) != 1:
        raise ArchiveError("The archive must hold exactly one workspace.")
    return rows[0]


def _check_slug(slug: str) -> None:
    try:
        validate_slug(slug)
    except ValidationError as exc:
        raise ArchiveError(f"{slug!r} is not a valid workspace address: use letters, digits, - and _.") from exc
    if len(slug) > Workspace._meta.get_field("slug").max_length:
        raise ArchiveError(f"{slug!r} is too long for a workspace address.")
    if Workspace.objects.filter(slug=slug).exists():
        raise ArchiveError(
            f"A workspace with the address {slug!r} exists here already; pass a new one (--slug) to restore "
            "the archive beside it."
        )


def workspace_restore(*, path: str | Path, slug: str | None = None, owner=None) -> RestoreReport:
    """Restore the archive at `path` as a new workspace (at `slug`, or the archived one), with
    no model call: vectors, extraction records and summaries come from the archive.

    `owner` (a user) is made its owner; members and conversations whose usernames exist here
    keep their roles and threads, the others are reported as skipped.
    """
    with _open(path) as archive:
        manifest = _read_manifest(archive)
        _check_embedding(manifest)
        _check_checksums(archive, manifest)
        tables = [table for table in TABLES if table.member in manifest["members"]]
        workspace_table, tables = tables[0], tables[1:]
        if workspace_table.name != WORKSPACE:
            raise ArchiveError("The archive holds no workspace.")
        workspace_row = _workspace_row(archive, workspace_table)
        slug = slug or workspace_row.get("slug")
        if not isinstance(slug, str):
            raise ArchiveError("The archive's workspace has no address; pass one (--slug).")
        _check_slug(slug)

        recorder, usernames, counts = _Recorder(), set(), {}
        for table in tables:
            counts[table.name] = 0
            for row in _lines(archive, table):
                walk_row(table, row, recorder)
                usernames.update(row.get(key) for key in table.users.values() if isinstance(row.get(key), str))
                counts[table.name] += 1
            if counts[table.name] != manifest.get("counts", {}).get(table.name):
                raise ArchiveError(f"{table.member} holds {counts[table.name]} rows; its manifest says otherwise.")

        restore = _Restore(archive, manifest, tables, _users(usernames))
        try:
            with transaction.atomic():
                workspace = _insert_workspace(workspace_row, workspace_table, slug)
                ids = _Mapping(recorder.seen, workspace.pk)
                restored = {}
                for table in tables:
                    inserter = _Inserter(table)
                    for old_id, row in restore.rows(table, ids):
                        if table.name == "documents":
                            restore.document(old_id, row)
                        inserter.add(row)
                    inserter.flush()
                    restored[table.name] = inserter.count
                workspace_refresh_counts(workspace_id=workspace.pk)
                if owner is not None:
                    Membership.objects.update_or_create(workspace=workspace, user=owner, defaults={"role": Role.OWNER})
                workspace.refresh_from_db()
                audit_record(
                    workspace=workspace,
                    actor=owner,
                    action="workspace.restore",
                    summary=f"Restored from a backup of {manifest['workspace'].get('slug')} made "
                    f"{manifest.get('created_at', '')[:19]}",
                    detail={"counts": restored, "skipped": dict(restore.skipped)},
                )
        except ArchiveError:
            restore.remove_files()
            raise
        except DatabaseError as exc:
            restore.remove_files()
            raise ArchiveError(f"The archive's rows do not fit this database: {exc}".strip()) from exc
        except BaseException:
            restore.remove_files()
            raise
    return RestoreReport(
        workspace=workspace,
        counts=restored,
        skipped=dict(restore.skipped),
        missing_files=list(manifest.get("missing_files") or []),
    )


def _insert_workspace(row: dict, table: Table, slug: str) -> Workspace:
    workspace = Workspace.objects.create(name=row.get("name") or slug, slug=slug)
    inserter = _Inserter(table)
    settings_row = {
        name: value
        for name, value in row.items()
        if name not in ("id", "slug", "chunk_count", "entity_count", "relation_count")
    }
    for name in settings_row:
        if name not in inserter.fields:
            raise ArchiveError(f"{table.member} has a column this installation does not know ({name}).")
    for name, value in settings_row.items():
        model_field = inserter.fields[name]
        setattr(workspace, name, model_field.to_python(value) if value is not None else None)
    # created_at is auto_now_add: only an update keeps the archived one.
    Workspace.objects.filter(pk=workspace.pk).update(**{name: getattr(workspace, name) for name in settings_row})
    workspace.refresh_from_db()
    return workspace
