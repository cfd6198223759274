"""Backup and restore of one workspace, as an archive another installation imports without any
model call.

The archive is a zip (format version 1):

- `manifest.json`: format and version, when it was made, the workspace, the embedding model and
  its dimension, row counts per table, and the size and sha256 of every other member;
- `tables/<table>.jsonl`: one JSON object per row, every column, ids as they were, vectors as
  lists of floats, users as usernames (see knowledge.services.backup.tables for the tables);
- `files/<document id>/<name>`: the uploaded files.

Derived state is not archived but made again by the restore: degrees (triggers on the relation
table), the full-text `search` columns (generated), the HNSW indexes (every inserted vector) and
the workspace's counters.
"""

from knowledge.services.backup.archive import FORMAT_VERSION, workspace_backup
from knowledge.services.backup.restore import ArchiveError, RestoreReport, workspace_restore

__all__ = ["FORMAT_VERSION", "ArchiveError", "RestoreReport", "workspace_backup", "workspace_restore"]
