"""Plain data records written to and read from Heartbeat's tables."""

from __future__ import annotations

import enum
import hashlib
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import Field, dataclass, field, fields, replace
from datetime import datetime, timedelta, timezone
from typing import Any, ClassVar


class EventType(str, enum.Enum):
    CONFIG_LOADED = "CONFIG_LOADED"
    NEW_DATA = "NEW_DATA"            # a source has new data (cursor_to = cursor reached)
    CURSOR = "CURSOR"                # the cursor moved without new data (baseline, filtered rows)
    TRIGGER_REQUESTED = "TRIGGER_REQUESTED"  # written before the jobs API call, with the token
    RETRY_REQUESTED = "RETRY_REQUESTED"  # a retry of a failed run, automatic or asked for (same data, new token)
    RETRY_ASKED = "RETRY_ASKED"      # an operator asked to re-run a failed job; the next tick does (heartbeat_retry_asks)
    TRIGGER_ASKED = "TRIGGER_ASKED"  # an operator asked to run a job now; the next tick does (heartbeat_trigger_asks)
    NEXT_WINDOW_REQUESTED = "NEXT_WINDOW_REQUESTED"  # the next run of a sequence (catch-up), after a success
    WINDOW_SKIPPED = "WINDOW_SKIPPED"  # a final event-time window with no data in any source: no run
    TRIGGERED = "TRIGGERED"          # the jobs API answered with a run id
    TRIGGER_ERROR = "TRIGGER_ERROR"  # the jobs API refused; the request is void
    RUN_SKIPPED = "RUN_SKIPPED"      # the jobs service skipped the run (never executed); the request is void
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    REFUSED = "REFUSED"              # the jobs service refused to run the job (disabled, budget policy): never ran
    RESET = "RESET"                  # operator re-processing (job) or moved-back cursor (source)
    JOB_PAUSED = "JOB_PAUSED"
    JOB_RESUMED = "JOB_RESUMED"
    ALERT_RAISED = "ALERT_RAISED"      # an alert condition began (recorded before any message is sent)
    ALERT_RESOLVED = "ALERT_RESOLVED"  # it cleared (recorded before the resolve messages are sent)
    ALERT_UPDATED = "ALERT_UPDATED"    # an open alert's words changed with its cause (nothing is sent)
    ALERT_SENT = "ALERT_SENT"          # a destination accepted the raise or resolve message
    ALERT_DELIVERY_FAILED = "ALERT_DELIVERY_FAILED"  # a destination refused or did not answer (retried)
    LINEAGE_SENT = "LINEAGE_SENT"      # the OpenLineage transport accepted a run's START / COMPLETE / FAIL event


class JobStatus(str, enum.Enum):
    """A control row's status (NULL in the table: nothing sensed yet, or reset). See models/heartbeat_control.sql."""

    NEW_EVENT_AVAILABLE = "NEW_EVENT_AVAILABLE"
    IN_PROGRESS = "IN_PROGRESS"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    #: the jobs service refused to run the job (it never executed): blocked until an operator's retry
    REFUSED = "REFUSED"


#: The statuses that block a job until a successful run or an operator clears them (the SQL's
#: heartbeat_blocked_statuses): a failure, and a refusal (retried only when an operator asks).
BLOCKED_STATUSES = (JobStatus.FAILED, JobStatus.REFUSED)


class SensorStatus(str, enum.Enum):
    """A source's status in ``heartbeat_sensor_state``, the table other products follow (NULL there: none
    of its jobs has a status, e.g. they were reset). See models/heartbeat_sensor_state.sql."""

    ACQUIRED_NEW_DATA = "ACQUIRED_NEW_DATA"
    PROCESSED_NEW_DATA = "PROCESSED_NEW_DATA"


class JobState(str, enum.Enum):
    """A control row's ``job_state``: from the config's column, or pause/resume since the last seed."""

    UNPAUSED = "UNPAUSED"
    PAUSED = "PAUSED"


class TickStatus(str, enum.Enum):
    """A tick's status in ``heartbeat_runs``: ERROR, it ended but some source or jobs API call failed;
    FAILED, it raised (the row carries the error's kind and redacted message); INCOMPLETE, it wrote events,
    then stopped without a row (a crash; see heartbeat_run_overview)."""

    OK = "OK"
    ERROR = "ERROR"
    INCOMPLETE = "INCOMPLETE"
    FAILED = "FAILED"


