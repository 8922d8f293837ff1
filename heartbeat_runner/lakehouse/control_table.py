"""The control table's bookkeeping, in one place: append events, build, fold, and know what was built.

``heartbeat_control`` (and the sensor state table beside it) is derived by dbt from the seed and the events
table. :class:`ControlTable` is the one object that

- appends the events a tick records (:meth:`ControlTable.append`), and the ones the table does not derive
  from (:meth:`ControlTable.append_beside`: alert events);
- knows which events version each table includes: the *built marker*, a local file per scope under
  ``<lakehouse>/dbt/`` (``built_events_version`` for the control and the sensor state table,
  ``built_events_version.control`` for the control table alone). Nothing else reads or writes it;
- builds through the dbt project (:class:`DbtProject`) when the events moved since the marker, and folds a
  tick's own commits (its new data, its trigger requests, the runs that ended) in rather than deriving every
  row again when it can (:class:`Appended`), merging the sensor state table for what they changed;
- keeps the one record of which commits of the events table are this process's own (:class:`OwnCommits`):
  the folds and the reads only another process can fill (runner/empty_reads.py) both ask it.

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
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from heartbeat_runner.core.errors import NotFoundError
from heartbeat_runner.core.faults import FaultPoint, crash_point
from heartbeat_runner.core.records import Event, EventType, RefreshPath, RefreshReason
from heartbeat_runner.lakehouse.dbt_invoke import DbtProject
from heartbeat_runner.lakehouse.maintenance import MAINTENANCE_OPERATIONS, Maintenance, MaintenanceResult
from heartbeat_runner.lakehouse.store import EVENTS, TableStore, retry_lost_commits

log = logging.getLogger(__name__)


class RowKey(NamedTuple):
    """A control row's key (the model's unique key)."""

    sensor_source: str
    sensor_id: str
    trigger_job_id: str


class Scope(Enum):
    """What a build marker covers; the value is the marker file's suffix."""

    FULL = ""              # the control table and the sensor state table
    CONTROL = ".control"   # the control table alone


#: what a tick's sensing appends, and what a run's end
_SENSED = {EventType.NEW_DATA, EventType.CURSOR}
_ENDED = {EventType.COMPLETED, EventType.FAILED, EventType.REFUSED}


class FoldKind(Enum):
    """What one commit of a tick folds into the control table (each a MERGE of macros/heartbeat_folds.sql)."""

    NEW_DATA = "heartbeat_fold_new_data"   # the sensing append: NEW_DATA (and CURSOR) events
    REQUESTS = "heartbeat_fold_requests"   # trigger requests, with the runs their answers started
    ENDS = "heartbeat_fold_ends"           # runs that ended: COMPLETED / FAILED / REFUSED

    @property
    def macro(self) -> str:
        return self.value


#: the temporary view a fold reads its rows from (the relation each macro of macros/heartbeat_folds.sql takes)
FOLD_RELATION = "heartbeat_fold_rows"
#: the columns of those rows, per fold
FOLD_COLUMNS = {
    FoldKind.NEW_DATA: ["source_key", "event_id", "event_ts", "snapshot_ts", "window_from", "window_to"],
    FoldKind.REQUESTS: ["trigger_job_id", "idempotency_token", "event_ts", "payload", "job_run_id"],
    FoldKind.ENDS: ["trigger_job_id", "event_type", "event_ts", "message", "payload"],
}
#: the columns of the sensor state merge's ``changed`` rows
CHANGED_COLUMNS = ["source_key", "trigger_job_id"]
#: the MERGE that brings the sensor state table up to date without dbt (macros/heartbeat_sensor_state.sql)
SENSOR_STATE_MERGE = "heartbeat_merge_sensor_state"
#: the macro that digests each control row (macros/heartbeat_folds.sql): folded and derived tables compared
ROW_DIGESTS = "heartbeat_control_row_digests"
#: every macro the runner renders and runs itself, outside dbt's own builds
RUNNER_MACROS = (*(kind.macro for kind in FoldKind), SENSOR_STATE_MERGE, ROW_DIGESTS)


