"""Readable tables and JSON for the CLI."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from datetime import datetime
from typing import Any, TextIO

#: The control-table columns `status` and the demo print.
STATUS_COLUMNS = ["trigger_job_id", "trigger_job_name", "sensor_source", "sensor_id", "dependency_flag", "job_state",
                  "status", "status_change_timestamp", "job_run_id", "last_error"]


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    if isinstance(value, float):
        return f"{value:.3f}"
    if isinstance(value, (list, tuple)):
        return ",".join(map(str, value))
    return str(value)


def format_table(rows: Sequence[dict], columns: Sequence[str], *, max_width: int = 48) -> str:
    """A plain-text table; long cells are cut with an ellipsis."""
    def clip(text: str) -> str:
        return text if len(text) <= max_width else text[: max_width - 1] + "…"

    cells = [[clip(_cell(row.get(c))) for c in columns] for row in rows]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.upper().ljust(w) for c, w in zip(columns, widths)).rstrip(),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths)).rstrip() for r in cells]
    return "\n".join(lines)


def emit(rows: Sequence[dict], columns: Sequence[str], *, as_json: bool, title: str | None = None,
         out: TextIO = sys.stdout) -> None:
    """Print rows as a table (with an optional title) or as a JSON array."""
    if as_json:
        json.dump([{c: r.get(c) for c in columns} for r in rows], out, default=_json_default, indent=2)
        out.write("\n")
        return
    if title:
        out.write(f"{title}\n")
    out.write(format_table(rows, columns) + "\n" if rows else "(none)\n")


def emit_json(value: Any, out: TextIO = sys.stdout) -> None:
    json.dump(value, out, default=_json_default, indent=2)
    out.write("\n")


def _json_default(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    return str(value)
