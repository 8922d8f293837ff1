"""The control table's bookkeeping, in one place: append events, build, fold, and know what was built.

``heartbeat_control`` (and the sensor state table beside it) is derived by dbt from the seed and the events
table. :class:`ControlTable` is the one object that

- appends the events a tick records (:meth:`ControlTable.append`), and the ones the table does not derive
  from (:meth:`ControlTable.append_beside`: alert events);
- knows which events version each table includes: the *built marker*, a local file per scope under
  ``<lakehouse>/dbt/`` (``built_events_version`` for the control and the sensor state table,
  ``built_events_version.control`` for the control table alone). Nothing else reads or writes it;
- builds through the dbt project (:class:`DbtProject`) when the events moved since the marker, and folds a
  tick's own new data, or its own trigger requests, in rather than deriving every row again when it can
  (:class:`Appended`).

Invariants:

- a marker is written only after the build it names finished: a crash between an append and the mark
  leaves the marker behind the events, so the next refresh builds again (builds are derived, so a second
  build of the same events is harmless);
- the FULL marker never names a version the CONTROL marker does not (a full build marks both);
- a marker moves without a build only across writes that change the events table's version but nothing the
  tables derive (:meth:`ControlTable.keeping_current`: maintenance, alert events).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from pathlib import Path

from heartbeat_runner.core.errors import NotFoundError
from heartbeat_runner.core.faults import FaultPoint, crash_point
from heartbeat_runner.core.records import Event, EventType
from heartbeat_runner.lakehouse.dbt_invoke import DbtProject
from heartbeat_runner.lakehouse.store import EVENTS, TableStore, retry_lost_commits


class Scope(Enum):
    """What a build marker covers; the value is the marker file's suffix."""

    FULL = ""              # the control table and the sensor state table
    CONTROL = ".control"   # the control table alone


@dataclass(frozen=True)
class Refresh:
    """What one :meth:`ControlTable.refresh` did."""

    version: int          # the events version the refreshed tables include now
    built: bool           # the tables changed (False: they already included ``version``)
    folded: bool = False  # the build folded one tick's trigger requests in (see Appended)
    folded_new_data: bool = False  # the control table folded one tick's new data in (see Appended)


@dataclass(frozen=True)
class FoldedRequest:
    """A trigger request a fold writes into its job's rows (macros/heartbeat_folds.sql's ``requests``)."""

    trigger_job_id: str
    idempotency_token: str
    event_ts: datetime
    payload: str | None
    job_run_id: str | None = None  # the run its TRIGGERED answer started; None while unanswered


@dataclass
class Appended:
    """The commits made through :meth:`ControlTable.append` since the latest refresh, and whether the next
    build may fold them into the control table (macros/heartbeat_folds.sql) rather than derive every row again.

    Two folds, each valid only while nobody else committed (the events version is the base plus these
    commits):

    - requests (:meth:`requests_to_fold`): every event appended since is a TRIGGER_REQUESTED of one run, one
      per job, or the TRIGGERED answer to one of them;
    - new data (:meth:`new_data`): the one commit since is one run's NEW_DATA and CURSOR events, at most one
      NEW_DATA per source (a tick's sensing append).

    Anything else (a refusal, a run's end, a retry, the next run of a sequence, a skipped window, another
    process's event) asks for the full build.
    """

    base_version: int
    run_id: str | None = None
    commits: int = 0
    requests: dict[str, FoldedRequest] = field(default_factory=dict)  # by idempotency token
    foldable: bool = True
    #: the NEW_DATA events of the span while it may still fold as new data (None: it may not)
    new_data_events: list[Event] | None = field(default_factory=list)

    def add(self, events: list[Event]) -> None:
        """Record one commit of ``events`` (not empty)."""
        self.commits += 1
        self._add_new_data(events)
        for event in events:
            self.foldable = self.foldable and self._foldable(event)

    def _add_new_data(self, events: list[Event]) -> None:
        runs = {e.run_id for e in events}
        fresh = [e for e in events if e.event_type is EventType.NEW_DATA]
        keys = [e.source_key for e in fresh]
        if (self.commits != 1 or len(runs) != 1 or len(set(keys)) != len(keys) or None in keys
                or any(e.event_type not in _SENSED or e.trigger_job_id is not None for e in events)):
            self.new_data_events = None
        elif self.new_data_events is not None:
            self.new_data_events = fresh

    def new_data(self, events_version: int) -> list[Event] | None:
        """The NEW_DATA events a control build at ``events_version`` may fold in, or None (derive every row)."""
        if self.new_data_events is None or self.commits != 1 or events_version != self.base_version + 1:
            return None
        return self.new_data_events

    def _foldable(self, event: Event) -> bool:
        token, job = event.idempotency_token, event.trigger_job_id
        self.run_id = self.run_id or event.run_id
        if token is None or job is None or event.run_id != self.run_id:
            return False
        if event.event_type is EventType.TRIGGERED:
            if token not in self.requests:
                return False
            self.requests[token] = replace(self.requests[token], job_run_id=event.job_run_id)
            return True
        if event.event_type is not EventType.TRIGGER_REQUESTED or job in {r.trigger_job_id for r in self.requests.values()}:
            return False
        self.requests[token] = FoldedRequest(job, token, event.event_ts, event.payload)
        return True

    def requests_to_fold(self, events_version: int) -> list[FoldedRequest] | None:
        """The requests a build at ``events_version`` may fold in, or None (derive every row)."""
        if not (self.foldable and self.requests and events_version == self.base_version + self.commits):
            return None
        return list(self.requests.values())