@dataclass(frozen=True)
class NoFold:
    """Why a refresh derives every row rather than folding: the reason, and for NOT_FOLDABLE what the first
    commit that could not fold held (its event types, and why when those types fold otherwise)."""

    reason: RefreshReason
    detail: str | None = None


@dataclass(frozen=True)
class Refresh:
    """What one :meth:`ControlTable.refresh` did.

    Invariants: ``path`` is FOLD exactly when ``folds`` is not empty; ``why`` is set exactly when ``path`` is
    BUILD; NONE leaves the control table as it was (``built`` may still be True: the sensor state table alone)."""

    version: int          # the events version the refreshed tables include now
    built: bool           # the tables changed (False: they already included ``version``)
    #: the folds that brought the control table there, in order (empty: derived by dbt, or nothing to do)
    folds: tuple[FoldKind, ...] = ()
    path: RefreshPath = RefreshPath.NONE
    #: a BUILD's reason (None otherwise)
    why: NoFold | None = None

    @property
    def reason(self) -> RefreshReason | None:
        return self.why.reason if self.why is not None else None

    def as_dict(self) -> dict[str, str]:
        """The path, and a build's reason and detail, as a run summary and ``runs --json`` show them."""
        why = self.why
        return {"path": self.path.value, **({"reason": why.reason.value} if why else {}),
                **({"detail": why.detail} if why and why.detail else {})}

    @property
    def folded(self) -> bool:
        return bool(self.folds)

    @property
    def folded_new_data(self) -> bool:
        return FoldKind.NEW_DATA in self.folds


@dataclass(frozen=True)
class FoldedRequest:
    """A trigger request a fold writes into its job's rows (macros/heartbeat_folds.sql's ``requests``)."""

    trigger_job_id: str
    idempotency_token: str
    event_ts: datetime
    payload: str | None
    job_run_id: str | None = None  # the run its TRIGGERED answer started; None while unanswered

    def row(self) -> tuple:
        return (self.trigger_job_id, self.idempotency_token, self.event_ts, self.payload, self.job_run_id)


@dataclass
class FoldStep:
    """One commit's fold: its kind and the rows its MERGE reads (tuples of FOLD_COLUMNS[kind])."""

    kind: FoldKind
    rows: list[tuple] = field(default_factory=list)
    #: REQUESTS only: the requests by token, answered in place by a later commit of TRIGGERED events
    requests: dict[str, FoldedRequest] = field(default_factory=dict)
    #: what the sensor state table must look at again: the sources the commit names, the jobs it names
    source_keys: frozenset[str] = frozenset()
    job_ids: frozenset[str] = frozenset()

    def fold_rows(self) -> list[tuple]:
        return [r.row() for r in self.requests.values()] if self.kind is FoldKind.REQUESTS else self.rows


@dataclass
class StateChanges:
    """The sources and jobs whose sensor state rows folds changed since that table was last brought up to
    date (macros/heartbeat_sensor_state.sql's ``changed``)."""

    source_keys: set[str] = field(default_factory=set)
    job_ids: set[str] = field(default_factory=set)

    def add(self, steps: list[FoldStep]) -> None:
        for step in steps:
            self.source_keys |= step.source_keys
            self.job_ids |= step.job_ids

    def rows(self) -> list[tuple]:
        return [(key, None) for key in sorted(self.source_keys)] + [(None, job) for job in sorted(self.job_ids)]


@dataclass
class OwnCommits:
    """Which commits of the events table this process made (through :meth:`ControlTable.append`): the one record
    that whatever skips work "because only our own commits came since" asks. The folds do (:class:`Appended`:
    a span folds only when nobody else committed), and so do the reads only another process can fill
    (runner/empty_reads.py: an operator's asks stay unread while the runner alone commits).

    ``base`` is the events version read at the latest refresh and ``commits`` the commits made here since it;
    ``since`` the earliest version from which every commit up to ``base`` is known to be this process's own.

    Invariant: ``since`` is set exactly when ``base`` is, and ``since <= base``. A refresh that reads a version
    other than ``base + commits`` (another process committed, or an append retried after an unclear failure
    committed twice) moves ``since`` to that version: whatever was known before it may have changed. Commits
    made after the latest read are counted, not yet checked: the next read checks them. No clock is compared.
    """

    base: int | None = None
    commits: int = 0
    since: int | None = None

    def read(self, version: int) -> bool:
        """The events version read now (a refresh); True when every commit since the previous read was ours."""
        own = self.base is not None and version == self.base + self.commits
        self.since = self.since if own else version
        self.base, self.commits = version, 0
        return own

    def committed(self) -> None:
        """This process made one commit of the events table."""
        self.commits += 1

    @property
    def position(self) -> int | None:
        """The version the events table is at if every commit since the latest read was ours (None: never read)."""
        return None if self.base is None else self.base + self.commits

    def only_own_after(self, position: int) -> bool:
        """Whether every commit after ``position`` (a :attr:`position` taken earlier) up to the latest read was
        ours. Commits after that read are checked by the next one."""
        return self.since is not None and self.since <= position


