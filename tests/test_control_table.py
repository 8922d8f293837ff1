"""ControlTable (lakehouse/control_table.py): the one owner of the control table's bookkeeping. Whether the
tables are current follows the built marker; a build a crash cut short before its mark is done again; writes
the tables do not derive from keep them current; only one run's own requests and answers may be folded."""

from __future__ import annotations

from harness import Harness
from harness import config_row as row

from heartbeat_runner.core.records import Event, EventType, JobStatus, RefreshPath, RefreshReason, utcnow
from heartbeat_runner.lakehouse.control_table import (
    Appended,
    ControlTable,
    FoldKind,
    NoFold,
    OwnCommits,
    Refresh,
    Scope,
)
from heartbeat_runner.runner.empty_reads import ASKS, EmptyReads
from heartbeat_runner.runner.tick_result import TickResult
from heartbeat_runner.sensing.parallel import sense_all


def _config_loaded() -> Event:
    """An event the control table derives from (a config load), with nothing else to set up."""
    return Event(event_type=EventType.CONFIG_LOADED, run_id="test", snapshot_ts=utcnow(), message="test")


def test_the_tables_are_current_after_a_build_and_not_after_an_append(hb):
    hb.jobs(J1=0)
    hb.seed(row("trigger_file", "a", "J1"))
    control = hb.app.control
    control.refresh()
    assert control.is_current() and control.is_current(Scope.CONTROL)

    control.append([_config_loaded()])
    assert not control.is_current() and not control.is_current(Scope.CONTROL)

    first = control.refresh(control_only=True)  # the control table alone, as a tick before triggering
    assert first.built and first.version == hb.app.store.events_version()
    assert control.is_current(Scope.CONTROL) and not control.is_current()
    assert control.refresh(control_only=True).built is False

    second = control.refresh()  # the sensor state table follows
    assert second.built and control.is_current() and control.built_version() == first.version
    assert control.refresh().built is False


def test_a_build_a_crash_cut_short_before_its_mark_is_done_again(hb):
    """New data appended, the process gone before the build was marked: a new process's ControlTable sees
    the tables behind the events and builds, so the job's new data is not lost."""
    hb.jobs(J1=0)
    hb.seed(row("trigger_file", "a", "J1"))
    hb.tick()  # the baseline
    hb.drop_trigger_file("a", "1.done")
    result = TickResult(run_id="crashed", snapshot_ts=utcnow())
    result.sensed = sense_all(hb.app.store.sensors_due(), hb.heartbeat.ctx, max_workers=1, timeout_s=30)
    hb.app.control.append(hb.heartbeat.sensed_events(result))  # then the crash: no build, no mark
    assert {r["status"] for r in hb.app.store.control_rows("J1")} != {JobStatus.NEW_EVENT_AVAILABLE.value}

    restarted = ControlTable(hb.app.store, hb.app.dbt)
    assert not restarted.is_current()
    assert restarted.refresh().built and restarted.is_current()
    assert {r["status"] for r in hb.app.store.control_rows("J1")} == {JobStatus.NEW_EVENT_AVAILABLE.value}

    hb.app.control.append([_config_loaded()])
    hb.app.dbt.build_control()  # a build that ran, with the crash before its mark: built again
    assert restarted.refresh().built


def _alert_event() -> Event:
    """An event the control table does not derive from (a lineage delivery record)."""
    return Event(event_type=EventType.LINEAGE_SENT, run_id="test", snapshot_ts=utcnow(), message="START")


def test_writes_the_tables_do_not_derive_from_keep_them_current(tmp_path):
    """An alert record and a maintenance run (its archive's delete, its compaction) keep the tables current,
    and a refresh after them has nothing to do."""
    with Harness(tmp_path, HEARTBEAT_ARCHIVE_MARGIN_MINUTES="0") as hb:
        hb.jobs(J1=0)
        hb.seed(row("trigger_file", "a", "J1"))
        hb.tick()  # the baseline
        for name in ("1.done", "2.done"):
            hb.drop_trigger_file("a", name)
            hb.tick()
            hb.wait_for_jobs()
        hb.tick()
        control = hb.app.control
        control.refresh()
        before = hb.app.store.events_version()
        control.append_beside([_alert_event()])
        assert hb.app.store.events_version() == before + 1 and control.is_current()
        maintained = hb.heartbeat.run_maintenance()
        assert maintained.archived_events > 0 and hb.app.store.events_version() > before + 1
        assert control.is_current() and control.refresh().built is False