class RefreshPath(str, enum.Enum):
    """How one refresh brought the control table to the events read (lakehouse/control_table.py,
    ControlTable.refresh): FOLD, the commits since the latest refresh merged into the rows they change
    (macros/heartbeat_folds.sql); BUILD, dbt derived every row (RefreshReason says why not a fold); NONE, the
    control table already included every event (at most the sensor state table was brought up to it)."""

    FOLD = "fold"
    BUILD = "build"
    NONE = "none"


class RefreshReason(str, enum.Enum):
    """Why a refresh of the control table built rather than folded (a BUILD's reason; FOLD and NONE have none)."""

    FORCED = "forced"                # asked to derive every row anyway (``refresh(force=True)``)
    FIRST_REFRESH = "first_refresh"  # the process's first refresh: no span of its own commits to fold
    NOT_FOLDABLE = "not_foldable"    # a commit of the span cannot fold (the refresh's detail says which)
    OTHER_COMMITS = "other_commits"  # another writer committed beside the span (another process, a CLI command)
    MOVED = "moved"                  # the control table is not the one built at the span's base
    FOLDS_OFF = "folds_off"          # HEARTBEAT_FOLDS=off


class Outcome(str, enum.Enum):
    NEW_DATA = "NEW_DATA"
    NO_NEW_DATA = "NO_NEW_DATA"
    ERROR = "ERROR"
    SKIPPED = "SKIPPED"


class _Clock:
    """UTC timestamps that strictly increase within this process, and follow every event it has seen.

    A hybrid logical clock: the wall clock, pushed past the latest event time this process has read from the
    events table (:meth:`observe`). Writers on several machines (runners, an operator's laptop, a job's
    ``complete``) disagree by seconds to minutes; with this rule an event is stamped after every event its
    writer saw before writing it, so "recorded after" in the derivation means "committed knowing of", whatever
    the clocks say (docs/architecture.md, "Commits, not clocks")."""

    def __init__(self) -> None:
        self._last = datetime.min.replace(tzinfo=timezone.utc)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            now = datetime.now(timezone.utc)
            if now <= self._last:
                now = self._last + timedelta(microseconds=1)
            self._last = now
            return now

    def observe(self, seen: datetime) -> None:
        """Every time :meth:`now` hands out from here on is later than ``seen`` (an event another writer made)."""
        with self._lock:
            self._last = max(self._last, as_utc(seen))


CLOCK = _Clock()


def utcnow() -> datetime:
    return CLOCK.now()


def stamped_after(events: Sequence[Event], latest: datetime | None) -> list[Event]:
    """``events`` moved forward together, as little as needed, so the earliest is later than ``latest`` (the latest
    event time in the events table as its writer read it before appending): their order among themselves and
    their spacing stay. Unchanged when they already are, or when the table has no event yet."""
    if not events or latest is None:
        return list(events)
    latest = as_utc(latest)
    CLOCK.observe(latest)
    earliest = min(as_utc(e.event_ts) for e in events)
    if earliest > latest:
        return list(events)
    shift = latest - earliest + timedelta(microseconds=1)
    moved = [replace(e, event_ts=as_utc(e.event_ts) + shift) for e in events]
    CLOCK.observe(max(e.event_ts for e in moved))
    return moved


def random_event_id() -> str:
    """A fresh, random event id (the default of every event without a deterministic one)."""
    return uuid.uuid4().hex


def as_utc(value: datetime) -> datetime:
    """``value`` as an aware UTC time. Spark hands back naive timestamps in the session's zone, which every engine
    the runner opens sets to UTC (``_open_databricks`` too, whatever the cluster's or a laptop's zone); a time
    read where that cannot be relied upon is read as epoch microseconds instead (the catalog look)."""
    return value.replace(tzinfo=timezone.utc) if value.tzinfo is None else value