@dataclass
class Appended:
    """The commits made through :meth:`ControlTable.append` since the latest refresh, and whether the next
    refresh may fold them into the control table, commit by commit (macros/heartbeat_folds.sql), rather than
    derive every row again.

    Invariant: foldable (``steps`` not None) only while every commit since is one run's, and each commit is one
    of

    - the sensing append: NEW_DATA and CURSOR events, at most one NEW_DATA per source (CURSOR events change no
      control row);
    - TRIGGER_REQUESTED events, one per job, none of a job already requested in the span;
    - the TRIGGERED answers to requests of the span (folded with them);
    - COMPLETED / FAILED / REFUSED events, one per job (runs that ended, or a failed job's successful run).

    Anything else (a refusal, a skipped run, a retry, the next run of a sequence, a skipped window, a config
    load, another process's event) asks for the full build; ``unfoldable`` keeps what the first such commit
    held (set exactly when ``steps`` is None). Whether anybody else committed meanwhile is not the span's to know:
    :class:`OwnCommits` says it, to :meth:`plan`.
    """

    #: the events version the span starts at: the one the control table must have been built at to fold it
    base_version: int
    run_id: str | None = None
    #: the folds of the commits so far, in order (None: not foldable)
    steps: list[FoldStep] | None = field(default_factory=list)
    #: what made the span not foldable: the event types of the commit, and why when they fold otherwise
    unfoldable: str | None = None

    def add(self, events: list[Event]) -> None:
        """Record one commit of ``events`` (not empty)."""
        if self.steps is None:
            return
        runs = {e.run_id for e in events}
        if len(runs) != 1 or (self.run_id is not None and runs != {self.run_id}):
            self._refuse(events, "another run's events" if len(runs) == 1 else "events of several runs")
            return
        self.run_id = runs.pop()
        kinds = {e.event_type for e in events}
        if kinds == {EventType.TRIGGERED}:
            self._answer(events)
            return
        step = self._step(kinds, events)
        if isinstance(step, FoldStep):
            self.steps.append(step)
        else:
            self._refuse(events, step)

    def _refuse(self, events: list[Event], why: str | None) -> None:
        """The span is not foldable from this commit of ``events`` on (``why``: when its types fold otherwise)."""
        kinds = "+".join(sorted({e.event_type.value for e in events}))
        self.steps, self.unfoldable = None, f"{kinds}: {why}" if why else kinds

    def _step(self, kinds: set[EventType], events: list[Event]) -> FoldStep | str | None:
        """The fold of one commit of ``kinds``; else why those kinds do not fold here (None: they never do)."""
        if kinds <= _SENSED:
            return _new_data(events)
        if kinds == {EventType.TRIGGER_REQUESTED}:
            return _requests(events, {r.trigger_job_id for s in self.steps or [] for r in s.requests.values()})
        if kinds <= _ENDED:
            return _ends(events)
        return None

    def _answer(self, events: list[Event]) -> None:
        """TRIGGERED events: each answers a request of the span, or the span is not foldable."""
        steps = {token: step for step in self.steps or [] for token in step.requests}
        for event in events:
            token = event.idempotency_token or ""
            step = steps.get(token)
            if step is None:
                self._refuse(events, "an answer to no request of the span")
                return
            step.requests[token] = replace(step.requests[token], job_run_id=event.job_run_id)

    def empty_at(self, version: int) -> bool:
        """Whether nothing was appended through the span yet and it starts at ``version``."""
        return self.base_version == version and self.run_id is None and self.steps == []

    def plan(self, *, only_own: bool) -> list[FoldStep] | NoFold:
        """The folds that bring a control table built at the span's base to the events version read now, or why
        none do (NOT_FOLDABLE: a commit of the span cannot fold; OTHER_COMMITS: not ``only_own``, i.e. another
        process committed too, as :meth:`OwnCommits.read` found)."""
        if self.steps is None:
            return NoFold(RefreshReason.NOT_FOLDABLE, self.unfoldable)
        if not only_own:
            return NoFold(RefreshReason.OTHER_COMMITS)
        return self.steps

    def folds(self, *, only_own: bool) -> list[FoldStep] | None:
        """:meth:`plan`'s folds, or None when the span does not fold."""
        plan = self.plan(only_own=only_own)
        return None if isinstance(plan, NoFold) else plan


