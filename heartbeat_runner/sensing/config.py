"""Loading and validating the sensor config CSV (the dbt seed).

Real configs are messy: ``TRUE ``, ``true``, blanks. Values are normalised here and
every problem is reported at once, each naming file, line and column, before
anything is written.
"""

from __future__ import annotations

import csv
import hashlib
import io
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from pathlib import Path

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.core.plugins import PluginError
from heartbeat_runner.core.records import JobState
from heartbeat_runner.sensing.preprocess import check_preprocess_query
from heartbeat_runner.sensing.sources.registry import source_for, source_types, unknown_source

COLUMNS = (
    "sensor_source",
    "sensor_id",
    "sensor_read_type",
    "asset_description",
    "upstream_key",
    "preprocess_query",
    "trigger_job_id",
    "trigger_job_name",
    "job_state",
    "dependency_flag",
)
REQUIRED_COLUMNS = ("sensor_source", "sensor_id", "trigger_job_id")
#: The spec's sample table spells it this way; accepted as an alias.
COLUMN_ALIASES = {"dependancy_flag": "dependency_flag"}
DEFAULTS = {"sensor_read_type": "batch", "job_state": "UNPAUSED", "dependency_flag": "TRUE"}

READ_TYPES = ("batch", "streaming")
JOB_STATES = tuple(state.value for state in JobState)
_TRUE = ("TRUE", "T", "1", "YES", "Y")
_FALSE = ("FALSE", "F", "0", "NO", "N")
_IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_UPSTREAM_KEY_REF = re.compile(r"\?upstream_key\b")
_JOB_ID = re.compile(r"^[A-Za-z0-9_.:-]+$")


@dataclass(frozen=True)
class SensorConfigRow:
    """One normalised config row. ``line`` is its line number in the CSV (header = 1)."""

    line: int
    sensor_source: str
    sensor_id: str
    sensor_read_type: str
    asset_description: str | None
    upstream_key: str | None
    preprocess_query: str | None
    trigger_job_id: str
    trigger_job_name: str | None
    job_state: str
    dependency_flag: bool

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.sensor_source, self.sensor_id, self.trigger_job_id)

    @property
    def source_key(self) -> str:
        """The source this row reads, as the control table names it (the macro ``heartbeat_source_key``):
        rows reading one source the same way share it."""
        if self.upstream_key is None and self.preprocess_query is None:
            return f"{self.sensor_source}:{self.sensor_id}"
        how = f"{self.upstream_key or ''}|{self.preprocess_query or ''}"
        return f"{self.sensor_source}:{self.sensor_id}#{hashlib.sha256(how.encode()).hexdigest()[:10]}"

    def as_csv_record(self) -> dict[str, str]:
        record = {k: ("" if v is None else v) for k, v in asdict(self).items() if k != "line"}
        record["dependency_flag"] = "TRUE" if self.dependency_flag else "FALSE"
        return record


@dataclass(frozen=True)
class LoadedConfig:
    path: Path
    rows: list[SensorConfigRow]
    #: optional columns absent from the file (their defaults were used)
    defaulted_columns: tuple[str, ...] = ()

    def to_csv(self) -> str:
        """The normalised config as CSV, in the canonical column order."""
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=list(COLUMNS), lineterminator="\n")
        writer.writeheader()
        for row in self.rows:
            writer.writerow(row.as_csv_record())
        return out.getvalue()