class TableRow:
    """A dataclass that is one row of a table: its field order is the column order."""

    #: Declared for type checkers only: every subclass is a ``@dataclass``, which sets it.
    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @classmethod
    def columns(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def as_tuple(self) -> tuple:
        """The row's values in column order; enum members become their plain values."""
        return tuple(_plain(getattr(self, name)) for name in self.columns())


def _plain(value: object) -> object:
    return value.value if isinstance(value, enum.Enum) else value


@dataclass(frozen=True)
class Event(TableRow):
    """One row of ``heartbeat_events``."""

    event_type: EventType
    run_id: str
    snapshot_ts: datetime
    event_ts: datetime = field(default_factory=utcnow)
    event_id: str = field(default_factory=random_event_id)
    source_key: str | None = None
    sensor_source: str | None = None
    sensor_id: str | None = None
    trigger_job_id: str | None = None
    job_run_id: str | None = None
    idempotency_token: str | None = None
    cursor_from: str | None = None
    cursor_to: str | None = None
    window_from: str | None = None
    window_to: str | None = None
    rows: int | None = None
    message: str | None = None
    consumed_event_ids: str | None = None
    #: JSON: trigger parameters (TRIGGER_REQUESTED), sensing details
    payload: str | None = None


def new_data_event_id(source_key: str, parent_event_id: str | None, cursor_from: str | None,
                      cursor_to: str | None) -> str:
    """Deterministic id: re-sensing the same window after a crash (or by a second runner) yields the same event.

    ``parent_event_id`` is the cursor event the sensing started from, so ids form a chain:
    after a RESET (a fresh parent) the same window gets a new id instead of colliding
    with the event that first recorded it.
    """
    return _digest("NEW_DATA", source_key, parent_event_id or "", cursor_from or "", cursor_to or "")


def sequence_event_id(idempotency_token: str) -> str:
    """Deterministic id of the NEXT_WINDOW_REQUESTED event of the request with this token."""
    return _digest("NEXT_WINDOW_REQUESTED", idempotency_token)


def alert_event_id(kind: EventType, alert_key: str, *parts: str) -> str:
    """Deterministic id of an alert event: recording it twice (a crash, a replay) leaves one event."""
    return _digest(kind.value, alert_key, *parts)


def idempotency_token(job_id: str, consumed_event_ids: list[str]) -> str:
    """Token for one trigger: job id + the exact NEW_DATA events it consumes."""
    return _digest(job_id, *sorted(consumed_event_ids))[:36]


def skipped_token(token: str, attempt: int) -> str:
    """Token of ask ``attempt`` (1, 2, ...) after the run of request ``token`` was skipped: deterministic (a
    crash replays it), distinct (the same token would hand back the skipped run), at most 64 characters."""
    return token if attempt < 1 else _digest(token, "skipped", str(attempt))[:36]


def _digest(*parts: str) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()


@dataclass(frozen=True)
class SensorEvaluation(TableRow):
    """One row of ``heartbeat_run_report``: one source evaluated in one run."""

    run_id: str
    snapshot_ts: datetime
    source_key: str
    sensor_source: str
    sensor_id: str
    trigger_job_ids: str
    window_from: str | None
    window_until: str | None
    outcome: str
    rows: int | None
    #: the error (outcome ERROR) or why the source was not sensed (SKIPPED)
    error: str | None
    duration_s: float


@dataclass(frozen=True)
class RunSummary(TableRow):
    """One row of ``heartbeat_runs``: one tick."""

    run_id: str
    snapshot_ts: datetime
    ended_ts: datetime
    duration_s: float
    sources_sensed: int
    sources_with_new_data: int
    sensor_errors: int
    jobs_triggered: int
    jobs_completed: int
    jobs_failed: int
    trigger_errors: int
    status: TickStatus
    message: str | None
    #: JSON: seconds per stage and process figures; ``jobs_backend_memory`` (an object) is what the jobs backend
    #: carries to the next process (e.g. Databricks: how far the look for failed jobs' successful runs reached);
    #: ``control_refreshes`` (a list) the path of each control table refresh of the tick (``runs --json``)
    stage_timings: str


def new_run_id(snapshot: datetime) -> str:
    return f"{snapshot:%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class RunStart:
    """A tick's identity, fixed before it starts: the row of a tick that fails carries the run id its
    events (if it wrote any) carry too."""

    run_id: str
    snapshot_ts: datetime

    @classmethod
    def now(cls) -> RunStart:
        snapshot = utcnow()
        return cls(new_run_id(snapshot), snapshot)


@dataclass(frozen=True)
class SensingTarget:
    """One distinct upstream to sense; several control rows (jobs) may share it."""

    source_key: str
    sensor_source: str
    sensor_id: str
    upstream_key: str | None
    preprocess_query: str | None
    sensor_read_type: str
    cursor: str | None
    #: when the tick that recorded ``cursor`` began (None: no cursor yet): a commit after the cursor's
    #: version was made after this moment, which lets a catalog's "last altered" rule a source out in bulk
    cursor_ts: datetime | None = None


def job_parameters(payload: Mapping[str, Any]) -> dict[str, str]:
    """What the job receives: the payload without Heartbeat's private keys."""
    return {k: v for k, v in payload.items() if not k.startswith("_")}