def _new_data(events: list[Event]) -> FoldStep | str:
    fresh = [e for e in events if e.event_type is EventType.NEW_DATA]
    keys = [e.source_key for e in fresh]
    if None in keys or len(set(keys)) != len(keys):
        return "new data without a source, or twice of one source"
    if any(e.trigger_job_id is not None for e in events):
        return "a job's sensing event"
    return FoldStep(FoldKind.NEW_DATA, [(e.source_key, e.event_id, e.event_ts, e.snapshot_ts, e.window_from,
                                          e.window_to) for e in fresh],
                    source_keys=frozenset(e.source_key for e in events if e.source_key is not None))


def _requests(events: list[Event], requested: set[str]) -> FoldStep | str:
    found = {}
    for e in events:
        if e.trigger_job_id is None or e.idempotency_token is None:
            return "a request without a job or a token"
        if e.trigger_job_id in requested:
            return "a second request of a job in the span"
        requested = requested | {e.trigger_job_id}
        found[e.idempotency_token] = FoldedRequest(e.trigger_job_id, e.idempotency_token, e.event_ts, e.payload)
    return FoldStep(FoldKind.REQUESTS, requests=found, job_ids=frozenset(r.trigger_job_id for r in found.values()))


def _ends(events: list[Event]) -> FoldStep | str:
    jobs = [e.trigger_job_id for e in events]
    if None in jobs or len(set(jobs)) != len(jobs):
        return "an end without a job, or two ends of one job"
    return FoldStep(FoldKind.ENDS, [(e.trigger_job_id, e.event_type.value, e.event_ts, e.message, e.payload)
                                    for e in events], job_ids=frozenset(j for j in jobs if j is not None))


def _refreshed(version: int, plan: list[FoldStep] | NoFold | None) -> Refresh:
    """The Refresh of a refresh that had work, from its plan (None: the control table was current)."""
    if plan is None:
        return Refresh(version, built=True)
    if isinstance(plan, NoFold):
        return Refresh(version, built=True, path=RefreshPath.BUILD, why=plan)
    return Refresh(version, built=True, folds=tuple(step.kind for step in plan), path=RefreshPath.FOLD)


