"""Fast questions answered from a Delta table's ``_delta_log`` without a Spark job.

"Has anything changed since version N?" is a file check per new commit (a directory
listing the first time); the commit files say whether those versions added data. Used
for tables on local disk (the embedded engine); other engines fall back to Spark.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

#: operations that only reorganise files or change metadata: no new data for downstream
#: commits that never count as new data, whatever files they add (compaction rewrites, vacuum, table
#: properties and comments, constraints, schema changes, an empty create or replace): the local
#: ``_delta_log`` path and the table-history path (Databricks) apply the same set
NO_DATA_OPERATIONS = frozenset({
    "OPTIMIZE", "VACUUM START", "VACUUM END", "SET TBLPROPERTIES", "UNSET TBLPROPERTIES", "ADD CONSTRAINT",
    "DROP CONSTRAINT", "CHANGE COLUMN", "ADD COLUMNS", "REPLACE COLUMNS", "RENAME COLUMN", "DROP COLUMNS",
    "FSCK", "UPGRADE PROTOCOL", "REORG", "CLUSTER BY", "SET TAGS", "UNSET TAGS", "COMPUTE STATS",
    "ROW TRACKING BACKFILL", "CREATE TABLE", "REPLACE TABLE", "CREATE OR REPLACE TABLE",
})


#: the newest version last found per ``_delta_log`` folder. The next look probes forward from it, a
#: ``stat`` per new commit, instead of listing a folder that keeps every commit file for the table's log
#: retention (30 days by default: a listing grows with every commit, ~1 ms per 1,000 of them).
_newest_seen: dict[str, int] = {}


def latest_version(table_dir: Path) -> int | None:
    """Newest committed version, or None when ``table_dir`` is not a Delta table.

    Commits are numbered without gaps and the newest commit file is never cleaned up, so while the
    version found last still has its file, the newest is the last of the files that follow it; when
    that file is gone (the table was dropped or re-created), the folder is listed again."""
    log_dir = os.path.join(table_dir, "_delta_log")
    known = _newest_seen.get(log_dir)
    version: int | None
    if known is not None and os.path.exists(_commit_file(log_dir, known)):
        while os.path.exists(_commit_file(log_dir, known + 1)):
            known += 1
        version = known
    else:
        version = _listed_latest_version(Path(log_dir))
    if version is None:
        _newest_seen.pop(log_dir, None)
    else:
        _newest_seen[log_dir] = version
    return version


def _commit_file(log_dir: str, version: int) -> str:
    return os.path.join(log_dir, f"{version:020d}.json")


def _listed_latest_version(log_dir: Path) -> int | None:
    """Newest committed version from a listing of ``log_dir`` (None: no such folder, or no commit)."""
    try:
        names = os.listdir(log_dir)
    except (FileNotFoundError, NotADirectoryError):
        return None
    best = -1
    for name in names:
        if name.endswith(".json") and len(name) == 25 and name[:20].isdigit():
            best = max(best, int(name[:20]))
    if best < 0:
        checkpoint = log_dir / "_last_checkpoint"
        if checkpoint.exists():
            return int(json.loads(checkpoint.read_text())["version"])
        return None
    return best


def _commit_actions(table_dir: Path, version: int) -> list[dict] | None:
    """The actions of commit ``version`` of the table at ``table_dir``, in order (None: its file was already
    cleaned up)."""
    try:
        text = Path(_commit_file(os.path.join(table_dir, "_delta_log"), version)).read_text()
    except FileNotFoundError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def added_data_between(table_dir: Path, after_version: int, up_to_version: int) -> bool:
    """Whether any commit in (after_version, up_to_version] added data files with dataChange.

    A commit file that was already cleaned up counts as adding data (the safe answer).
    """
    for version in range(after_version + 1, up_to_version + 1):
        actions = _commit_actions(table_dir, version)
        if actions is None:
            return True
        operation = None
        for action in actions:
            if "commitInfo" in action:
                operation = action["commitInfo"].get("operation")
            if action.get("add", {}).get("dataChange", False) and operation not in NO_DATA_OPERATIONS:
                return True
    return False


def operations_between(table_dir: Path, after_version: int, up_to_version: int) -> list[str] | None:
    """The operation of each commit in (after_version, up_to_version], in order (``commitInfo.operation``; "" for
    a commit that names none); None when a commit file was already cleaned up."""
    operations = []
    for version in range(after_version + 1, up_to_version + 1):
        actions = _commit_actions(table_dir, version)
        if actions is None:
            return None
        info: dict = next((action["commitInfo"] for action in actions if "commitInfo" in action), {})
        operations.append(str(info.get("operation") or ""))
    return operations


def max_added_value(table_dir: Path, after_version: int, up_to_version: int, column: str) -> tuple[str | None, bool]:
    """The greatest ``maxValues[column]`` of the files that commits in (after_version, up_to_version] added, as the
    log's statistics write it (text; a timestamp to the millisecond), and whether every such file had one. False
    (not complete) when a commit file was already cleaned up or a file was written without statistics: the caller
    asks the engine instead."""
    greatest: str | None = None
    for version in range(after_version + 1, up_to_version + 1):
        actions = _commit_actions(table_dir, version)
        if actions is None:
            return None, False
        for added in (action["add"] for action in actions if action.get("add") is not None):
            stats = json.loads(added.get("stats") or "{}")
            value = (stats.get("maxValues") or {}).get(column)
            if value is None:
                if stats.get("numRecords") == 0:
                    continue
                return None, False
            greatest = value if greatest is None or value > greatest else greatest
    return greatest, True