def test_another_processs_commit_during_a_write_beside_is_derived_by_the_next_refresh(hb):
    """The lineage test's CI failure: a job's own `complete` committed while the runner recorded a lineage
    delivery; the marker moved over it, so the next refresh did nothing, the row stayed IN_PROGRESS, the tick
    recorded the run's end a second time and its COMPLETE event went out twice. Now a marker moves only over the
    write's own commits: another process's commit meanwhile (here an operator's `pause`) is derived next."""
    from heartbeat_runner.interfaces.operations import record_job_event

    hb.jobs(J1=0)
    hb.seed(row("trigger_file", "a", "J1"))
    control = hb.app.control
    control.refresh()
    with control.keeping_current(commits=1):
        record_job_event(hb.app, "J1", EventType.JOB_PAUSED)  # another process, between the write's reads
        hb.app.store.append_events([_alert_event()])
    assert not control.is_current()
    assert control.refresh().built
    assert {r["job_state"] for r in hb.app.store.control_rows("J1")} == {"PAUSED"}

    with control.keeping_current():  # a maintenance run's write: its history shows the other commit
        record_job_event(hb.app, "J1", EventType.JOB_RESUMED)
    assert not control.is_current()
    assert control.refresh().built
    assert {r["job_state"] for r in hb.app.store.control_rows("J1")} == {"UNPAUSED"}


def _request(run_id: str, job: str, kind: EventType = EventType.TRIGGER_REQUESTED) -> Event:
    return Event(event_type=kind, run_id=run_id, snapshot_ts=utcnow(), trigger_job_id=job,
                 idempotency_token=f"token-{job}", job_run_id="7" if kind is EventType.TRIGGERED else None)


def _kinds(span: Appended, *, only_own: bool = True) -> list[FoldKind] | None:
    folds = span.folds(only_own=only_own)
    return None if folds is None else [step.kind for step in folds]


def test_only_one_runs_own_requests_and_their_answers_fold():
    span = Appended(base_version=10)
    span.add([_request("r1", "J1"), _request("r1", "J2")])
    span.add([_request("r1", "J1", EventType.TRIGGERED)])
    folds = span.folds(only_own=True)
    assert folds is not None and [s.kind for s in folds] == [FoldKind.REQUESTS]
    assert {(row[0], row[4]) for row in folds[0].fold_rows()} == {("J1", "7"), ("J2", None)}  # job, its run
    assert span.folds(only_own=False) is None  # another process committed meanwhile

    for other in (_request("r2", "J3"),                                      # another run's request
                  _request("r1", "J1"),                                      # a second request of one job
                  _request("r1", "J9", EventType.TRIGGERED),                 # an answer to no request
                  Event(event_type=EventType.TRIGGER_ERROR, run_id="r1", snapshot_ts=utcnow(),
                        trigger_job_id="J2", idempotency_token="token-J2"),  # a refusal
                  _config_loaded()):
        span = Appended(base_version=10)
        span.add([_request("r1", "J1"), _request("r1", "J2")])
        span.add([other])
        assert span.folds(only_own=True) is None, other

    assert _kinds(Appended(base_version=10)) == []  # nothing appended: nothing to fold


def _sensed(run_id: str, key: str, kind: EventType = EventType.NEW_DATA) -> Event:
    return Event(event_type=kind, run_id=run_id, snapshot_ts=utcnow(), source_key=key, cursor_to="1")


def _ended(run_id: str, job: str, kind: EventType = EventType.COMPLETED) -> Event:
    return Event(event_type=kind, run_id=run_id, snapshot_ts=utcnow(), trigger_job_id=job, job_run_id="7")


def test_a_ticks_own_commits_fold_in_order_and_anything_else_derives():
    span = Appended(base_version=10)
    span.add([_sensed("r1", "a"), _sensed("r1", "b"), _sensed("r1", "c", EventType.CURSOR)])
    span.add([_request("r1", "J1")])
    span.add([_request("r1", "J1", EventType.TRIGGERED)])
    span.add([_ended("r1", "J2"), _ended("r1", "J3", EventType.FAILED)])
    folds = span.folds(only_own=True)
    assert folds is not None and [s.kind for s in folds] == [FoldKind.NEW_DATA, FoldKind.REQUESTS, FoldKind.ENDS]
    assert [row[0] for row in folds[0].fold_rows()] == ["a", "b"]  # a CURSOR changes no control row
    assert span.folds(only_own=False) is None  # another process committed meanwhile

    for commit in ([_sensed("r1", "a"), _sensed("r2", "b")],  # two runs' events
                   [_sensed("r1", "a"), _sensed("r1", "a")],  # two of one source
                   [_sensed("r1", "a"), _config_loaded()],  # anything else
                   [_sensed("r1", "a"), _request("r1", "J1")],  # two kinds in one commit
                   [_ended("r1", "J1"), _ended("r1", "J1", EventType.FAILED)],  # two ends of one job
                   [_ended("r1", "J1"), Event(event_type=EventType.RETRY_REQUESTED, run_id="r1", snapshot_ts=utcnow(),
                                              trigger_job_id="J2", idempotency_token="t")]):  # a retry
        span = Appended(base_version=10)
        span.add(commit)
        assert span.folds(only_own=True) is None, commit


def _path(refresh: Refresh) -> tuple[RefreshPath, RefreshReason | None]:
    return refresh.path, refresh.reason


