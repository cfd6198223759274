"""Writing a workspace archive (see knowledge.services.backup for the format)."""

import hashlib
import json
import os
import posixpath
import zipfile
from datetime import datetime
from pathlib import Path

import numpy as np
from django.core.files.storage import default_storage
from django.db.models import F
from django.utils import timezone

from knowledge.models import Document, Workspace
from knowledge.rag import llm
from knowledge.rag.graph import vector_dimensions
from knowledge.services.backup.tables import TABLES, Table
from knowledge.services.export import read_snapshot

FORMAT = "graphrag-teams-workspace"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
FILE_BLOCK = 1024 * 1024
ROWS_PER_READ = 500


def json_value(value):
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, np.ndarray):
        # float32 values printed as Python floats read back to the very same float32.
        return value.tolist()
    return value


class _HashingWriter:
    def __init__(self, member):
        self.member = member
        self.sha256 = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> None:
        self.member.write(data)
        self.sha256.update(data)
        self.size += len(data)


def _table_rows(table: Table, workspace: Workspace):
    columns = [field.attname for field in table.model._meta.concrete_fields if field.attname not in table.users]
    user_columns = {f"_user_{key}": F(f"{column.removesuffix('_id')}__username") for column, key in table.users.items()}
    rows = table.rows(workspace).order_by("pk").values(*columns, **user_columns)
    for row in rows.iterator(chunk_size=ROWS_PER_READ):
        for key in table.users.values():
            row[key] = row.pop(f"_user_{key}")
        yield {name: json_value(value) for name, value in row.items()}


def _write_table(archive: zipfile.ZipFile, table: Table, workspace: Workspace) -> dict:
    with archive.open(table.member, "w", force_zip64=True) as member:
        out = _HashingWriter(member)
        rows = 0
        for row in _table_rows(table, workspace):
            out.write(json.dumps(row, ensure_ascii=False, allow_nan=False).encode() + b"\n")
            rows += 1
    return {"sha256": out.sha256.hexdigest(), "bytes": out.size, "rows": rows}


def file_member(document_id: int, name: str) -> str:
    return f"files/{document_id}/{posixpath.basename(name.replace(chr(92), '/')) or 'file'}"


def _write_files(archive: zipfile.ZipFile, workspace: Workspace) -> tuple[dict, list[str]]:
    listed, missing = {}, []
    documents = Document.objects.filter(workspace=workspace).exclude(source_file="").order_by("pk")
    for pk, name in documents.values_list("pk", "source_file"):
        member_name = file_member(pk, name)
        try:
            source = default_storage.open(name, "rb")
        except FileNotFoundError:
            missing.append(name)
            continue
        with source, archive.open(member_name, "w", force_zip64=True) as member:
            out = _HashingWriter(member)
            while block := source.read(FILE_BLOCK):
                out.write(block)
        listed[member_name] = {"sha256": out.sha256.hexdigest(), "bytes": out.size}
    return listed, missing


def workspace_backup(*, workspace: Workspace, path: str | Path, conversations: bool = False) -> dict:
    """Write the workspace's archive to `path` and return its manifest.

    Everything is read in one repeatable-read transaction, so the archive is one consistent
    state even while documents are being ingested. It is written beside `path` and renamed
    into place at the end: an interrupted backup never leaves a file that looks complete.
    """
    path = Path(path)
    partial = path.with_name(f".{path.name}.partial")
    try:
        with zipfile.ZipFile(partial, "w", compression=zipfile.ZIP_DEFLATED) as archive, read_snapshot():
            workspace = Workspace.objects.get(pk=workspace.pk)
            members = {}
            for table in TABLES:
                if table.conversations and not conversations:
                    continue
                members[table.member] = _write_table(archive, table, workspace)
            files, missing = _write_files(archive, workspace)
            members.update(files)
            manifest = {
                "format": FORMAT,
                "version": FORMAT_VERSION,
                "created_at": timezone.now().isoformat(),
                "workspace": {"slug": workspace.slug, "name": workspace.name},
                "embedding": {"model": llm.embedding_model_name(), "dimensions": vector_dimensions()},
                "conversations": conversations,
                "counts": {table.name: members[table.member]["rows"] for table in TABLES if table.member in members},
                "missing_files": missing,
                "members": members,
            }
            archive.writestr(MANIFEST, json.dumps(manifest, indent=2, ensure_ascii=False))
        os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
    return manifest
