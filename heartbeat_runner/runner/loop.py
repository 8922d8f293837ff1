"""A runner process's ticks: one (``run``: cron, a scheduled job, a tick per process) or a loop
(``run --loop``) until SIGINT/SIGTERM.

Invariants:

- every tick leaves a row in ``heartbeat_runs``: a tick that raises is recorded as FAILED under its own
  run id (:func:`record_failed_tick`) with its error's kind and redacted message; when even that row
  cannot be written, the failure to record is logged and the run goes on (the one-shot ``run`` still
  raises the tick's own error, so its exit code is non-zero);
- a loop polls every due source each interval; in between, a wake-up (runner/wakeups.py) starts a tick
  limited to the sources it named at once, so a lost wake-up costs at most one interval. Wake-ups never
  move the next poll, and while ticks fail the loop backs off deaf to them;
- a loop survives any single tick: it backs off (:meth:`RunConfig.wait_s`) and ticks again; it stops
  early only when the lakehouse itself is unusable (EXIT_LAKEHOUSE_UNUSABLE), when the dbt project it
  runs changed under it (EXIT_PROJECT_CHANGED: a redeploy; before the next tick, the lease given up) or past
  its memory ceiling (it closes everything, then re-executes itself: runner/memory.py);
- what the loop carries from one tick to the next is a value (:class:`LoopState`), returned by each
  tick; nothing per tick is kept on a long-lived object;
- nothing here prints: what a run shows goes through its view (:class:`TickView`, :class:`LoopView`),
  which the interface supplies.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.errors import TickFailedAfterChangesError, TickFailedError, describe, kind_of
from heartbeat_runner.core.metrics import DEFAULT_METRICS_HOST, MetricsServer, metrics, serve_metrics
from heartbeat_runner.core.records import RunStart, RunSummary, TickStatus, utcnow
from heartbeat_runner.core.secrets import redact
from heartbeat_runner.core.settings import Settings
from heartbeat_runner.core.stopping import StopRequest
from heartbeat_runner.engines.engine_errors import engine_failures
from heartbeat_runner.lakehouse.store import TableStore
from heartbeat_runner.policies.run_policies import runnable_policies
from heartbeat_runner.runner.app import App, open_app
from heartbeat_runner.runner.lease import Lease, LeaseHeld, LeaseInfo, tick_lease
from heartbeat_runner.runner.memory import (
    EngineRecycler,
    MemoryCeiling,
    RestartRequested,
    loop_restarts,
    restart_process,
)
from heartbeat_runner.runner.observability import count_outcome, count_tick
from heartbeat_runner.runner.tick import Heartbeat
from heartbeat_runner.runner.tick_result import CONTROL_REFRESHES, TickResult
from heartbeat_runner.runner.wakeups import POLL, SourceWatches, TickScope, WakeSignal

log = logging.getLogger(__name__)

#: Exit code of ``run --loop`` when the lakehouse itself is unusable.
EXIT_LAKEHOUSE_UNUSABLE = 3
#: Exit code of ``run --loop`` when the dbt project it runs is no longer the one it started with: a redeploy
#: uploaded other models or macros, which this process's code (an installed wheel) may not match. Non-zero, so
#: a continuous job's platform starts a new run, on the new wheel.
EXIT_PROJECT_CHANGED = 5
#: After failed ticks the loop waits interval x 2^(failures-1), at least this long and at most MAX_BACKOFF_S.
MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0
#: a loop whose tick held a job polls this long after the hold's end (runner/tick_result.py, TickResult.release_at)
HOLD_SLACK_S = 0.05


@dataclass(frozen=True)
class RunConfig:
    """How a run ticks (from the command's flags)."""

    #: seconds between tick starts of a loop
    interval_s: float
    #: seconds a tick waits for another runner's lease before it is skipped
    lease_wait_s: float
    #: ``run --loop``: the port of the metrics exposition (None: none; 0: any free port)
    metrics_port: int | None = None
    #: ... and the address it binds (this machine only unless told otherwise)
    metrics_host: str = DEFAULT_METRICS_HOST
    #: a loop ticks early for the sources that say they changed (file-system notifications, ``POST /wake``)
    wakeups: bool = False

    def wait_s(self, failures: int) -> float:
        """Seconds from a tick's start to the next one's: the interval, or after ``failures`` failed ticks in
        a row interval x 2^(failures-1), within MIN_BACKOFF_S and MAX_BACKOFF_S."""
        if not failures:
            return self.interval_s
        return Backoff(first_s=max(MIN_BACKOFF_S, self.interval_s), max_s=MAX_BACKOFF_S).after(failures)


@dataclass(frozen=True)
class LoopState:
    """What the loop carries from one tick to the next; each tick returns the next state."""

    #: ticks done
    ticks: int = 0
    #: ticks failed in a row (0 after a tick that went through)
    failures: int = 0
    #: the latest failure's text ("" after a tick that went through): a repeated error is logged in one line
    last_error: str = ""


@dataclass(frozen=True)
class TickFailure:
    """A tick (or what the loop does after it) that raised."""

    error: Exception
    #: ``describe(error)``
    text: str
    #: failed ticks in a row, this one included
    failures: int
    #: the previous tick failed with the same text
    repeated: bool


@dataclass(frozen=True)
class TickEnd:
    """How one tick of the loop ended: the state for the next tick and when the next poll starts (monotonic;
    a wake-up may start a tick before), or the loop's exit code when it must stop."""

    state: LoopState
    next_at: float
    exit_code: int | None = None


class TickView(Protocol):
    """What one tick shows (the interface draws it; the runner decides nothing by it)."""

    def session(self) -> AbstractContextManager[object]:
        """Around the tick (one-shot) or the whole loop: a progress display, a status line."""

    def progress(self, message: str) -> None:
        """A step of the running tick."""

    def ticked(self, result: TickResult) -> None:
        """A tick went through."""

    def skipped(self, held: LeaseHeld) -> None:
        """Another runner holds the tick lease: this tick is skipped."""


class LoopView(TickView, Protocol):
    """What a loop shows besides its ticks."""

    def starting(self, number: int) -> None:
        """Tick ``number`` (from 1) starts."""

    def failed(self, failure: TickFailure) -> None:
        """A tick (or what follows it) raised; the loop goes on unless the lakehouse is unusable."""

    def finished(self, number: int, result: TickResult | None, failures: int, took_s: float, next_at: float) -> None:
        """Tick ``number`` ended (``result`` None: skipped or failed); the next starts at ``next_at``."""

    def unusable(self, problem: str, exit_code: int) -> None:
        """The loop stops: the lakehouse is unusable."""

    def redeployed(self, change: str, exit_code: int) -> None:
        """The loop stops: the project it runs changed under it (``change`` says how)."""

    def stopped(self, ticks: int) -> None:
        """The loop stopped on a signal after ``ticks`` ticks."""


def _nothing() -> None:
    return None


def _record_nothing(start: RunStart, error: Exception, took_s: float) -> None:
    return None


@dataclass(frozen=True)
class LoopHooks:
    """What the loop asks of the lakehouse around its ticks (defaults: nothing, for tests)."""

    #: why the lakehouse is unusable, or None; asked after a failed tick
    lakehouse_problem: Callable[[], str | None] = _nothing
    #: after every tick that went through, between ticks (may raise RestartRequested)
    after_tick: Callable[[], None] = _nothing
    #: record a tick that raised (must not raise; what it returns is not used)
    record_failure: Callable[[RunStart, Exception, float], object] = _record_nothing
    #: why this process no longer matches the deployed project, or None; asked before every tick (must not raise)
    project_changed: Callable[[], str | None] = _nothing


# -- one process ----------------------------------------------------------------------------------

def tick_failure(error: Exception, done: TickResult) -> TickFailedError:
    """The error a one-shot ``run`` reports for a tick that raised ``error`` after doing ``done``: one line
    saying what it did before it failed (and the run id of its FAILED row), no traceback."""
    did = [f"{len(done.sensed)} source(s) sensed, {done.sources_with_new_data} with new data",
           f"{done.events_written} event(s) recorded"]
    if done.triggered:
        did.append("triggered " + ", ".join(f"job {t.job_id} (run {t.run_id})" for t in done.triggered))
    if done.completed or done.failed:
        did.append(f"{len(done.completed)} run(s) completed, {len(done.failed)} failed")
    text = f"tick {done.run_id} failed: {describe(error)}; before it failed: {'; '.join(did)}"
    if done.events_written:
        return TickFailedAfterChangesError(text + " (recorded; the next tick goes on from there)", done.run_id)
    return TickFailedError(text + " (nothing was changed)", done.run_id)


def run_once(settings: Settings, config: RunConfig, view: TickView) -> int:
    """``run``: one tick under the lease; its exit code (0 when skipped). A tick that raises is recorded,
    then its error is raised again (the caller's exit code for it is non-zero). A run-policy file that is
    missing or invalid is refused (ConfigError) before anything is opened or claimed."""
    _check_run_policies(settings)
    return _under_lease(settings, config, view, lambda app, lease: _one_tick(app, lease, view))


def run_forever(settings: Settings, config: RunConfig, view: LoopView) -> int:
    """``run --loop``: tick every ``config.interval_s`` until SIGINT/SIGTERM (see the module's invariants).
    Past its memory ceiling it closes everything, then replaces its own process (never returns then).
    With ``config.metrics_port`` it serves its metrics there, on a thread, for as long as it runs. A run-policy
    file that is missing or invalid is refused (ConfigError) before anything is opened, served or claimed."""
    _check_run_policies(settings)
    stop = StopRequest().install()  # from here on a stop signal also ends a wait for the lease
    exposition = _exposition(config)
    try:
        return _under_lease(settings, config, view, lambda app, lease: _loop_with(app, lease, config, view, stop),
                            stop=stop.is_set)
    except RestartRequested as exc:
        if exposition is not None:
            exposition.close()  # the new process listens on the same port
            exposition = None
        restart_process(str(exc))
        return 0  # not reached: restart_process replaces the process
    finally:
        if exposition is not None:
            exposition.close()


def _check_run_policies(settings: Settings) -> None:
    """ConfigError when the run-policy file the settings name is missing or invalid (policies/run_policies.py);
    asked before the lakehouse is opened, so a refused run writes nothing and never claims the lease."""
    runnable_policies(settings.run_policy_file, settings.run_policy_variable)


def _exposition(config: RunConfig) -> MetricsServer | None:
    """The metrics exposition of a loop, when it has a port (and the loop's interval, for the rules)."""
    if config.metrics_port is None:
        return None
    metrics().interval.set(config.interval_s)
    server = serve_metrics(config.metrics_port, config.metrics_host)
    log.info("metrics on http://%s:%d/metrics", server.host, server.port)
    return server


def _under_lease(settings: Settings, config: RunConfig, view: TickView, body: Callable[[App, Lease], int],
                 stop: Callable[[], bool] = lambda: False) -> int:
    """Open the app, take the tick lease before the views are built (building them writes too), run ``body``,
    then give the lease up and close; 0 (shown as skipped) when another runner keeps the lease, or when
    ``stop()`` turns true while this process waits for it."""
    with open_app(settings) as app:
        lease = tick_lease(app.store)
        try:
            lease.acquire(config.lease_wait_s, stop=stop, waiting=_says_waiting(view, config))
        except LeaseHeld as exc:
            view.skipped(exc)
            return 0
        try:
            return body(app, lease)
        finally:
            _release(lease)


@contextlib.contextmanager
def _heartbeat(app: App, lease: Lease, view: TickView) -> Iterator[Heartbeat]:
    """The heartbeat of this process: it shows its steps in ``view`` and renews the lease before any jobs API
    call; closed after (it writes the summary of a pending streak of idle ticks)."""
    heartbeat = app.heartbeat(progress=view.progress, before_trigger=lease.renew)
    try:
        yield heartbeat
    finally:
        heartbeat.close()


def _one_tick(app: App, lease: Lease, view: TickView) -> int:
    with _heartbeat(app, lease, view) as heartbeat:
        try:
            result = _recorded(app.store, lambda start, done: _in_session(view, heartbeat, start, done))
        except TickFailedError:
            count_outcome(None, failed=True)
            raise
        count_outcome(result, failed=False)
        view.ticked(result)
        return result.exit_code


def _in_session(view: TickView, heartbeat: Heartbeat, start: RunStart, done: TickResult) -> TickResult:
    with view.session():
        return _counted(heartbeat, start, done.scope, done)


def _counted(heartbeat: Heartbeat, start: RunStart, scope: TickScope = POLL,
             done: TickResult | None = None) -> TickResult:
    """``heartbeat.tick(start, scope)``, its figures counted in this process's metrics; it fills ``done`` when
    given (what a tick that raised had done)."""
    result = heartbeat.tick(start, scope, done)
    count_tick(result, heartbeat.settings.effective_jobs_backend)
    return result


def _recorded(store: TableStore, tick: Callable[[RunStart, TickResult], TickResult]) -> TickResult:
    """``tick`` run under a fresh RunStart, filling a fresh TickResult; when it raises, its failure is
    recorded with what it had done, then reported as a TickFailedError (from the tick's error) that says so."""
    start, began = RunStart.now(), time.monotonic()
    done = TickResult(run_id=start.run_id, snapshot_ts=start.snapshot_ts)
    try:
        with engine_failures():
            return tick(start, done)
    except Exception as exc:
        record_failed_tick(store, start, exc, time.monotonic() - began, done)
        log.debug("tick %s failed", start.run_id, exc_info=True)
        raise tick_failure(exc, done) from exc


def _loop_with(app: App, lease: Lease, config: RunConfig, view: LoopView, stop: StopRequest) -> int:
    wakes = WakeSignal() if config.wakeups else None
    with _heartbeat(app, lease, view) as heartbeat, _watches(app, heartbeat, wakes) as watches:
        lease.yield_if_wanted()
        app.dbt.manifest()  # parse the dbt project now, not when the first new data arrives
        heartbeat.loop_restarts = loop_restarts()
        #: the running tick's result as it fills (by run id): what a tick that raises had done, for its row
        running: dict[str, TickResult] = {}
        hooks = LoopHooks(lakehouse_problem=app.lakehouse_problem, after_tick=memory_guard(app),
                          record_failure=lambda start, exc, took_s: record_failed_tick(
                              app.store, start, exc, took_s, running.pop(start.run_id, None)),
                          project_changed=project_guard(app))

        def tick(start: RunStart, scope: TickScope) -> TickResult | None:
            running.clear()
            running[start.run_id] = TickResult(run_id=start.run_id, snapshot_ts=start.snapshot_ts, scope=scope)
            with engine_failures():  # a tick after the engine died fails with why it died
                result = _leased_tick(lease, heartbeat, start, scope, config, view, running[start.run_id],
                                      stop=stop.is_set)
            if result is not None and result.polled and watches is not None:
                watches.follow([s.target for s in result.sensed])
            return result

        return run_loop(tick, config, view, hooks, wakes, stop)


@contextlib.contextmanager
def _watches(app: App, heartbeat: Heartbeat, wakes: WakeSignal | None) -> Iterator[SourceWatches | None]:
    """What raises the loop's wake-ups ``wakes`` when they are on (None: off): the sources' notifications, the
    jobs backend's run ends, and ``POST /wake`` when a port is set (runner/wake_endpoint.py); all closed after
    the loop."""
    if wakes is None:
        yield None
        return
    from heartbeat_runner.runner.wake_endpoint import wake_endpoint

    watches = SourceWatches(heartbeat.ctx, wakes)
    runs = watches.runs_of(heartbeat.backend)
    try:
        with wake_endpoint(app.settings, wakes, watches.names):
            yield watches
    finally:
        watches.close()
        if runs is not None:
            runs.close()


def _leased_tick(lease: Lease, heartbeat: Heartbeat, start: RunStart, scope: TickScope, config: RunConfig,
                 view: TickView, done: TickResult | None = None,
                 stop: Callable[[], bool] = lambda: False) -> TickResult | None:
    """One tick of the loop under the lease (kept after it unless another runner waits for it), or None
    (skipped, shown) when another runner holds it, past the wait or once ``stop()`` says the loop stops.
    It fills ``done`` when given."""
    try:
        with lease.ticking(config.lease_wait_s, stop=stop, waiting=_says_waiting(view, config)):
            return _counted(heartbeat, start, scope, done)
    except LeaseHeld as exc:
        view.skipped(exc)
        return None


def _says_waiting(view: TickView, config: RunConfig) -> Callable[[LeaseInfo], None]:
    """What a runner shows as it begins to wait for the lease (``--wait-lease``): whom it waits for, how long."""
    return lambda holder: view.progress(f"{LeaseHeld(holder)}; waiting up to {config.lease_wait_s:g} s for it")


def _release(lease: Lease) -> None:
    """Give the lease up at the end of a run; a lakehouse that cannot be reached then leaves it to expire
    (the error that ended the run is the one to report)."""
    try:
        lease.release()
    except Exception as exc:  # noqa: BLE001 - any engine error: the lease expires by itself
        log.warning("could not release the tick lease (it expires by itself): %s", describe(exc))


def project_guard(app: App) -> Callable[[], str | None]:
    """What the loop asks before each tick: has the dbt project (``HEARTBEAT_PROJECT_DIR``: its
    ``dbt_project.yml``, models and macros, by content) changed since the loop started? A redeploy uploads new
    project files but leaves this process on the wheel it was installed with; ticking on would build the new
    models with the old code. A project that cannot be read now decides nothing (logged): a restart would not
    read it either."""
    project = app.settings.project_dir
    started = app.dbt.project_digest()

    def changed() -> str | None:
        try:
            now = app.dbt.project_digest()
        except OSError as exc:
            log.warning("could not read the dbt project %s to compare it: %s", project, describe(exc))
            return None
        if now == started:
            return None
        return (f"the dbt project {project} changed since this loop started (a redeploy?): its models, macros or "
                "dbt_project.yml differ from those this process started with")

    return changed


def memory_guard(app: App) -> Callable[[], None]:
    """What the loop does after each tick: recycle the embedded engine when due (EngineRecycler), and raise
    RestartRequested once the process tree holds more than HEARTBEAT_MAX_RSS_MB."""
    recycler = EngineRecycler(app, app.settings.memory)
    ceiling = MemoryCeiling(app.settings.memory.max_rss_mb, user_set=app.settings.memory.max_rss_set)

    def after_tick() -> None:
        recycler.after_use()
        rss = ceiling.passed()
        if rss is not None:
            raise RestartRequested(f"the process tree holds {rss:.0f} MiB, more than {ceiling.bound.describe()}")

    return after_tick


# -- the loop -------------------------------------------------------------------------------------

#: One tick of a loop: its run id and snapshot, and the sources it senses; None when it was skipped.
LoopTick = Callable[[RunStart, TickScope], "TickResult | None"]


def run_loop(tick: LoopTick, config: RunConfig, view: LoopView, hooks: LoopHooks = LoopHooks(),
             wakes: WakeSignal | None = None, stop: StopRequest | None = None) -> int:
    """Poll every ``config.interval_s`` seconds until SIGINT/SIGTERM; 0, EXIT_LAKEHOUSE_UNUSABLE or
    EXIT_PROJECT_CHANGED (checked before each tick, so no tick runs half on either project). With
    ``wakes``, a wake-up between polls ticks at once for the sources it named.

    ``tick`` returns None when it was skipped. RestartRequested (from ``hooks.after_tick``) and
    BrokenPipeError (the reader of the output went away) end the loop by propagating."""
    stop = stop or StopRequest().install()
    state, scope, poll_at = LoopState(), POLL, 0.0
    with view.session():
        while not stop.is_set():
            if (change := hooks.project_changed()) is not None:
                view.redeployed(change, EXIT_PROJECT_CHANGED)
                return EXIT_PROJECT_CHANGED
            try:
                end = _loop_tick(tick, scope, config, view, hooks, state, poll_at)
            except RestartRequested:
                if not stop.is_set():
                    raise
                # a stop signal came during the tick: stop; a restart would replace the process and lose it
                log.info("not restarting: the loop was asked to stop")
                break
            if end.exit_code is not None:
                return end.exit_code
            state, poll_at = end.state, end.next_at
            scope = _next_scope(wakes, stop, poll_at, failing=state.failures > 0)
    stop.shutting_down()
    view.stopped(state.ticks)
    return 0


def _next_scope(wakes: WakeSignal | None, stop: StopRequest, poll_at: float, *, failing: bool) -> TickScope:
    """Wait for the next tick: a wake-up before ``poll_at`` (its scope), else the poll. While ticks fail the
    loop backs off deaf to wake-ups; the poll after senses everything they named."""
    if wakes is not None and not failing:
        return wakes.wait(poll_at, stop) or _polled(wakes)
    stop.wait(max(0.0, poll_at - time.monotonic()))
    return _polled(wakes)


def _polled(wakes: WakeSignal | None) -> TickScope:
    """A poll: the wake-ups pending are forgotten, since it senses every source they could name."""
    if wakes is not None:
        wakes.take()
    return POLL


def _loop_tick(tick: LoopTick, scope: TickScope, config: RunConfig, view: LoopView,
               hooks: LoopHooks, state: LoopState, poll_at: float) -> TickEnd:
    """One tick of the loop and what follows it; the state after it, and when the next poll is due: an
    interval after a poll's start, a back-off after a failure, else unchanged (``poll_at``)."""
    started = time.monotonic()
    number = state.ticks + 1
    view.starting(number)
    start = RunStart.now()
    result: TickResult | None = None
    failure: TickFailure | None = None
    try:
        result = tick(start, scope)
    except (RestartRequested, BrokenPipeError):
        raise
    except Exception as exc:  # noqa: BLE001 - the loop survives any single tick
        failure = _failure(exc, state)
        view.failed(failure)
        hooks.record_failure(start, exc, time.monotonic() - started)
    count_outcome(result, failed=failure is not None)
    if failure is None:
        if result is not None:
            view.ticked(result)
        failure = _after_tick(hooks, LoopState(state.ticks))
        if failure is not None:
            view.failed(failure)
    if failure is not None and (problem := _safely(hooks.lakehouse_problem)) is not None:
        view.unusable(problem, EXIT_LAKEHOUSE_UNUSABLE)
        return TickEnd(state, started, EXIT_LAKEHOUSE_UNUSABLE)
    failures = failure.failures if failure else 0
    next_at = started + config.wait_s(failures) if scope.polls or failures else poll_at
    if not failures and result is not None and result.release_at is not None:
        next_at = min(next_at, _monotonic_at(result.release_at, started))
    view.finished(number, result, failures, time.monotonic() - started, next_at)
    return TickEnd(LoopState(number, failures, failure.text if failure else ""), next_at)


def _monotonic_at(when: datetime, started: float) -> float:
    """The monotonic time of the wall-clock time ``when`` (a hold's end), a little after it so the tick then
    finds it over, and never sooner than MIN_BACKOFF_S after the tick's start (a hold cannot make a busy loop)."""
    return max(started + MIN_BACKOFF_S, time.monotonic() + (when - utcnow()).total_seconds() + HOLD_SLACK_S)


def _after_tick(hooks: LoopHooks, state: LoopState) -> TickFailure | None:
    """Run ``hooks.after_tick`` after a tick that went through; its failure counts as the tick's."""
    try:
        hooks.after_tick()
    except (RestartRequested, BrokenPipeError):
        raise
    except Exception as exc:  # noqa: BLE001 - the loop survives it too
        return _failure(exc, state)
    return None


def _failure(exc: Exception, state: LoopState) -> TickFailure:
    text = describe(exc)
    return TickFailure(exc, text, state.failures + 1, repeated=text == state.last_error)


def _safely(check: Callable[[], str | None]) -> str | None:
    """Run a health check; a check that itself fails is an answer too."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 - the engine may be gone
        return describe(exc)


# -- a failed tick's row --------------------------------------------------------------------------

def failed_tick_summary(start: RunStart, error: BaseException, took_s: float,
                        done: TickResult | None = None) -> RunSummary:
    """The ``heartbeat_runs`` row of a tick that raised: status FAILED, counting what it did before it raised
    (``done``: sources sensed, with new data, sensing errors, jobs triggered, runs completed and failed; none
    without it), the message ``tick failed (<kind>): <type>: <first line>`` redacted (one line, URLs cut to
    their host), and the kind in ``stage_timings`` as ``error_kind`` with the events it had recorded (and the
    control table refreshes it made, when any)."""
    kind = kind_of(error)
    done = done or TickResult(run_id=start.run_id, snapshot_ts=start.snapshot_ts)
    return RunSummary(
        run_id=start.run_id, snapshot_ts=start.snapshot_ts, ended_ts=utcnow(), duration_s=round(took_s, 4),
        sources_sensed=len(done.sensed), sources_with_new_data=done.sources_with_new_data,
        sensor_errors=len(done.sensor_errors), jobs_triggered=len(done.triggered),
        jobs_completed=len(done.completed), jobs_failed=len(done.failed), trigger_errors=len(done.trigger_errors),
        status=TickStatus.FAILED,
        message=redact(f"tick failed ({kind}): {describe(error)}"),
        stage_timings=json.dumps({"error_kind": kind, "events_written": done.events_written,
                                  **({CONTROL_REFRESHES: done.refresh_paths()} if done.refreshes else {})}),
    )


def record_failed_tick(store: TableStore, start: RunStart, error: BaseException, took_s: float,
                       done: TickResult | None = None) -> bool:
    """Append the FAILED row of a tick that raised, with what it did (``done``); never raises. False (logged)
    when the row could not be written (the store is unreachable: the error that failed the tick is the one to
    report)."""
    try:
        store.append_run(failed_tick_summary(start, error, took_s, done), [])
    except Exception as exc:  # noqa: BLE001 - any engine error: the run goes on
        log.warning("could not record failed tick %s in heartbeat_runs: %s", start.run_id, describe(exc))
        return False
    return True