def test_a_refresh_says_its_path_and_why_it_built_rather_than_folded(hb):
    """Each refresh names its path: NONE (current), FOLD (its own commits), or BUILD with why no fold: forced, the
    process's first refresh, a commit that cannot fold (named), another writer's commit, a control table built
    past the span's base (another process's build), folds turned off."""
    hb.jobs(J1=0)
    hb.seed(row("trigger_file", "a", "J1"))
    store, dbt, control = hb.app.store, hb.app.dbt, hb.app.control
    assert _path(control.refresh(force=True)) == (RefreshPath.BUILD, RefreshReason.FORCED)
    assert _path(control.refresh()) == (RefreshPath.NONE, None)

    reads = EmptyReads(control.own)  # a read only another process can fill, found empty now
    reads.found(ASKS, empty=True)
    control.append([_sensed("r1", "trigger_file|a", EventType.CURSOR)])  # a tick's own sensing append
    assert _path(control.refresh()) == (RefreshPath.FOLD, None)
    assert reads.still_empty(ASKS)  # the same record: only the runner's own commit came since

    control.append([_config_loaded()])
    built = control.refresh()
    assert _path(built) == (RefreshPath.BUILD, RefreshReason.NOT_FOLDABLE) and built.why is not None
    assert built.why.detail == EventType.CONFIG_LOADED.value
    assert built.as_dict() == {"path": "build", "reason": "not_foldable", "detail": "CONFIG_LOADED"}

    reads.found(ASKS, empty=True)
    store.append_events([_config_loaded()])  # another writer (a CLI command) beside this object's span
    assert _path(control.refresh()) == (RefreshPath.BUILD, RefreshReason.OTHER_COMMITS)
    assert not reads.still_empty(ASKS)  # ... which both the fold and the empty read see, from one record

    other = ControlTable(store, dbt)  # another process: its first refresh finds the events moved
    store.append_events([_config_loaded()])
    assert _path(other.refresh()) == (RefreshPath.BUILD, RefreshReason.FIRST_REFRESH)
    other.append([_config_loaded()])
    other.refresh()  # ... and builds past the base of this object's span, which then appends its own commit
    control.append([_sensed("r2", "trigger_file|a", EventType.CURSOR)])
    assert _path(control.refresh()) == (RefreshPath.BUILD, RefreshReason.MOVED)

    off = ControlTable(store, dbt, folding=False)  # HEARTBEAT_FOLDS=off
    off.refresh()
    off.append([_sensed("r3", "trigger_file|a", EventType.CURSOR)])
    assert _path(off.refresh()) == (RefreshPath.BUILD, RefreshReason.FOLDS_OFF)


def test_a_span_that_cannot_fold_keeps_the_commit_that_stopped_it():
    def first_refusal(*commits: list[Event]) -> str | None:
        span = Appended(base_version=10)
        for commit in commits:
            span.add(commit)
        plan = span.plan(only_own=True)
        return plan.detail if isinstance(plan, NoFold) and plan.reason is RefreshReason.NOT_FOLDABLE else None

    retry = Event(event_type=EventType.RETRY_REQUESTED, run_id="r1", snapshot_ts=utcnow(), trigger_job_id="J2",
                  idempotency_token="t")
    assert first_refusal([_ended("r1", "J1"), retry]) == "COMPLETED+RETRY_REQUESTED"
    assert first_refusal([_request("r1", "J1")], [_request("r1", "J1")], [_config_loaded()]) == \
        "TRIGGER_REQUESTED: a second request of a job in the span"  # the first refusal is kept
    assert first_refusal([_sensed("r1", "a")], [_sensed("r2", "b")]) == "NEW_DATA: another run's events"
    assert first_refusal([_request("r1", "J9", EventType.TRIGGERED)]) == \
        "TRIGGERED: an answer to no request of the span"
    assert first_refusal([_sensed("r1", "a")]) is None
    span = Appended(base_version=10)
    span.add([_sensed("r1", "a")])
    assert span.plan(only_own=False) == NoFold(RefreshReason.OTHER_COMMITS)


def test_the_one_record_of_own_commits_checks_them_at_each_read_of_the_version():
    """OwnCommits: commits are counted as they are made and checked at the next read of the events version; one
    commit of anybody else (or a version not read) makes everything known before it unknown, for the folds and
    the empty reads alike. No clock is read."""
    own = OwnCommits()
    reads = EmptyReads(own)
    reads.found(ASKS, empty=True)
    assert not reads.still_empty(ASKS)  # no version read yet: nothing is known
    assert not own.read(10)  # the first read: nothing to check
    reads.found(ASKS, empty=True)
    own.committed()
    own.committed()
    assert own.position == 12 and reads.still_empty(ASKS)
    assert own.read(12) and reads.still_empty(ASKS)  # exactly our two commits came
    own.committed()
    assert not own.read(14)  # ours and one of another process (or ours, committed twice)
    assert not reads.still_empty(ASKS) and own.since == 14
    reads.found(ASKS, empty=True)
    assert own.read(14) and reads.still_empty(ASKS)
    reads.found(ASKS, empty=False)
    assert not reads.still_empty(ASKS)