class ControlTable:
    """The control table (and the sensor state table) of one lakehouse, as this process builds them.

    Not thread-safe between :meth:`append` and :meth:`refresh`; a tick calls them in turn (a refresh may run
    beside appends to other tables).
    """

    def __init__(self, store: TableStore, dbt: DbtProject, *, folding: bool = True):
        """``folding``: whether a refresh may fold (HEARTBEAT_FOLDS; off: every refresh with work builds)."""
        self.store = store
        self.dbt = dbt
        self.folding = folding
        #: which commits of the events table are this process's own (the one record: :class:`OwnCommits`)
        self.own = OwnCommits()
        #: this object's commits since its latest refresh (None: none since, or no refresh yet)
        self._appended: Appended | None = None
        #: what the sensor state table lacks of the control table's folds (None: not known, the whole table)
        self._unmerged: StateChanges | None = None
        #: this object folded into the control table since its latest check_folds (only folds can drift)
        self._folded_unchecked = False

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
        events = self.store.append_events(events)
        if not events:
            return
        self.own.committed()
        if self._appended is not None:
            self._appended.add(events)

    def append_beside(self, events: list[Event]) -> None:
        """One commit of events the control table does not derive from (alert events): it stays current, unless
        another process committed meanwhile (:meth:`keeping_current`)."""
        if not events:
            return
        with self.keeping_current(commits=1):
            appended = self.store.append_events(events)
        if appended:
            self.own.committed()

    @contextlib.contextmanager
    def keeping_current(self, *, commits: int | None = None) -> Iterator[None]:
        """For writes that change the events table's version but not what the tables derive from it
        (maintenance, alert events): each marker that was current before is current after, when every commit
        in between was the write's own.

        ``commits``: how many commits the write makes (an append: one), so the versions alone say it; None (a
        maintenance run, which cannot say) has the table's history say it: every commit in between is one a
        maintenance run makes (maintenance.MAINTENANCE_OPERATIONS), none an append.

        Invariant: a marker never moves over another process's commit (a job's own `complete`, an operator's
        `pause`, made while this write ran): it stays behind it, so the next refresh derives that commit."""
        before = self.store.events_version()
        current = [scope for scope in Scope if before is not None and self.built_version(scope) == before]
        yield
        after = self.store.events_version()
        if not current or before is None or after is None or not self._only_ours(before, after, commits):
            return
        for scope in current:
            self._mark(after, scope)
        if self._appended is not None and self._appended.empty_at(before):
            self._appended = Appended(after)  # nothing of this span was appended yet: it starts here

    def _only_ours(self, before: int, after: int, commits: int | None) -> bool:
        """Whether the commits of the events table after ``before`` up to ``after`` were a write's own
        (:meth:`keeping_current`)."""
        if commits is not None:
            return after - before == commits
        operations = self.store.engine.operations_between(self.store.name(EVENTS), before, after)
        return operations is not None and set(operations) <= MAINTENANCE_OPERATIONS

    # -- building ------------------------------------------------------------------------------------

    def refresh(self, *, force: bool = False, control_only: bool = False) -> Refresh:
        """Bring the tables up to the events version read now, unless they include it (``force``: derive anyway).

        ``control_only``: leave the sensor state table (what other products follow) for a later refresh;
        a tick asks for that between recording new data and triggering, where only the control table is read.
        A full refresh when the control table alone is current brings the sensor state table alone.

        When everything appended through this object since the latest refresh can be folded (:class:`Appended`:
        the tick's own new data, requests and their answers, runs that ended) and the control table is still
        the one built at that refresh, each commit is folded into the rows it changes, in order, by one MERGE
        the runner runs itself (macros/heartbeat_folds.sql); otherwise dbt derives every row. The sensor state
        table is merged by the statement dbt's build of it makes (macros/heartbeat_sensor_state.sql), so a
        refresh that folds starts no dbt command.

        Every call starts a new :class:`Appended` span at the version it read. The :class:`Refresh` says which
        path the control table took and, for a build, why no fold (from what is known here: no query).
        """
        version = self.events_version()
        only_own = self.own.read(version)
        appended, self._appended = self._appended, Appended(version)
        if not force and self.built_version(Scope.FULL) == version:
            self._unmerged = StateChanges()
            return Refresh(version, built=False)
        control_current = not force and self.built_version(Scope.CONTROL) == version
        if control_only and control_current:
            return Refresh(version, built=False)
        crash_point(FaultPoint.DURING_DBT_BUILD)
        self.dbt.migrate_once()  # a fold or merge writes columns an older Heartbeat's tables may lack
        plan = NoFold(RefreshReason.FORCED) if force else None if control_current else self._plan(appended, only_own)
        folds = None if plan is None or isinstance(plan, NoFold) else plan
        if folds is not None:
            for step in folds:
                self._fold(step)
            self._folded_unchecked = self._folded_unchecked or bool(folds)
        elif control_only:
            self.dbt.build_control_only()
        elif not control_current:
            self.dbt.build_control()
        unmerged = None if folds is None and not control_current else self._unmerged
        if unmerged is not None:
            unmerged.add(folds or [])
        if control_only:
            self._unmerged = unmerged
        elif folds is not None or control_current:
            self._merge_sensor_state(unmerged)
        self._mark(version, Scope.CONTROL if control_only else Scope.FULL)
        if not control_only:
            self._unmerged = StateChanges()
        return _refreshed(version, plan)

    def _plan(self, appended: Appended | None, only_own: bool) -> list[FoldStep] | NoFold:
        """The folds that bring the control table to the events version read now, or why it is built instead:
        folds are on, this object refreshed before (a span), and the table is the one built at the span's base;
        the span says the rest, told whether only its own commits came since (:meth:`Appended.plan`)."""
        if not self.folding:
            return NoFold(RefreshReason.FOLDS_OFF)
        if appended is None:
            return NoFold(RefreshReason.FIRST_REFRESH)
        if self.built_version(Scope.CONTROL) != appended.base_version:
            return NoFold(RefreshReason.MOVED)
        return appended.plan(only_own=only_own)

    def _fold(self, step: FoldStep) -> None:
        """One MERGE of ``step``'s rows, given to its macro as the temporary view FOLD_RELATION (none: nothing)."""
        rows = step.fold_rows()
        if not rows:
            return
        statement = self.dbt.macro_sql(step.kind.macro, FOLD_RELATION)
        self.store.merge_rows(lambda _view: statement, FOLD_COLUMNS[step.kind], rows,
                              f"folding into the control table ({step.kind.name})", view=FOLD_RELATION)

    def _merge_sensor_state(self, changes: StateChanges | None) -> None:
        """The sensor state table brought to what the control table and the cursors give, by the MERGE dbt's
        build of it makes (macros/heartbeat_sensor_state.sql), without a dbt command: the rows of ``changes``
        (what folds changed since it was last brought up to date; nothing: nothing to do), or every row."""
        if changes is None:
            statement = self.dbt.macro_sql(SENSOR_STATE_MERGE)
            retry_lost_commits(lambda: self.store.engine.sql(statement).collect(), "refreshing the sensor state table")
            return
        rows = changes.rows()
        if rows:
            changed = self.dbt.macro_sql(SENSOR_STATE_MERGE, FOLD_RELATION)
            self.store.merge_rows(lambda _view: changed, CHANGED_COLUMNS, rows,
                                  "refreshing the sensor state table's changed rows", view=FOLD_RELATION)

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

    # -- checking the folds ---------------------------------------------------------------------------

    def run_maintenance(self, maintenance: Maintenance, *, compact_all: bool = False) -> MaintenanceResult:
        """A maintenance run (which leaves what the tables derive unchanged, so they stay current), then, when
        this process folded since the last check, :meth:`check_folds`: the rows it repaired are in the result.
        (A process that never folded has tables dbt derived: nothing to compare.)"""
        with self.keeping_current():
            result = maintenance.run(compact_all=compact_all)
        if self._folded_unchecked:
            result.repaired_rows.extend(self.check_folds())
        return result

    def check_folds(self) -> list[RowKey]:
        """Derive the control table with dbt and compare it, row by row, with the table as the folds left it; a
        row that differs is repaired by that very build. The keys of the repaired rows (none: the folds gave what
        the derivation gives), each logged as a warning, as a difference means a fold's rule drifted from the
        model's. The caller holds the tick lease; the tables are current after it."""
        before = self._row_digests()
        self.refresh(force=True)
        self._folded_unchecked = False
        after = self._row_digests()
        repaired = sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
        for key in repaired:
            log.warning("control row %s/%s/%s differed from its derivation (a fold's rule drifted from "
                        "models/heartbeat_control.sql): rebuilt", *key)
        return repaired

    def _row_digests(self) -> dict[RowKey, str]:
        rows = self.store.engine.sql(self.dbt.macro_sql(ROW_DIGESTS)).collect()
        return {RowKey(r["sensor_source"], r["sensor_id"], r["trigger_job_id"]): r["digest"] for r in rows}

    # -- the marker ----------------------------------------------------------------------------------

    def _marker(self, scope: Scope) -> Path:
        return self.dbt.work_dir / f"built_events_version{scope.value}"

    def _mark(self, events_version: int | None, scope: Scope) -> None:
        """Record what a build included; a full build also counts as a control-only one."""
        for each in (Scope.CONTROL, Scope.FULL) if scope is Scope.FULL else (scope,):
            marker = self._marker(each)
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.write_text(str(events_version))