#: what a tick's sensing appends
_SENSED = (EventType.NEW_DATA, EventType.CURSOR)
#: the temporary view a fold reads its rows from (macros/heartbeat_folds.sql: ``new_data``, ``requests``)
FOLD_RELATION = "heartbeat_fold_rows"
#: the columns of those rows, per fold
NEW_DATA_FOLD_COLUMNS = ["source_key", "event_id", "event_ts", "snapshot_ts", "window_from", "window_to"]
REQUEST_FOLD_COLUMNS = ["trigger_job_id", "idempotency_token", "event_ts", "payload", "job_run_id"]


class ControlTable:
    """The control table (and the sensor state table) of one lakehouse, as this process builds them.

    Not thread-safe between :meth:`append` and :meth:`refresh`; a tick calls them in turn (a refresh may run
    beside appends to other tables).
    """

    def __init__(self, store: TableStore, dbt: DbtProject):
        self.store = store
        self.dbt = dbt
        #: this object's commits since its latest refresh (None: none since, or no refresh yet)
        self._appended: Appended | None = None

    # -- what was built ------------------------------------------------------------------------------

    def events_version(self) -> int:
        """The events table's version now (a file listing on local engines); a missing events table is an
        error here, so a runner whose lakehouse lost its own table fails rather than ticks on nothing."""
        version = self.store.events_version()
        if version is None:
            raise NotFoundError(f"table {self.store.name(EVENTS)} does not exist (Heartbeat's own table is gone)")
        return version

    def built_version(self, scope: Scope = Scope.FULL) -> int | None:
        """The events version the latest build of ``scope`` included (None: never built here)."""
        marker = self._marker(scope)
        text = marker.read_text().strip() if marker.exists() else ""
        return int(text) if text.isdigit() else None

    def is_current(self, scope: Scope = Scope.FULL) -> bool:
        """Whether the tables of ``scope`` include every event recorded so far (False without an events table)."""
        version = self.store.events_version()
        return version is not None and self.built_version(scope) == version

    # -- appending -----------------------------------------------------------------------------------

    def append(self, events: list[Event]) -> None:
        """One atomic commit of ``events`` the control table derives from (the tables are not current after
        it, until the next :meth:`refresh`)."""
        self.store.append_events(events)
        if events and self._appended is not None:
            self._appended.add(events)

    def append_beside(self, events: list[Event]) -> None:
        """One commit of events the control table does not derive from (alert events): it stays current."""
        if events:
            with self.keeping_current():
                self.store.append_events(events)

    @contextlib.contextmanager
    def keeping_current(self) -> Iterator[None]:
        """For writes that change the events table's version but not what the tables derive from it
        (maintenance, alert events): each marker that was current before is current after."""
        before = self.store.events_version()
        current = [scope for scope in Scope if before is not None and self.built_version(scope) == before]
        yield
        after = self.store.events_version()
        for scope in current:
            self._mark(after, scope)

    # -- building ------------------------------------------------------------------------------------

    def refresh(self, *, force: bool = False, control_only: bool = False, fold: bool = False) -> Refresh:
        """Build unless the tables already include the events version read now (``force``: build anyway).

        ``control_only``: leave the sensor state table (what other products follow) for a later refresh;
        a tick asks for that between recording new data and triggering, where only the control table is read.
        A full refresh when the control table alone is current builds the sensor state table alone.

        ``fold``: when everything appended through this object since the latest refresh is one run's
        trigger requests and their answers (:class:`Appended`), and the control table is still the one built
        at that refresh, fold them into the requested jobs' rows rather than derive every row again.
        A ``control_only`` refresh after a tick's sensing append folds its new data the same way, with no dbt
        command: one MERGE over the changed sources' rows (macros/heartbeat_folds.sql).

        Every call starts a new :class:`Appended` span at the version it read.
        """
        version = self.events_version()
        appended, self._appended = self._appended, Appended(version)
        if not force and self.built_version(Scope.FULL) == version:
            return Refresh(version, built=False)
        control_current = not force and self.built_version(Scope.CONTROL) == version
        if control_only and control_current:
            return Refresh(version, built=False)
        crash_point(FaultPoint.DURING_DBT_BUILD)
        new_data = self._new_data(appended, version) if control_only and not force else None
        if new_data is not None:
            self._fold_new_data(new_data)
            self._mark(version, Scope.CONTROL)
            return Refresh(version, built=True, folded_new_data=True)
        requests = self._requests(appended, version) if fold and not force and not control_only else None
        if requests is not None:
            self._fold_requests(requests)
            self._merge_sensor_state()
        elif control_only:
            self.dbt.build_control_only()
        elif control_current:
            self._merge_sensor_state()
        else:
            self.dbt.build_control()
        self._mark(version, Scope.CONTROL if control_only else Scope.FULL)
        return Refresh(version, built=True, folded=requests is not None)

    def _requests(self, appended: Appended | None, version: int) -> list[FoldedRequest] | None:
        """The requests to fold at ``version``: only onto the control table as built at the span's base."""
        if appended is None or self.built_version(Scope.CONTROL) != appended.base_version:
            return None
        return appended.requests_to_fold(version)

    def _new_data(self, appended: Appended | None, version: int) -> list[Event] | None:
        """The new data to fold at ``version``: only onto the control table as built at the span's base."""
        if appended is None or self.built_version(Scope.CONTROL) != appended.base_version:
            return None
        return appended.new_data(version)

    def _fold_new_data(self, events: list[Event]) -> None:
        """One MERGE of ``events`` into their sources' rows (none: the control table is current as it is)."""
        if not events:
            return
        rows = [(e.source_key, e.event_id, e.event_ts, e.snapshot_ts, e.window_from, e.window_to) for e in events]
        self._merge_rows("heartbeat_fold_new_data", NEW_DATA_FOLD_COLUMNS, rows, "folding new data into the control table")

    def _fold_requests(self, requests: list[FoldedRequest]) -> None:
        """One MERGE of ``requests`` into their jobs' rows."""
        rows = [(r.trigger_job_id, r.idempotency_token, r.event_ts, r.payload, r.job_run_id) for r in requests]
        self._merge_rows("heartbeat_fold_requests", REQUEST_FOLD_COLUMNS, rows,
                         "folding trigger requests into the control table")

    def _merge_rows(self, macro: str, columns: list[str], rows: list[tuple], what: str) -> None:
        """Run ``macro``'s MERGE over ``rows``, the temporary view FOLD_RELATION it reads."""
        statement = self.dbt.macro_sql(macro, FOLD_RELATION)
        self.store.merge_rows(lambda _view: statement, columns, rows, what, view=FOLD_RELATION)

    def _merge_sensor_state(self) -> None:
        """The sensor state table brought to what the control table and the cursors give: the MERGE dbt's build
        of it makes (macros/heartbeat_sensor_state.sql), without a dbt command."""
        statement = self.dbt.macro_sql("heartbeat_merge_sensor_state")
        retry_lost_commits(lambda: self.store.engine.sql(statement).collect(), "refreshing the sensor state table")

    def build_with_views(self) -> None:
        """Build the tables and (re)create the views (a config load), then mark what they include."""
        version = self.events_version()
        self.dbt.build_all()
        self._mark(version, Scope.FULL)

    def rebuild_from_all_events(self) -> None:
        """Re-derive every row from every event ever recorded, hot log and archive (``rebuild``; the tick
        lease is held, so nothing is appended meanwhile), then mark what it includes."""
        version = self.events_version()
        self.dbt.rebuild_from_all_events()
        self._mark(version, Scope.FULL)

    # -- the marker ----------------------------------------------------------------------------------

    def _marker(self, scope: Scope) -> Path:
        return self.dbt.work_dir / f"built_events_version{scope.value}"

    def _mark(self, events_version: int | None, scope: Scope) -> None:
        """Record what a build included; a full build also counts as a control-only one."""
        for each in (Scope.CONTROL, Scope.FULL) if scope is Scope.FULL else (scope,):
            marker = self._marker(each)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(events_version))
