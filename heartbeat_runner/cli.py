"""Command line: ``python -m heartbeat_runner [COMMAND] [OPTIONS]`` (alias ``heartbeat``).

Without a command it runs one tick. Exit codes: 0 ok (also when the tick was skipped
because another runner holds the tick lease); 1 error (bad config, engine or dbt
failure: nothing was changed); 2 the tick ran but some source or job API call failed
(the others were processed; see ``runs`` and the run report); 3 ``run --loop`` stopped
because the lakehouse itself is unusable (Heartbeat's own tables are gone or unreadable).
A loop survives any other failing tick: it logs the error, backs off and goes on.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable

from heartbeat_runner import __version__
from heartbeat_runner.app import App, open_app
from heartbeat_runner.config import load_config
from heartbeat_runner.errors import ConfigError, HeartbeatError, describe
from heartbeat_runner.jobs.policy import load_retry_policies
from heartbeat_runner.lease import Lease, LeaseHeld, tick_lease
from heartbeat_runner.operations import (
    DEFAULT_MAX_REMOVAL_SHARE,
    ResetPlan,
    check_removals,
    explain,
    parse_since,
    plan_reset,
    recent_runs,
    refresh_if_idle,
    retry_outlook,
    run_details,
)
from heartbeat_runner.output import STATUS_COLUMNS, emit, emit_json
from heartbeat_runner.records import Event, EventType, JobStatus, utcnow
from heartbeat_runner.settings import Settings, load_settings
from heartbeat_runner.tick import TickResult

EXPLAIN_COLUMNS = ["sensor_source", "sensor_id", "dependency", "status", "row_state", "last_evaluated_at",
                   "last_outcome"]
RUNS_COLUMNS = ["run_id", "snapshot_ts", "duration_s", "status", "sources_sensed", "sources_with_new_data",
                "sources_skipped", "sensor_errors", "jobs_triggered", "jobs_completed", "jobs_failed", "message"]
REPORT_COLUMNS = ["source_key", "outcome", "window_from", "window_until", "rows", "duration_s", "trigger_job_ids",
                  "error"]
#: Seconds a command waits for the tick lease before giving up (HEARTBEAT_LEASE_WAIT).
DEFAULT_LEASE_WAIT_S = 30.0
#: Exit code of ``run --loop`` when the lakehouse itself is unusable.
EXIT_LAKEHOUSE_UNUSABLE = 3
#: After failed ticks the loop waits interval x 2^(failures-1), at least this long and at most MAX_BACKOFF_S.
MIN_BACKOFF_S = 1.0
MAX_BACKOFF_S = 300.0


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lakehouse-dir", help="where the embedded lakehouse lives (default $HEARTBEAT_HOME or ./.heartbeat)")
    parser.add_argument("--target", choices=["local", "spark", "databricks"], help="engine (default $HEARTBEAT_TARGET or local)")
    parser.add_argument("--config", help="sensor config CSV (default seeds/heartbeat_sensor_config.csv)")
    parser.add_argument("--jobs-file", help="local jobs file (default ./heartbeat_jobs.yml)")
    parser.add_argument("--jobs-backend", choices=["local", "databricks"], help="where jobs run")
    parser.add_argument("--trigger-dir", help="base folder of trigger_file sources (default <lakehouse>/triggers)")
    parser.add_argument("--sources-file", help="connection settings for kafka/sap/jdbc (heartbeat_sources.yml)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")


def build_parser() -> argparse.ArgumentParser:
    top_level = argparse.ArgumentParser(add_help=False)
    _common(top_level)
    # Subcommands take the same options; SUPPRESS keeps their defaults from overwriting
    # options given before the subcommand (`heartbeat --target databricks run`).
    common = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    _common(common)
    parser = argparse.ArgumentParser(prog="heartbeat", description=__doc__.split("\n")[0], parents=[top_level],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"heartbeat {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    run = sub.add_parser("run", parents=[common], help="run one tick (default), or keep ticking with --loop")
    run.add_argument("--loop", action="store_true", help="tick continuously until Ctrl-C / SIGTERM")
    run.add_argument("--interval", type=float, default=60.0, help="seconds between tick starts in --loop (default 60)")
    run.add_argument("--replay-new-sensors", action="store_true",
                     help="a brand-new sensor replays its source from the beginning (default: starts at its current end)")
    run.add_argument("--wait-lease", type=float, metavar="SECONDS",
                     help="wait this long for another runner's tick to end, then skip (default $HEARTBEAT_LEASE_WAIT or 30)")
    seed = sub.add_parser("seed", parents=[common], help="validate the config CSV and load it (dbt seed + build)")
    seed.add_argument("--allow-removals", action="store_true",
                      help="load even if it retires more than $HEARTBEAT_MAX_REMOVAL_SHARE (default 0.5) of the active rows")
    sub.add_parser("validate", parents=[common], help="check the config CSV; write nothing")
    sub.add_parser("status", parents=[common], help="the control table")
    for name, text in (("pause", "stop sensing and triggering a job"), ("resume", "undo pause")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("--job-id", required=True)
    complete = sub.add_parser("complete", parents=[common],
                              help="record that a job finished (the job's final 'update status' task)")
    complete.add_argument("--job-id", required=True)
    complete.add_argument("--failed", action="store_true", help="record a failure instead of a success")
    complete.add_argument("--run-id", help="the job run id (default $HEARTBEAT_JOB_RUN_ID)")
    complete.add_argument("--message", help="a note stored with the event")
    runs = sub.add_parser("runs", parents=[common], help="recent runs, or one run's per-source report")
    runs.add_argument("--limit", type=int, default=20, help="how many runs (default 20)")
    runs.add_argument("--run-id", help="show this run's per-source rows (window, outcome, error or skip reason)")
    explain_cmd = sub.add_parser("explain", parents=[common], help="why a job did or did not trigger")
    explain_cmd.add_argument("--job-id", required=True)
    reset = sub.add_parser("reset", parents=[common],
                           help="re-process a job from a point in time (moves its sources' cursors back)")
    reset.add_argument("--job-id", required=True)
    reset.add_argument("--since", help="ISO date or timestamp (UTC unless it has a zone); default: from the beginning")
    reset.add_argument("--reason", required=True, help="why (kept in the audit event with who ran it)")
    maintain = sub.add_parser("maintain", parents=[common],
                              help="archive events the control table no longer needs, compact and vacuum now")
    maintain.add_argument("--compact-all", action="store_true", help="compact every table, not only those with many files")
    sub.add_parser("rebuild", parents=[common],
                   help="re-derive the control table from every event ever recorded (hot log and archive)")
    dbt = sub.add_parser("dbt", parents=[common], help="run a dbt command inside the engine, e.g. `dbt test`")
    dbt.add_argument("dbt_args", nargs=argparse.REMAINDER)
    serve = sub.add_parser("serve", parents=[common],
                           help="keep the embedded engine running so plain `dbt` commands work locally")
    serve.add_argument("--port", type=int, default=15002, help="Spark Connect port (default 15002)")
    demo = sub.add_parser("demo", parents=[common], help="a self-contained demo on the embedded lakehouse")
    demo.add_argument("--keep", action="store_true", help="keep an existing demo lakehouse instead of starting afresh")
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        lakehouse_dir=args.lakehouse_dir, target=args.target, config_csv=args.config, jobs_file=args.jobs_file,
        trigger_dir=args.trigger_dir, sources_file=args.sources_file, jobs_backend=args.jobs_backend,
    )


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = args.command or "run"
    handler: Callable[[argparse.Namespace, Settings], int] = COMMANDS[command]
    try:
        settings = _settings(args)
        if command == "run" and getattr(args, "replay_new_sensors", False):
            settings = settings.with_(replay_new_sensors=True)
        return handler(args, settings)
    except ConfigError as exc:
        print("Invalid configuration; nothing was written:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return 1
    except (HeartbeatError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    except Exception:  # noqa: BLE001 - an engine or library failure: show it whole, nothing was half-done
        print("error: the command failed unexpectedly:", file=sys.stderr)
        traceback.print_exc()
        return 1


def _progress(args: argparse.Namespace) -> Callable[[str], None]:
    def report(message: str) -> None:
        if not args.json:
            print(f"  … {message}", file=sys.stderr, flush=True)
    return report


# -- commands ------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace, settings: Settings) -> int:
    config = load_config(settings.effective_config_csv)
    jobs = sorted({r.trigger_job_id for r in config.rows})
    if args.json:
        emit_json({"file": str(config.path), "rows": len(config.rows), "jobs": jobs, "valid": True,
                   "defaulted_columns": list(config.defaulted_columns)})
    else:
        print(f"{config.path}: {len(config.rows)} row(s), {len(jobs)} job(s): valid")
        if config.defaulted_columns:
            print(f"  columns not in the file, defaults used: {', '.join(config.defaulted_columns)}")
    return 0


def cmd_seed(args: argparse.Namespace, settings: Settings) -> int:
    config = load_config(settings.effective_config_csv)  # validate before touching anything
    retiring: list[tuple[str, str, str]] = []
    with tick_lease(settings.lakehouse_dir).held(_lease_wait(args)), open_app(settings) as app:
        normalized = config.to_csv()
        unchanged = app.dbt.has_seed and app.dbt.seed_csv.read_text(encoding="utf-8") == normalized \
            and app.store.exists("heartbeat_control")
        if unchanged:
            app.ensure_views()
            message = f"{config.path}: unchanged ({len(config.rows)} rows); nothing to load"
        else:
            if app.store.exists("heartbeat_control"):
                active = [(r["sensor_source"], r["sensor_id"], r["trigger_job_id"]) for r in app.store.control_rows()]
                share = 1.0 if args.allow_removals else float(
                    os.environ.get("HEARTBEAT_MAX_REMOVAL_SHARE", DEFAULT_MAX_REMOVAL_SHARE))
                retiring = check_removals(active, [r.key for r in config.rows], share)
            app.load_config(config, progress=_progress(args))
            message = f"{config.path}: loaded {len(config.rows)} row(s)"
        if args.json:
            emit_json({"file": str(config.path), "rows": len(config.rows), "changed": not unchanged,
                       "retired": [list(key) for key in retiring]})
        else:
            print(message)
            for source, sensor_id, job in retiring:
                print(f"  retired: {source}:{sensor_id} -> job {job} (its history is kept)")
            if config.defaulted_columns:
                print(f"  columns not in the file, defaults used: {', '.join(config.defaulted_columns)}")
    return 0


def _lease_wait(args: argparse.Namespace) -> float:
    flag = getattr(args, "wait_lease", None)
    return flag if flag is not None else float(os.environ.get("HEARTBEAT_LEASE_WAIT", DEFAULT_LEASE_WAIT_S))


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    lease = tick_lease(settings.lakehouse_dir)
    try:
        lease.acquire(_lease_wait(args))  # held from start-up: building the views writes too
    except LeaseHeld as exc:
        _print_skipped(exc, args)
        return 0
    try:
        with open_app(settings) as app:
            heartbeat = app.heartbeat(progress=_progress(args))
            heartbeat.before_trigger = lease.renew
            try:
                if not getattr(args, "loop", False):
                    result = heartbeat.tick()
                    _print_tick(result, args)
                    return result.exit_code
                lease.release()
                app.dbt.manifest()  # parse the dbt project now, not when the first new data arrives
                return _loop(lambda: _leased_tick(lease, heartbeat.tick, args), args, app.lakehouse_problem)
            finally:
                heartbeat.close()  # the summary of a pending streak of idle ticks
    finally:
        lease.release()


def _leased_tick(lease: Lease, tick: Callable[[], TickResult], args: argparse.Namespace) -> TickResult | None:
    """One tick under the lease, or None (skipped) when another runner holds it."""
    try:
        with lease.held(_lease_wait(args)):
            return tick()
    except LeaseHeld as exc:
        _print_skipped(exc, args)
        return None


def _print_skipped(exc: LeaseHeld, args: argparse.Namespace) -> None:
    if args.json:
        emit_json({"skipped": True, "lease_owner": exc.holder.owner, "lease_expires_at": exc.holder.expires_at})
    else:
        print(f"skipped: {exc}", file=sys.stderr, flush=True)


def _loop(tick: Callable[[], TickResult | None], args: argparse.Namespace,
          lakehouse_problem: Callable[[], str | None]) -> int:
    """Tick every ``args.interval`` seconds until SIGINT/SIGTERM.

    A failing tick never ends the loop: its error is logged (with the traceback the first
    time it is seen), the loop backs off and ticks again. It stops early only when the
    lakehouse itself is unusable, with EXIT_LAKEHOUSE_UNUSABLE.
    """
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    ticks, failures, last_error = 0, 0, ""
    while not stop.is_set():
        started = time.monotonic()
        try:
            result = tick()
            if result is not None:
                _print_tick(result, args)
            failures, last_error = 0, ""
        except Exception as exc:  # noqa: BLE001 - the loop survives any single tick
            failures += 1
            last_error = _report_failed_tick(exc, last_error, failures)
            problem = _safely(lakehouse_problem)
            if problem is not None:
                print(f"stopping: the lakehouse is unusable ({problem}); exit code {EXIT_LAKEHOUSE_UNUSABLE}",
                      file=sys.stderr, flush=True)
                return EXIT_LAKEHOUSE_UNUSABLE
        ticks += 1
        wait = args.interval if not failures else min(MAX_BACKOFF_S, max(MIN_BACKOFF_S, args.interval)
                                                      * 2 ** (failures - 1))
        stop.wait(max(0.0, wait - (time.monotonic() - started)))
    if not args.json:
        print(f"stopped after {ticks} tick(s)")
    return 0


def _report_failed_tick(exc: Exception, last_error: str, failures: int) -> str:
    """Log a failed tick: the whole traceback for a new error, one line when it repeats. Returns its text."""
    text = describe(exc)
    if text != last_error:
        print(f"tick failed: {text}", file=sys.stderr)
        if not isinstance(exc, HeartbeatError):
            traceback.print_exception(exc)
    else:
        print(f"tick failed again ({failures} in a row): {text}", file=sys.stderr)
    sys.stderr.flush()
    return text


def _safely(check: Callable[[], str | None]) -> str | None:
    """Run a health check; a check that itself fails is an answer too."""
    try:
        return check()
    except Exception as exc:  # noqa: BLE001 - the engine may be gone
        return describe(exc)


def _print_tick(result: TickResult, args: argparse.Namespace) -> None:
    if args.json:
        emit_json(result.as_dict())
        return
    print(f"run {result.run_id}: sensed {len(result.sensed)} source(s), {result.sources_with_new_data} with new data, "
          f"{len(result.sensor_errors)} error(s), {len(result.skipped)} skipped; triggered {len(result.triggered)}, "
          f"completed {len(result.completed)}, failed {len(result.failed)} ({result.duration_s:.2f}s)", flush=True)
    for s in result.sensor_errors:
        print(f"  source {s.target.source_key}: {s.error}", flush=True)
    for triggered in result.triggered:
        print(f"  triggered job {triggered.job_id} (run {triggered.run_id})", flush=True)
    for problem in result.trigger_errors + result.overdue:
        print(f"  job {problem}", flush=True)
    for job_id in result.retried:
        print(f"  retried job {job_id} (retry policy)", flush=True)


def _open_fresh(app: App, settings: Settings) -> None:
    """Ready to read the views: rebuilt unless a runner is ticking (then as of its last build)."""
    app.require_config()
    app.ensure_views()
    if not refresh_if_idle(app, tick_lease(settings.lakehouse_dir)):
        print("note: a runner is ticking; showing the control table as of its last build", file=sys.stderr)


def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    with open_app(settings) as app:
        _open_fresh(app, settings)
        rows = app.store.control_rows()
        emit(rows, STATUS_COLUMNS if not args.json else list(rows[0].keys()) if rows else STATUS_COLUMNS,
             as_json=args.json)
    return 0


def _record_job_event(settings: Settings, job_id: str, kind: EventType, **fields) -> None:
    """Append one job-level event, after checking the job is in the control table."""
    with open_app(settings) as app:
        app.require_config()
        if not app.store.control_rows(job_id):
            raise HeartbeatError(f"job {job_id!r} is not in the control table")
        app.store.append_events([Event(event_type=kind, run_id=kind.value.lower(), snapshot_ts=utcnow(),
                                       trigger_job_id=job_id, **fields)])


def cmd_pause(args: argparse.Namespace, settings: Settings) -> int:
    _record_job_event(settings, args.job_id, EventType.JOB_PAUSED)
    print(f"job {args.job_id} paused (until `resume` or the next seed)")
    return 0


def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    _record_job_event(settings, args.job_id, EventType.JOB_RESUMED)
    print(f"job {args.job_id} resumed")
    return 0


def cmd_complete(args: argparse.Namespace, settings: Settings) -> int:
    kind = EventType.FAILED if args.failed else EventType.COMPLETED
    run_id = args.run_id or os.environ.get("HEARTBEAT_JOB_RUN_ID")
    _record_job_event(settings, args.job_id, kind, job_run_id=run_id, message=args.message)
    print(f"job {args.job_id}: recorded {kind.value}")
    return 0


def cmd_runs(args: argparse.Namespace, settings: Settings) -> int:
    with open_app(settings) as app:
        app.require_config()
        app.ensure_views()
        if not args.run_id:
            emit(recent_runs(app.store, args.limit), RUNS_COLUMNS, as_json=args.json)
            return 0
        run, report = run_details(app.store, args.run_id)
        if args.json:
            emit_json({"run": run, "sources": report})
            return 0
        print(f"run {run['run_id']} at {run['snapshot_ts']:%Y-%m-%d %H:%M:%S}: {run['status']}"
              + (f" ({run['message']})" if run["message"] else ""))
        emit(report, REPORT_COLUMNS, as_json=False)
    return 0


def cmd_explain(args: argparse.Namespace, settings: Settings) -> int:
    with open_app(settings) as app:
        _open_fresh(app, settings)
        found = explain(app.store, args.job_id)
        retry = retry_outlook(app.store, load_retry_policies(settings.retry_policy_file), args.job_id)
    if args.json:
        emit_json({"job_id": found.job_id, "verdict": found.verdict, "ready": found.is_ready, "rows": found.rows,
                   "automatic_retry": retry})
        return 0
    print(f"job {found.job_id}: {found.verdict}")
    if retry:
        print(f"automatic retry: {retry}")
    emit(found.rows, EXPLAIN_COLUMNS, as_json=False)
    return 0


def cmd_reset(args: argparse.Namespace, settings: Settings) -> int:
    since = parse_since(args.since) if args.since else None
    with tick_lease(settings.lakehouse_dir).held(_lease_wait(args)), open_app(settings) as app:
        app.require_config()
        app.ensure_views()
        app.dbt.refresh_control(app.store.events_version())
        running = [r["job_run_id"] for r in app.store.control_rows(args.job_id)
                   if r["status"] == JobStatus.IN_PROGRESS]
        plan = plan_reset(app.store, args.job_id, since, args.reason)
        app.store.append_events(plan.events())
    _print_reset(plan, running[0] if running else None, args)
    return 0


def _print_reset(plan: ResetPlan, running_run: str | None, args: argparse.Namespace) -> None:
    if args.json:
        emit_json({"job_id": plan.job_id, "since": plan.since, "as_of": plan.as_of, "by": plan.by,
                   "reason": plan.reason, "also_retriggers": plan.shared_with, "running_run": running_run,
                   "cursors": [{"source_key": m.source_key, "from": m.cursor_from, "to": m.cursor_to}
                               for m in plan.moves]})
        return
    point = f"since {plan.as_of:%Y-%m-%d %H:%M:%S.%f} UTC" if plan.as_of else "from the beginning"
    print(f"job {plan.job_id} reset {point} by {plan.by}: {plan.reason}")
    print("  it is sensed again from the next tick and triggers once its hard dependencies have data to re-process")
    for move in plan.moves:
        change = f"-> {move.cursor_to}" if move.moved else "(unchanged: nothing was sensed after that point)"
        print(f"  {move.source_key}: cursor {move.cursor_from or '-'} {change}")
    if plan.since and plan.as_of != plan.since:
        print("  (earlier than --since: the job had not consumed data sensed before it yet)")
    if plan.shared_with:
        print(f"  also re-triggered, as they read the same sources: {', '.join(plan.shared_with)}")
    if running_run:
        print(f"  note: run {running_run} of this job is still going; reset does not stop it")


def cmd_maintain(args: argparse.Namespace, settings: Settings) -> int:
    with tick_lease(settings.lakehouse_dir).held(_lease_wait(args)), open_app(settings) as app:
        app.require_config()
        app.ensure_views()
        app.dbt.refresh_control(app.store.events_version())  # the live set is judged on current state
        maintenance = app.maintenance(_progress(args))
        with app.dbt.keeping_built_marker(app.store.events_version):
            done = maintenance.run(compact_all=args.compact_all)
    if args.json:
        emit_json(done.as_dict())
        return 0
    print(f"archived {done.archived_events} event(s), {done.archived_runs} run summary row(s) and "
          f"{done.archived_report_rows} report row(s) in {done.duration_s:.1f}s")
    if done.deleted_by_retention:
        print(f"deleted {done.deleted_by_retention} archived row(s) past HEARTBEAT_ARCHIVE_RETENTION_DAYS")
    for table, (before, after) in done.compacted.items():
        print(f"  {table}: {before} -> {after} data file(s)")
    return 0


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    with tick_lease(settings.lakehouse_dir).held(_lease_wait(args)), open_app(settings) as app:
        app.require_config()
        app.ensure_views()
        _progress(args)("re-deriving the control table from the hot log and the archive")
        app.dbt.rebuild_from_all_events()
        app.dbt.mark_built(app.store.events_version())
        rows = len(app.store.control_rows(include_retired=True))
    print(f"rebuilt the control table from every recorded event ({rows} row(s))")
    return 0


def cmd_dbt(args: argparse.Namespace, settings: Settings) -> int:
    if not args.dbt_args:
        raise HeartbeatError("usage: python -m heartbeat_runner dbt <dbt command and options>, e.g. `dbt test`")
    with open_app(settings) as app:
        if app.store.exists("heartbeat_control"):
            app.ensure_views()
        app.dbt.invoke(list(args.dbt_args), quiet=False)
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from heartbeat_runner.serve import prepare_environment, serve, session_id_for

    prepare_environment()
    with open_app(settings, port=args.port, session_id=session_id_for(settings)) as app:
        serve(app, args.port)
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from heartbeat_runner.demo import run_demo

    return run_demo(settings, keep=args.keep, as_json=args.json)


COMMANDS: dict[str, Callable[[argparse.Namespace, Settings], int]] = {
    "run": cmd_run,
    "seed": cmd_seed,
    "validate": cmd_validate,
    "status": cmd_status,
    "runs": cmd_runs,
    "explain": cmd_explain,
    "reset": cmd_reset,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "complete": cmd_complete,
    "maintain": cmd_maintain,
    "rebuild": cmd_rebuild,
    "dbt": cmd_dbt,
    "demo": cmd_demo,
    "serve": cmd_serve,
}