def _clean(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.strip()
    return value or None


def load_config(path: Path) -> LoadedConfig:
    """Read, normalise and validate ``path``. Raise ConfigError listing every problem."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError([f"{path}: file not found"])
    text = path.read_text(encoding="utf-8-sig")
    reader = csv.reader(io.StringIO(text))
    try:
        header = next(reader)
    except StopIteration as exc:
        raise ConfigError([f"{path}: line 1: the file is empty (expected a header with {', '.join(COLUMNS)})"]) from exc
    header = [COLUMN_ALIASES.get(h.strip().lower(), h.strip().lower()) for h in header]
    problems: list[str] = []
    unknown = [h for h in header if h not in COLUMNS]
    if unknown:
        problems.append(f"{path}: line 1: unknown column(s) {', '.join(map(repr, unknown))}; expected {', '.join(COLUMNS)}")
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        problems.append(f"{path}: line 1: missing required column(s) {', '.join(missing)}")
    dupes = sorted({h for h in header if header.count(h) > 1})
    if dupes:
        problems.append(f"{path}: line 1: duplicate column(s) {', '.join(dupes)}")
    if problems:
        raise ConfigError(problems)
    defaulted = tuple(c for c in COLUMNS if c not in header)

    rows: list[SensorConfigRow] = []
    for raw in reader:
        line = reader.line_num
        if not any(cell.strip() for cell in raw):
            continue
        if len(raw) != len(header):
            problems.append(f"{path}: line {line}: has {len(raw)} fields, the header has {len(header)}")
            continue
        values = {c: _clean(v) for c, v in zip(header, raw)}
        row = _validate_row(path, line, values, problems)
        if row is not None:
            rows.append(row)
    _validate_across_rows(path, rows, problems)
    if problems:
        raise ConfigError(problems)
    return LoadedConfig(path=path, rows=rows, defaulted_columns=defaulted)


def _validate_row(path: Path, line: int, values: dict[str, str | None], problems: list[str]) -> SensorConfigRow | None:
    before = len(problems)

    def bad(column: str, message: str) -> None:
        problems.append(f"{path}: line {line}, column {column}: {message}")

    for column, default in DEFAULTS.items():
        if values.get(column) is None:
            values[column] = default

    source = (values.get("sensor_source") or "").lower()
    if not source:
        bad("sensor_source", "is empty")
    elif source not in source_types():
        bad("sensor_source", unknown_source(source))
    sensor_id = values.get("sensor_id")
    if not sensor_id:
        bad("sensor_id", "is empty")
    read_type = _filled(values, "sensor_read_type").lower()
    if read_type not in READ_TYPES:
        bad("sensor_read_type", f"{values['sensor_read_type']!r} is not one of {', '.join(READ_TYPES)}")
    job_id = values.get("trigger_job_id")
    if not job_id:
        bad("trigger_job_id", "is empty (every row must name the job it triggers)")
    elif not _JOB_ID.match(job_id):
        bad("trigger_job_id", f"{job_id!r} may contain only letters, digits and _ . : -")
    job_state = _filled(values, "job_state").upper()
    if job_state not in JOB_STATES:
        bad("job_state", f"{values['job_state']!r} is not one of {', '.join(JOB_STATES)}")
    flag = _filled(values, "dependency_flag").upper()
    if flag not in _TRUE + _FALSE:
        bad("dependency_flag", f"{values['dependency_flag']!r} is not TRUE (hard) or FALSE (soft)")
    upstream_key = values.get("upstream_key")
    if upstream_key and not _IDENTIFIER.match(upstream_key):
        bad("upstream_key", f"{upstream_key!r} is not a valid column name")
    query = values.get("preprocess_query")
    if query and _UPSTREAM_KEY_REF.search(query) and not upstream_key:
        bad("preprocess_query", "uses ?upstream_key but upstream_key is empty")
    elif query:
        query_problem = check_preprocess_query(query, upstream_key)
        if query_problem is not None:
            bad("preprocess_query", str(query_problem))
    if source in source_types() and sensor_id:
        try:
            problem = source_for(source).check_config(sensor_id, upstream_key)
        except PluginError as exc:
            problem = f"sensor_source: {exc}"
        if problem:
            column = next((c for c in ("upstream_key", "sensor_source") if problem.startswith(c)), "sensor_id")
            bad(column, problem.removeprefix("sensor_source: "))
    if len(problems) > before:
        return None
    return SensorConfigRow(
        line=line,
        sensor_source=source,
        sensor_id=sensor_id,  # type: ignore[arg-type]
        sensor_read_type=read_type,
        asset_description=values.get("asset_description"),
        upstream_key=upstream_key,
        preprocess_query=query,
        trigger_job_id=job_id,  # type: ignore[arg-type]
        trigger_job_name=values.get("trigger_job_name"),
        job_state=job_state,
        dependency_flag=flag in _TRUE,
    )


def _filled(values: dict[str, str | None], column: str) -> str:
    """A column that ``DEFAULTS`` filled in, so never None."""
    value = values[column]
    if value is None:
        raise ValueError(f"column {column} has neither a value nor a default")
    return value


def _validate_across_rows(path: Path, rows: list[SensorConfigRow], problems: list[str]) -> None:
    first_line: dict[tuple[str, str, str], int] = {}
    by_job: dict[str, list[SensorConfigRow]] = defaultdict(list)
    for row in rows:
        if row.key in first_line:
            problems.append(
                f"{path}: line {row.line}, column sensor_id: duplicate of line {first_line[row.key]} "
                f"(sensor_source, sensor_id, trigger_job_id) = {row.key}"
            )
        else:
            first_line[row.key] = row.line
        by_job[row.trigger_job_id].append(row)
    for job_id, job_rows in by_job.items():
        if not any(r.dependency_flag for r in job_rows):
            lines = ", ".join(str(r.line) for r in job_rows)
            problems.append(
                f"{path}: line {job_rows[0].line}, column dependency_flag: job {job_id!r} has no hard dependency "
                f"(lines {lines} are all FALSE); at least one row per job must be TRUE"
            )


__all__ = ["COLUMNS", "LoadedConfig", "SensorConfigRow", "load_config"]
