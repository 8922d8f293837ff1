"""Command line: ``python -m heartbeat_runner [COMMAND] [OPTIONS]`` (alias ``heartbeat``).

Without a command it runs one tick. Exit codes: 0 ok (also when the tick was skipped
because another runner holds the tick lease); 1 error (bad config, engine or dbt
failure: nothing was changed); 2 the tick ran but some source or job API call failed
(the others were processed; see ``runs`` and the run report); 3 ``run --loop`` stopped
because the lakehouse itself is unusable (Heartbeat's own tables are gone or unreadable).
A loop survives any other failing tick: it logs the error, backs off and goes on. Every tick leaves
a row in ``runs``, a failed one too (status FAILED, with its error).
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import functools
import gc
import logging
import math
import os
import pwd
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime, timezone

from rich.text import Text

from heartbeat_runner import __version__
from heartbeat_runner.core.errors import ConfigError, HeartbeatError, InvalidInputError
from heartbeat_runner.core.logs import secret_values, use_json_logs
from heartbeat_runner.core.metrics import serve_metrics
from heartbeat_runner.core.records import EventType
from heartbeat_runner.core.settings import TARGETS, JobsBackendKind, LogFormat, Settings, Target, load_settings
from heartbeat_runner.engines.engine_errors import engine_failures
from heartbeat_runner.interfaces.operations import (
    ResetPlan,
    ask_retry,
    ask_trigger,
    check_removals,
    control_refreshes,
    explain,
    late_data,
    latest_job_runs,
    parse_since,
    pending_ask,
    recent_runs,
    record_job_event,
    refresh_if_idle,
    reset_job,
    retry_outlook,
    run_details,
    runner_health,
    trigger_hold,
    with_job_runs,
    with_runner_health,
    with_sensing_errors,
    with_trigger_holds,
)
from heartbeat_runner.interfaces.outcomes import outcome_of
from heartbeat_runner.interfaces.output import (
    STATE_STYLES,
    STATUS_COLUMNS,
    Column,
    Fit,
    LiveLine,
    Snapshot,
    Steps,
    compact_table,
    console_for,
    cut_line,
    emit,
    emit_json,
    fit_width,
    fits_width,
    print_lines,
    short_time,
    show_times_in,
    timestamp,
    watch,
    watch_lines,
)
from heartbeat_runner.interfaces.status_view import OnCall, health_line, on_call, render
from heartbeat_runner.policies.event_windows import source_grains
from heartbeat_runner.policies.run_policies import RunPolicies, alert_destination_problems, load_run_policies
from heartbeat_runner.policies.run_policy_file import missing_file_problem, policy_problem
from heartbeat_runner.runner.alerting import Liveness, idle_sensing
from heartbeat_runner.runner.app import App, open_app
from heartbeat_runner.runner.lease import LeaseHeld, tick_lease
from heartbeat_runner.runner.loop import RunConfig, TickFailure, run_forever, run_once
from heartbeat_runner.runner.tick_result import TickResult
from heartbeat_runner.runner.wake_endpoint import check_wake_token
from heartbeat_runner.sensing.config import LoadedConfig, load_config
from heartbeat_runner.sensing.sources.registry import source_for

log = logging.getLogger(__name__)

EXPLAIN_COLUMNS = ["sensor_source", "sensor_id", "dependency", "status", "row_state", "last_evaluated_at",
                   "last_outcome"]
RUNS_COLUMNS = ["run_id", "snapshot_ts", "duration_s", "status", "sources_sensed", "sources_with_new_data",
                "sources_skipped", "sensor_errors", "jobs_triggered", "jobs_completed", "jobs_failed", "message"]
SEQUENCE_COLUMNS = ["trigger_job_id", "run", "runs", "last_lifecycle_event", "next_run_due", "windows"]
REPORT_COLUMNS = ["source_key", "outcome", "window_from", "window_until", "rows", "duration_s", "trigger_job_ids",
                  "error"]
#: Seconds between tables of ``status --watch`` without a value.
DEFAULT_WATCH_S = 5.0
#: The most rows a listing flag (``runs --limit``) asks for, and the longest wait a seconds flag takes (a day).
MAX_LIMIT = 100_000
MAX_SECONDS = 86_400.0
#: a command: its exit code
Command = Callable[[argparse.Namespace, Settings], int]
#: Commands that may start a lakehouse in a folder that does not exist yet; every other command needs one.
CREATING_COMMANDS = frozenset({"seed", "run", "demo", "serve", "dbt", "validate"})


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lakehouse-dir", help="where the embedded lakehouse lives (default $HEARTBEAT_HOME or ./.heartbeat)")
    parser.add_argument("--target", choices=list(TARGETS), help="engine (default $HEARTBEAT_TARGET or local)")
    parser.add_argument("--config", help="sensor config CSV (default seeds/heartbeat_sensor_config.csv)")
    parser.add_argument("--jobs-file", help="local jobs file (default ./heartbeat_jobs.yml)")
    parser.add_argument("--jobs-backend", help=f"where jobs run: {', '.join(k.value for k in JobsBackendKind)} or an "
                        "installed plugin's name (default $HEARTBEAT_JOBS_BACKEND; databricks on that target, else local)")
    parser.add_argument("--trigger-dir", help="base folder of trigger_file sources (default <lakehouse>/triggers)")
    parser.add_argument("--sources-file", help="connection settings for kafka/sap/jdbc (heartbeat_sources.yml)")
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    parser.add_argument("-v", "--verbose", action="store_true", help="log details")
    parser.add_argument("--log-format", choices=[f.value for f in LogFormat],
                        help="log lines as text or one JSON object per line (default $HEARTBEAT_LOG_FORMAT or text)")


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
    run.add_argument("--interval", type=_non_negative_seconds, default=60.0,
                     help="seconds between tick starts in --loop (default 60)")
    run.add_argument("--wake-port", type=_port, metavar="PORT",
                     help="--loop: serve POST /wake here (needs HEARTBEAT_WAKE_TOKEN; default $HEARTBEAT_WAKE_PORT, off)")
    run.add_argument("--no-wakeups", action="store_true",
                     help="--loop: poll only, no early ticks on file-system notifications or POST /wake")
    run.add_argument("--replay-new-sensors", action="store_true",
                     help="a brand-new sensor replays its source from the beginning (default: starts at its current end)")
    run.add_argument("--wait-lease", type=_non_negative_seconds, metavar="SECONDS",
                     help="wait this long for another runner's tick to end, then skip (default $HEARTBEAT_LEASE_WAIT or 30)")
    _metrics_flags(run, "--loop: ")
    seed = sub.add_parser("seed", parents=[common], help="validate the config CSV and load it (dbt seed + build)")
    seed.add_argument("--allow-removals", action="store_true",
                      help="load even if it retires more than $HEARTBEAT_MAX_REMOVAL_SHARE (default 0.5) of the active rows")
    sub.add_parser("validate", parents=[common], help="check the config CSV and the run-policy file; write nothing")
    status = sub.add_parser("status", parents=[common], help="the control table")
    status.add_argument("--watch", nargs="?", type=_seconds, const=DEFAULT_WATCH_S, metavar="SECONDS",
                        help=f"redraw it every SECONDS (default {DEFAULT_WATCH_S:g}) until Ctrl-C; with --json or "
                             "when not on a terminal, print a fresh one each time")
    status.add_argument("--watch-count", type=_count, help=argparse.SUPPRESS)  # stop after this many (for tests)
    status.add_argument("--wide", action="store_true",
                        help="the whole control table (one row per source and job) instead of one line per job")
    for name, text in (("pause", "stop sensing and triggering a job"), ("resume", "undo pause")):
        p = sub.add_parser(name, parents=[common], help=text)
        p.add_argument("--job-id", required=True)
    complete = sub.add_parser("complete", parents=[common],
                              help="record that a job finished (the job's final 'update status' task)")
    complete.add_argument("--job-id", required=True)
    complete.add_argument("--failed", action="store_true", help="record a failure instead of a success")
    complete.add_argument("--run-id", help="the job run id (default $HEARTBEAT_JOB_RUN_ID)")
    complete.add_argument("--message", help="a note stored with the event")
    retry = sub.add_parser("retry", parents=[common],
                           help="re-run a FAILED job over the data its failed run had (at the next tick, new token)")
    retry.add_argument("--job-id", required=True)
    retry.add_argument("--reason", help="why (kept in the audit event with who ran it)")
    trigger = sub.add_parser("trigger", parents=[common],
                             help="run a job at the next tick, consuming whatever it has pending (or nothing)")
    trigger.add_argument("--job-id", required=True)
    trigger.add_argument("--reason", help="why (kept in the audit event with who ran it)")
    runs = sub.add_parser("runs", parents=[common], help="recent runs, or one run's per-source report")
    runs.add_argument("--limit", type=_count, default=20, help=f"how many runs (default 20, at most {MAX_LIMIT})")
    runs.add_argument("--run-id", help="show this run's per-source rows (window, outcome, error or skip reason)")
    explain_cmd = sub.add_parser("explain", parents=[common], help="why a job did or did not trigger")
    explain_cmd.add_argument("--job-id", required=True)
    reset = sub.add_parser("reset", parents=[common],
                           help="re-process a job from a point in time (moves its sources' cursors back)")
    reset.add_argument("--job-id", required=True)
    reset.add_argument("--since", help="ISO date or timestamp (UTC unless it has a zone); default: from the beginning")
    reset.add_argument("--reason", required=True, help="why (kept in the audit event with who ran it)")
    reset.add_argument("--force", action="store_true",
                       help="reset a job whose run is still going: cancel that run first (refused without it)")
    maintain = sub.add_parser("maintain", parents=[common],
                              help="archive events the control table no longer needs, compact and vacuum now")
    maintain.add_argument("--compact-all", action="store_true", help="compact every table, not only those with many files")
    sub.add_parser("rebuild", parents=[common],
                   help="re-derive the control table from every event ever recorded (hot log and archive)")
    dbt = sub.add_parser("dbt", parents=[common], help="run a dbt command inside the engine, e.g. `dbt test`")
    dbt.add_argument("dbt_args", nargs=argparse.REMAINDER)
    serve = sub.add_parser("serve", parents=[common],
                           help="keep the embedded engine running so plain `dbt` commands work locally")
    serve.add_argument("--port", type=_port, default=15002, help="Spark Connect port (default 15002)")
    _metrics_flags(serve, "")
    ui = sub.add_parser("ui", parents=[common], help="the status page (overview, graph, job pages, ticks)")
    ui.add_argument("--port", type=_port, default=None,
                    help="port (default 8080; in a Databricks App, $DATABRICKS_APP_PORT)")
    ui.add_argument("--host", default=None,
                    help="address to bind (default 127.0.0.1; in a Databricks App, 0.0.0.0 behind its proxy)")
    ui.add_argument("--allow-actions", action="store_true",
                    help="offer pause/resume/complete/retry/trigger/reset on job pages (each confirmed and audited)")
    ui.add_argument("--refresh", type=_seconds, default=5.0, help="seconds between the page's refreshes (default 5)")
    demo = sub.add_parser("demo", parents=[common], help="a self-contained demo on the embedded lakehouse")
    demo.add_argument("--keep", action="store_true", help="keep an existing demo lakehouse instead of starting afresh")
    _alert_parsers(sub, common)
    return parser


def _seconds(text: str) -> float:
    """A positive number of seconds (an argparse type)."""
    value = _number(text)
    if value is None or not 0 < value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds (at most {MAX_SECONDS:g})")
    return value


def _non_negative_seconds(text: str) -> float:
    """Zero or a positive number of seconds (an argparse type)."""
    value = _number(text)
    if value is None or not 0 <= value <= MAX_SECONDS:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds from 0 to {MAX_SECONDS:g}")
    return value


def _count(text: str) -> int:
    """A whole number from 1 to MAX_LIMIT (an argparse type)."""
    value = _whole(text)
    if value is None or not 1 <= value <= MAX_LIMIT:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number from 1 to {MAX_LIMIT}")
    return value


def _port(text: str) -> int:
    """A TCP port, 0 (any free one) to 65535 (an argparse type)."""
    value = _whole(text)
    if value is None or not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port (0 to 65535)")
    return value


def _fixed_port(text: str) -> int:
    """A TCP port a scraper must know in advance, 1 to 65535 (an argparse type): 0 would bind a port nobody
    can find, so it is refused as HEARTBEAT_METRICS_PORT=0 is."""
    value = _whole(text)
    if value is None or not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port a scraper can reach (1 to 65535)")
    return value


def _number(text: str) -> float | None:
    """``text`` as a finite float, or None."""
    try:
        value = float(text)
    except (ValueError, OverflowError):
        return None
    return value if math.isfinite(value) else None


def _whole(text: str) -> int | None:
    """``text`` as a whole number, or None."""
    try:
        return int(text)
    except ValueError:
        return None


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(
        lakehouse_dir=args.lakehouse_dir, target=args.target, config_csv=args.config, jobs_file=args.jobs_file,
        trigger_dir=args.trigger_dir, sources_file=args.sources_file, jobs_backend=args.jobs_backend,
    )


def main(argv: list[str] | None = None) -> int:
    """Run one command and return its exit code.

    Invariant: no command prints a traceback because its reader went away (``… | head -1``): when
    stdout's pipe closes, the rest of the output goes to devnull and the command ends quietly with 0
    (Python's documented SIGPIPE recipe; what ``head`` users expect).

    Called without ``argv`` (as the program: ``python -m heartbeat_runner``, ``heartbeat``) the process
    ends next, so the objects it made are frozen out of the interpreter's last garbage collection (a
    pass over every object dbt and PySpark loaded: ~1 s of a cold tick). Exit handlers still run and
    every file and table was closed by the command; only that pass is skipped. A caller passing
    ``argv`` (a test, an embedding program) keeps its collector as it was.
    """
    try:
        code = _main(argv)
        sys.stdout.flush()  # inside the try: a pipe closed after the last write breaks here, not at exit
    except BrokenPipeError:
        _discard_stdout()
        code = 0
    if argv is None:
        gc.freeze()
    return code


def _discard_stdout() -> None:
    """Point stdout at devnull, so the interpreter's own flush at exit finds no closed pipe."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is no real file (a test's capture): nothing is flushed to a pipe
        pass
    finally:
        os.close(devnull)


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=_CurrentStderr(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    command = args.command or "run"
    handler: Command = COMMANDS[command]
    try:
        settings = _settings(args)
        _log_format(args, settings)
        show_times_in(settings.timezone)
        if command == "run" and getattr(args, "replay_new_sensors", False):
            settings = settings.with_(replay_new_sensors=True)
        _check_lakehouse_dir(command, settings)
        with engine_failures():  # a dead engine's failure becomes its cause's error (engine_errors)
            return handler(args, settings)
    except ConfigError as exc:
        if args.json:
            emit_json({"valid": False, "problems": exc.problems})
        print("Invalid configuration; nothing was written:", file=sys.stderr)
        for problem in exc.problems:
            print(f"  {problem}", file=sys.stderr)
        return outcome_of(exc).exit_code
    except BrokenPipeError:
        raise  # the reader went away: main ends quietly
    except (HeartbeatError, ValueError) as exc:
        if args.json:
            emit_json({"error": str(exc)})
        print(f"error: {exc}", file=sys.stderr)
        return outcome_of(exc).exit_code
    except KeyboardInterrupt:
        return 130
    except PermissionError as exc:  # a file or folder the user running this may not read or write: say which
        message = f"{exc.strerror or 'permission denied'}: {exc.filename} ({_who_runs()} may not use it)"
        if args.json:
            emit_json({"error": message})
        print(f"error: {message}", file=sys.stderr)
        return outcome_of(exc).exit_code
    except Exception as exc:  # noqa: BLE001 - an engine or library failure: show it whole, nothing was half-done
        print("error: the command failed unexpectedly:", file=sys.stderr)
        traceback.print_exc()
        return outcome_of(exc).exit_code


def _who_runs() -> str:
    """The OS user this process runs as, as an error names it (its id where the system has no name for it)."""
    try:
        return f"user {pwd.getpwuid(os.geteuid()).pw_name}"
    except KeyError:
        return f"user id {os.geteuid()}"


def _log_format(args: argparse.Namespace, settings: Settings) -> None:
    """``--log-format``, else HEARTBEAT_LOG_FORMAT: JSON lines from now on when it says so (core/logs.py)."""
    chosen = LogFormat(args.log_format) if getattr(args, "log_format", None) else settings.log_format
    if chosen is LogFormat.JSON:
        use_json_logs(secret_values(os.environ))


def _check_lakehouse_dir(command: str, settings: Settings) -> None:
    """The lakehouse folder is a folder, and exists unless ``command`` may start one: a mistyped
    ``--lakehouse-dir`` is an error that creates nothing, not a new empty lakehouse."""
    path = settings.lakehouse_dir
    if path.exists() and not path.is_dir():
        raise HeartbeatError(f"the lakehouse {path} is a file, not a folder (check --lakehouse-dir / $HEARTBEAT_HOME)")
    if command not in CREATING_COMMANDS and settings.lakehouse_in_folder and not path.is_dir():
        raise HeartbeatError(f"no lakehouse at {path}; nothing was created (check --lakehouse-dir / "
                             "$HEARTBEAT_HOME, or run `seed` to make one there)")


class _CurrentStderr:
    """stderr as it is at each write: log lines then go above a progress bar or live line, not through it."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


def _progress(args: argparse.Namespace, total: int | None = None) -> Steps:
    """Steps of a command on stderr: a spinner (and a bar over ``total``) on a terminal, else ``  … step`` lines."""
    return Steps(total, quiet=args.json)


# -- commands ------------------------------------------------------------------------------

def cmd_validate(args: argparse.Namespace, settings: Settings) -> int:
    """Check the config CSV and the run-policy file together (every problem of both); write nothing."""
    config, policies = _checked_config(settings)
    jobs = sorted({r.trigger_job_id for r in config.rows})
    unknown = policies.unknown_jobs(jobs)
    untimed = _windows_without_event_times(config, policies)
    policy_file = settings.run_policy_file
    if args.json:
        emit_json({"file": str(config.path), "rows": len(config.rows), "jobs": jobs, "valid": True,
                   "defaulted_columns": list(config.defaulted_columns),
                   "run_policies": {"file": str(policy_file) if policy_file else None,
                                    "exists": bool(policy_file and policy_file.exists()),
                                    "retry": sorted(policies.retry.jobs), "catch_up": sorted(policies.catch_up),
                                    "window": sorted(policies.windows), "unknown_jobs": unknown,
                                    "trigger": sorted(policies.trigger.jobs), "pools": dict(policies.trigger.pools),
                                    "window_sources_without_event_times": untimed,
                                    "alerts": {"enabled": policies.alerts.enabled, "jobs": sorted(policies.alerts.jobs),
                                               "sources": sorted(policies.alerts.sources),
                                               "destinations": [d.name for d in policies.alerts.destinations]}}})
        return 0
    print(f"{config.path}: {len(config.rows)} row(s), {len(jobs)} job(s): valid")
    if config.defaulted_columns:
        print(f"  columns not in the file, defaults used: {', '.join(config.defaulted_columns)}")
    if policy_file is not None:
        print(f"{policy_file}: {len(policies.retry.jobs)} retry, {len(policies.catch_up)} catch-up and "
              f"{len(policies.windows)} window policy(ies): valid")
        if policies.trigger.enabled or policies.trigger.pools:
            print(f"  trigger shaping: {len(policies.trigger.jobs)} trigger policy(ies), "
                  f"{len(policies.trigger.pools)} pool(s)")
        if policies.alerts.enabled:
            print(f"  alerts: {len(policies.alerts.jobs)} job and {len(policies.alerts.sources)} source override(s), "
                  f"destinations: {', '.join(d.name for d in policies.alerts.destinations) or 'none (lakehouse only)'}")
    for job_id in unknown:
        print(f"  warning: {policy_file} has a policy for job {job_id}, which no config row triggers")
    for problem in untimed:
        print(f"  warning: {problem}")
    return 0


def _windows_without_event_times(config: LoadedConfig, policies: RunPolicies) -> list[str]:
    """Hard sources of jobs with an event-time window policy whose source type reports no event times
    (the ``Source.reports_event_times`` capability): such a job never finalizes a window."""
    return [f"line {r.line}: job {r.trigger_job_id} has a window policy, but {r.sensor_source} sources report no "
            "event times: its windows never become final" for r in config.rows
            if r.dependency_flag and r.trigger_job_id in policies.windows
            and not source_for(r.sensor_source).reports_event_times]


def _checked_config(settings: Settings) -> tuple[LoadedConfig, RunPolicies]:
    """The config CSV and the run policies, checked against each other (window sizes reading one source);
    one ConfigError with every problem found in either."""
    problems: list[str] = []
    config = policies = None
    try:
        config = load_config(settings.effective_config_csv)
    except ConfigError as exc:
        problems += exc.problems
    missing = missing_file_problem(settings.run_policy_file, settings.run_policy_variable)
    try:
        if missing is not None:
            raise ConfigError([missing])  # a configured file that is not there: never "no policies"
        policies = load_run_policies(settings.run_policy_file)
        problems += alert_destination_problems(settings.run_policy_file, policies.alerts)
    except ConfigError as exc:
        problems += exc.problems
    if config is not None and policies is not None:
        try:
            source_grains(policies.windows, [(r.trigger_job_id, r.source_key) for r in config.rows])
        except ConfigError as exc:
            problems += [policy_problem(settings.run_policy_file, "window", p) for p in exc.problems]
    if problems or config is None or policies is None:
        raise ConfigError(problems)
    return config, policies


#: The steps `seed` reports: validating the CSV, opening the lakehouse, dbt seed, dbt build.
SEED_STEPS = 4


def cmd_seed(args: argparse.Namespace, settings: Settings) -> int:
    retiring: list[tuple[str, str, str]] = []
    with _progress(args, SEED_STEPS) as progress:
        progress(f"validating {settings.effective_config_csv.name}")
        config = load_config(settings.effective_config_csv)  # validate before touching anything
        progress(f"opening the lakehouse ({len(config.rows)} valid row(s))")
        with _opened(args, settings, lease=True) as app:
            normalized = config.to_csv()
            unchanged = app.dbt.has_seed and app.dbt.seed_csv.read_text(encoding="utf-8") == normalized \
                and app.store.exists("heartbeat_control")
            if unchanged:
                app.ensure_views()
                message = f"{config.path}: unchanged ({len(config.rows)} rows); nothing to load"
            else:
                if app.store.exists("heartbeat_control"):
                    active = [(r["sensor_source"], r["sensor_id"], r["trigger_job_id"])
                              for r in app.store.control_rows()]
                    share = 1.0 if args.allow_removals else settings.max_removal_share
                    retiring = check_removals(active, [r.key for r in config.rows], share)
                app.load_config(config, progress=progress)  # its two steps: dbt seed, dbt build
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


def _metrics_flags(parser: argparse.ArgumentParser, when: str) -> None:
    parser.add_argument("--metrics-port", type=_fixed_port, metavar="PORT",
                        help=f"{when}serve Prometheus metrics on http://HOST:PORT/metrics (default "
                             "$HEARTBEAT_METRICS_PORT, else none; docs/observability.md)")
    parser.add_argument("--metrics-host", metavar="HOST",
                        help="the address the metrics bind (default $HEARTBEAT_METRICS_HOST or 127.0.0.1)")


def _metrics_address(args: argparse.Namespace, settings: Settings) -> tuple[int | None, str]:
    """``--metrics-port`` / ``--metrics-host``, else the settings' HEARTBEAT_METRICS_PORT / _HOST."""
    port = getattr(args, "metrics_port", None)
    host = getattr(args, "metrics_host", None)
    return (port if port is not None else settings.metrics_port), host or settings.metrics_host


def _lease_wait(args: argparse.Namespace, settings: Settings) -> float:
    """``--wait-lease``, else the settings' HEARTBEAT_LEASE_WAIT (already read with every other variable)."""
    flag = getattr(args, "wait_lease", None)
    return flag if flag is not None else settings.lease_wait_s


def cmd_run(args: argparse.Namespace, settings: Settings) -> int:
    """One tick, or the loop (runner/loop.py); this command only builds its config and what it shows."""
    config = RunConfig(interval_s=args.interval, lease_wait_s=_lease_wait(args, settings),
                       wakeups=settings.wakeups and not args.no_wakeups)
    if getattr(args, "loop", False):
        port, host = _metrics_address(args, settings)
        if args.wake_port is not None:
            settings = settings.with_(wake_port=args.wake_port)
        check_wake_token(settings, "--wake-port" if args.wake_port is not None else "HEARTBEAT_WAKE_PORT")
        return run_forever(settings, replace(config, metrics_port=port, metrics_host=host), _LoopStatus(args))
    if getattr(args, "metrics_port", None) is not None:
        # a one-shot run ends before any scrape: its figures are in heartbeat_runs (docs/observability.md)
        raise InvalidInputError("--metrics-port needs --loop (a single tick ends before Prometheus could scrape it)")
    return run_once(settings, config, _TickOutput(args))


def _print_skipped(exc: LeaseHeld, args: argparse.Namespace) -> None:
    if args.json:
        emit_json({"skipped": True, "lease_owner": exc.holder.owner, "lease_expires_at": exc.holder.expires_at})
    else:
        print(f"skipped: {exc}", file=sys.stderr, flush=True)


class _TickOutput:
    """What ``run`` shows of one tick (a runner.loop.TickView): its steps on stderr (a spinner on a terminal,
    else ``  … step`` lines, none with --json), then its result on stdout."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self._steps = _progress(args)

    def session(self) -> AbstractContextManager[object]:
        return self._steps

    def progress(self, message: str) -> None:
        self._steps(message)

    def ticked(self, result: TickResult) -> None:
        _print_tick(result, self.args)

    def skipped(self, held: LeaseHeld) -> None:
        _print_skipped(held, self.args)


class _LoopStatus(_TickOutput):
    """The status line of ``run --loop`` on stderr (a runner.loop.LoopView): what the running tick does, then
    its figures and a countdown to the next one. Redrawn in place when stderr is a terminal; elsewhere one
    plain line per tick (and the usual ``  … step`` lines), none of them with --json."""

    def __init__(self, args: argparse.Namespace):
        super().__init__(args)
        self.line = LiveLine(quiet=args.json)
        self._tick, self._started = 0, time.monotonic()

    def session(self) -> AbstractContextManager[object]:
        return self.line

    def starting(self, number: int) -> None:
        self._tick, self._started = number, time.monotonic()
        if self.line.is_live:
            self.progress("starting")

    def progress(self, message: str) -> None:
        """A step of the running tick (the heartbeat's progress callback)."""
        if not self.line.is_live:
            self._steps(message)
            return
        number, started = self._tick, self._started
        self.line.show(lambda: Text(f"tick {number} · {message} · {time.monotonic() - started:.1f} s", style="dim"),
                       plain=False)

    def failed(self, failure: TickFailure) -> None:
        """Log a failed tick: the whole traceback for a new error, one line when it repeats."""
        if not failure.repeated:
            print(f"tick failed: {failure.text}", file=sys.stderr)
            if not isinstance(failure.error, HeartbeatError):
                traceback.print_exception(failure.error)
        else:
            print(f"tick failed again ({failure.failures} in a row): {failure.text}", file=sys.stderr)
        sys.stderr.flush()

    def finished(self, number: int, result: TickResult | None, failures: int, took_s: float, next_at: float) -> None:
        summary = _tick_summary(number, result, failures, took_s)
        backing_off = " (backing off)" if failures else ""
        self.line.show(lambda: summary + f" · next in {max(0.0, next_at - time.monotonic()):.1f} s{backing_off}")

    def unusable(self, problem: str, exit_code: int) -> None:
        print(f"stopping: the lakehouse is unusable ({problem}); exit code {exit_code}", file=sys.stderr, flush=True)

    def redeployed(self, change: str, exit_code: int) -> None:
        print(f"stopping: {change}; exit code {exit_code}. Start the loop again on the deployed version (a "
              "continuous job does so by itself: the run fails and the next one installs the new wheel)",
              file=sys.stderr, flush=True)

    def stopped(self, ticks: int) -> None:
        if not self.args.json:
            print(f"stopped after {ticks} tick(s)")


def _tick_summary(number: int, result: TickResult | None, failures: int, took_s: float) -> Text:
    """``tick 12 · OK · 0.8 s · sensed 5 · new 1 · triggered 1 · completed 0 · failed 0`` (without the countdown)."""
    if failures:
        return Text.assemble(f"tick {number} · ", (f"FAILED ({failures} in a row)", "bold red"), f" · {took_s:.1f} s")
    if result is None:
        return Text.assemble(f"tick {number} · ", ("SKIPPED", "dim"), " (another runner is ticking)")
    errors = len(result.sensor_errors) + len(result.trigger_errors)
    figures = [f"{result.duration_s:.1f} s", f"sensed {len(result.sensed)}", f"new {result.sources_with_new_data}",
               f"triggered {len(result.triggered)}", f"completed {len(result.completed)}",
               f"failed {len(result.failed)}"] + ([f"errors {errors}"] if errors else [])
    state = result.status.value
    return Text.assemble(f"tick {number} · ", (state, "green" if state == "OK" else "bold red"),
                         " · " + " · ".join(figures))


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
    for job_id, note in result.manual.items():
        print(f"  job {job_id}: {note}", flush=True)
    if result.carried:
        print(f"  carried to the next tick (jobs API budget): {len(result.carried)} job(s), "
              f"{', '.join(result.carried[:10])}{' ...' if len(result.carried) > 10 else ''}", flush=True)
    for note in result.api_notes:
        print(f"  jobs API: {note}", flush=True)


class Views(enum.Enum):
    """What a command needs of the views before it runs."""

    #: nothing (it reads no view, or prepares them itself)
    NONE = "none"
    #: the config is loaded and the views exist
    BUILT = "built"
    #: BUILT, and the control table rebuilt unless a runner is ticking (then as of its last build, noted)
    FRESH = "fresh"
    #: FRESH without the note: the command's answer does not depend on how current the table is (an ask)
    CURRENT = "current"


@contextlib.contextmanager
def _opened(args: argparse.Namespace, settings: Settings, *, lease: bool = False,
            views: Views = Views.NONE) -> Iterator[App]:
    """The app for one command: the engine opened, the tick lease held when ``lease`` (waiting --wait-lease
    or $HEARTBEAT_LEASE_WAIT, else LeaseHeld), the ``views`` ready; all closed after (the lease first).
    Errors are not caught here: ``_main`` maps every kind to its message and exit code."""
    with open_app(settings) as app, (tick_lease(app.store).held(_lease_wait(args, settings)) if lease
                                     else contextlib.nullcontext()):
        _prepare(app, views)
        yield app


def _prepare(app: App, views: Views) -> None:
    """Make ``views`` ready (ConfigError when BUILT, FRESH or CURRENT and no config was loaded)."""
    if views is Views.NONE:
        return
    app.require_config()
    app.ensure_views()
    fresh = views in (Views.FRESH, Views.CURRENT) and refresh_if_idle(app, tick_lease(app.store))
    if views is Views.FRESH and not fresh:
        print("note: a runner is ticking; showing the control table as of its last build", file=sys.stderr)


#: a command that runs inside its app (``_app_command``): its exit code
AppCommand = Callable[[argparse.Namespace, App], int]


def _app_command(*, lease: bool = False, views: Views = Views.NONE) -> Callable[[AppCommand], Command]:
    """A command whose whole body runs inside the app ``_opened`` gives it (``app.settings`` are its
    settings); its output is printed before the engine closes."""
    def decorate(command: AppCommand) -> Command:
        @functools.wraps(command)
        def run(args: argparse.Namespace, settings: Settings) -> int:
            with _opened(args, settings, lease=lease, views=views) as app:
                return command(args, app)
        return run
    return decorate


@_app_command()
def cmd_status(args: argparse.Namespace, app: App) -> int:
    if getattr(args, "watch", None) is not None:
        return _watch_status(app, args)
    _prepare(app, Views.FRESH)
    health = runner_health(app.settings, app.store)
    if args.json or args.wide:
        rows = with_sensing_errors(app.store, app.store.control_rows())
        if args.json:
            rows = _with_job_context(app, rows, health)
        emit(rows, _status_columns(rows, args), as_json=args.json)
        sequences = [] if args.json else app.store.open_sequences()
        if sequences:
            emit(sequences, SEQUENCE_COLUMNS, as_json=False, title="\nCatch-up sequences (run k of n; windows of run k)")
        if not args.json:
            _say("", _health_line(health))
        return 0
    console = console_for()
    print_lines(console, render(_on_call(app, health), fit_width(console)))
    return 0


def _with_job_context(app: App, rows: list[dict], health: Liveness) -> list[dict]:
    """``status --json``'s rows: each with the runner's health and its job's trigger hold (None: not held)."""
    shaping = load_run_policies(app.settings.run_policy_file).trigger
    return with_trigger_holds(app.store, shaping, with_runner_health(rows, health))


def _on_call(app: App, health: Liveness) -> OnCall:
    """The on-call view's data: the page's overview of every job, the open alerts, the runner's health, the
    catch-up sequences in progress."""
    from heartbeat_runner.interfaces.ui.data import overview
    from heartbeat_runner.runner.alerting import list_alerts

    alerts = list_alerts(app.store, include_resolved=False, limit=MAX_LIMIT, lakehouse_dir=app.settings.lakehouse_dir)
    shaping = load_run_policies(app.settings.run_policy_file).trigger
    return on_call(overview(app.store, app.settings.lakehouse_dir, shaping), alerts, health,
                   app.store.open_sequences())


def _say(*lines: str) -> None:
    """Print lines of text on stdout: folded to the width where output must fit it (a terminal, $COLUMNS),
    else each whole on one line."""
    console = console_for()
    wrap = fits_width(console)
    for line in lines:
        console.print(Text(line), soft_wrap=not wrap)


def _health_line(health: Liveness) -> str:
    """One line on the runner: ``runner: ticking`` with its last tick and interval, or what is wrong."""
    return health_line(health).plain


def _status_columns(rows: list[dict], args: argparse.Namespace) -> list[str]:
    """The table shows STATUS_COLUMNS; JSON has every column."""
    return STATUS_COLUMNS if not args.json else list(rows[0].keys()) if rows else STATUS_COLUMNS


def _watch_status(app: App, args: argparse.Namespace) -> int:
    """``status --watch``: the on-call view (``--wide``: the control table) every ``args.watch`` seconds, rebuilt
    first unless a runner is ticking; on a terminal it fits the screen, the most urgent jobs first."""
    app.require_config()
    app.ensure_views()
    lease = tick_lease(app.store)
    count = getattr(args, "watch_count", None)
    if args.json or args.wide:
        def read() -> Snapshot:
            fresh = refresh_if_idle(app, lease)
            health = runner_health(app.settings, app.store)
            rows = with_sensing_errors(app.store, app.store.control_rows())
            if args.json:
                rows = _with_job_context(app, rows, health)
            note = _health_line(health) + ("" if fresh else "; the table is as of its last build")
            return rows, _status_columns(rows, args), note

        watch(read, title="Control table", interval=args.watch, count=count, as_json=args.json)
        return 0
    console = console_for()

    def lines(height: int | None) -> list[Text]:
        fresh = refresh_if_idle(app, lease)
        view = render(_on_call(app, runner_health(app.settings, app.store)), fit_width(console), height)
        note = f"every {args.watch:g} s" + ("" if fresh else "; a runner is ticking: as of its last build")
        return [cut_line(Text(note, style="dim"), fit_width(console)), *view]

    watch_lines(lines, interval=args.watch, count=count)
    return 0


@_app_command()
def cmd_pause(args: argparse.Namespace, app: App) -> int:
    record_job_event(app, args.job_id, EventType.JOB_PAUSED)
    print(f"job {args.job_id} paused (until `resume` or the next seed)")
    return 0


@_app_command()
def cmd_resume(args: argparse.Namespace, app: App) -> int:
    record_job_event(app, args.job_id, EventType.JOB_RESUMED)
    print(f"job {args.job_id} resumed")
    return 0


@_app_command()
def cmd_complete(args: argparse.Namespace, app: App) -> int:
    kind = EventType.FAILED if args.failed else EventType.COMPLETED
    run_id = args.run_id or app.settings.job_run_id
    record_job_event(app, args.job_id, kind, job_run_id=run_id, message=args.message)
    print(f"job {args.job_id}: recorded {kind.value}")
    return 0


@_app_command(views=Views.CURRENT)
def cmd_retry(args: argparse.Namespace, app: App) -> int:
    ask_retry(app, args.job_id, reason=args.reason)
    print(f"job {args.job_id}: retry asked; the next tick re-runs it over the data of its failed run")
    return 0


@_app_command(views=Views.CURRENT)
def cmd_trigger(args: argparse.Namespace, app: App) -> int:
    ask_trigger(app, args.job_id, reason=args.reason)
    print(f"job {args.job_id}: manual run asked; the next tick requests it (exactly once)")
    return 0


#: `runs`: one line per tick (`--json` has every figure)
TICK_COLUMNS = (Column("RUN"), Column("AT"), Column("TOOK"), Column("STATUS"), Column("WHAT", Fit.END, 12))


def _tick_cells(tick: dict, now: datetime) -> list[tuple[str, str]]:
    """One tick's line: its id, when, how long, its status and what it did (figures that are not 0)."""
    sources = [f"sensed {tick['sources_sensed'] or 0}"] + [
        f"{tick[key]} {word}" for key, word in (("sources_with_new_data", "new"), ("sensor_errors", "error(s)"),
                                                ("sources_skipped", "skipped")) if tick[key]]
    jobs = [f"{word} {tick[key]}" for key, word in (("jobs_triggered", "triggered"), ("jobs_completed", "completed"),
                                                    ("jobs_failed", "failed")) if tick[key]]
    what = "; ".join(filter(None, [", ".join(sources), ", ".join(jobs), tick["message"]]))
    took = "-" if tick["duration_s"] is None else f"{tick['duration_s']:.1f}s"
    status = str(tick["status"])
    return [(str(tick["run_id"]), ""), (short_time(tick["snapshot_ts"], now, seconds=True), ""),
            (took, ""), (status, STATE_STYLES.get(status, "")), (what, "")]


@_app_command(views=Views.BUILT)
def cmd_runs(args: argparse.Namespace, app: App) -> int:
    if not args.run_id:
        ticks = recent_runs(app.store, args.limit)
        if args.json:  # each tick's columns, its control table refreshes, and the job runs it requested
            emit_json([{**{c: t.get(c) for c in RUNS_COLUMNS}, "control_refreshes": control_refreshes(t),
                        "job_runs": t["job_runs"]} for t in with_job_runs(app.store, ticks)])
        else:
            console = console_for()
            print_lines(console, compact_table(TICK_COLUMNS, [_tick_cells(t, datetime.now(timezone.utc)) for t in ticks], fit_width(console)))
        return 0
    run, report = run_details(app.store, args.run_id)
    if args.json:
        emit_json({"run": {**with_job_runs(app.store, [run])[0], "control_refreshes": control_refreshes(run)},
                   "sources": report})
        return 0
    print(f"run {run['run_id']} at {timestamp(run['snapshot_ts'])}: {run['status']}"
          + (f" ({run['message']})" if run["message"] else ""))
    emit(report, REPORT_COLUMNS, as_json=False)
    return 0


@_app_command(views=Views.FRESH)
def cmd_explain(args: argparse.Namespace, app: App) -> int:
    settings = app.settings
    found = explain(app.store, args.job_id, idle_sensing(settings.lakehouse_dir))
    policies = load_run_policies(settings.run_policy_file)
    retry = retry_outlook(app.store, policies.retry, args.job_id)
    late = late_data(app.store, settings.run_policy_file, args.job_id)
    outlook = trigger_hold(app.store, policies.trigger, args.job_id, found.is_ready)
    deadline = _deadline_note(app, settings, args.job_id, outlook.text if outlook and outlook.held else None)
    asked = pending_ask(app.store, args.job_id)
    runs = latest_job_runs(app.store, args.job_id)
    hold = outlook.text if outlook else None
    if args.json:
        emit_json({"job_id": found.job_id, "verdict": found.verdict, "ready": found.is_ready, "rows": found.rows,
                   "automatic_retry": retry, "late_data": late, "deadline": deadline, "asked": asked,
                   "runs": runs, **({"trigger_hold": hold} if hold is not None else {})})
        return 0
    _say(f"job {found.job_id}: {found.verdict}")
    if hold:
        _say(f"trigger: {hold}")
    last = runs[0] if runs else None
    if last and last["outcome"] == EventType.FAILED.value and last["output_tail"]:
        _say(f"output of run {last['job_run_id']} (its last {len(last['output_tail'])} line(s)):",
             *(f"  | {line}" for line in last["output_tail"]))
    if asked:
        _say(f"asked: {asked}")
    if deadline:
        _say(f"deadline: {deadline}")
    if retry:
        _say(f"automatic retry: {retry}")
    for item in late:
        _say(f"late data: {item['source_key']} window from {item['window_start']}: {item['rows']} row(s) "
             "arrived after the window was final")
    emit(found.rows, EXPLAIN_COLUMNS, as_json=False)
    return 0


def cmd_reset(args: argparse.Namespace, settings: Settings) -> int:
    since = parse_since(args.since) if args.since else None  # before the engine starts
    with _opened(args, settings, lease=True) as app:
        done = reset_job(app, args.job_id, since, args.reason, force=args.force)
    _print_reset(done.plan, done.running_run, args)
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
        print(f"  run {running_run} of this job was still going: cancelled (--force)")


def cmd_maintain(args: argparse.Namespace, settings: Settings) -> int:
    with _opened(args, settings, lease=True, views=Views.BUILT) as app:
        app.control.refresh()  # the live set is judged on current state
        with _progress(args) as progress:
            done = app.control.run_maintenance(app.maintenance(progress), compact_all=args.compact_all)
    if args.json:
        emit_json(done.as_dict())
        return 0
    print(f"archived {done.archived_events} event(s), {done.archived_runs} run summary row(s) and "
          f"{done.archived_report_rows} report row(s) in {done.duration_s:.1f}s")
    if done.deleted_by_retention:
        print(f"deleted {done.deleted_by_retention} archived row(s) past HEARTBEAT_ARCHIVE_RETENTION_DAYS")
    if done.repaired_rows:
        emit([dict(zip(("sensor_source", "sensor_id", "trigger_job_id"), key)) for key in done.repaired_rows],
             ["sensor_source", "sensor_id", "trigger_job_id"], as_json=False,
             title="Control rows that differed from their derivation (rebuilt)")
    if done.compacted:
        emit([{"table": table, "files_before": before, "files_after": after}
              for table, (before, after) in done.compacted.items()],
             ["table", "files_before", "files_after"], as_json=False, title="Compacted (data files)")
    return 0


def cmd_rebuild(args: argparse.Namespace, settings: Settings) -> int:
    with _opened(args, settings, lease=True, views=Views.BUILT) as app:
        with _progress(args) as progress:
            progress("re-deriving the control table from the hot log and the archive")
            app.control.rebuild_from_all_events()
        rows = len(app.store.control_rows(include_retired=True))
    print(f"rebuilt the control table from every recorded event ({rows} row(s))")
    return 0


def cmd_dbt(args: argparse.Namespace, settings: Settings) -> int:
    if not args.dbt_args:
        raise HeartbeatError("usage: python -m heartbeat_runner dbt <dbt command and options>, e.g. `dbt test`")
    with _opened(args, settings) as app:
        if app.store.exists("heartbeat_control"):
            app.ensure_views()
        app.dbt.invoke(list(args.dbt_args), quiet=False, artifacts=True)  # the user's command: dbt's own files
    return 0


def cmd_serve(args: argparse.Namespace, settings: Settings) -> int:
    from heartbeat_runner.interfaces.serve import serve, session_id_for

    port, host = _metrics_address(args, settings)
    exposition = serve_metrics(port, host) if port is not None else None
    try:
        with open_app(settings, port=args.port, session_id=session_id_for(settings)) as app:
            serve(app, args.port)
    finally:
        if exposition is not None:
            exposition.close()
    return 0


def cmd_ui(args: argparse.Namespace, settings: Settings) -> int:
    from heartbeat_runner.interfaces.ui import run_ui

    run_ui(settings, host=args.host, port=args.port, allow_actions=args.allow_actions, refresh_s=args.refresh)
    return 0


def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    from heartbeat_runner.interfaces.demo import run_demo

    return run_demo(settings, keep=args.keep, as_json=args.json)


# -- alerts (docs/alerts.md) ---------------------------------------------------------------------

ALERT_COLUMNS = ["kind", "subject", "summary", "since_ts", "is_open", "resolved_at", "raise_delivered_to",
                 "failed_deliveries"]
#: Exit code of ``check`` when no runner ticked within the limit.
EXIT_NOT_TICKING = 2


def _alert_parsers(sub: argparse._SubParsersAction, common: argparse.ArgumentParser) -> None:
    alerts = sub.add_parser("alerts", parents=[common], help="open alerts (and resolved ones with --all)")
    alerts.add_argument("--all", action="store_true", help="also the resolved alerts")
    alerts.add_argument("--limit", type=int, default=50, help="at most this many, newest first (default 50)")
    sub.add_parser("check", parents=[common],
                   help="is a runner ticking? exit 0 yes, 2 no; raises/resolves 'runner not ticking' (for cron)")


def _deadline_note(app: App, settings: Settings, job_id: str, held: str | None) -> str | None:
    """The job's missed deadline and its root cause, when its alert policy sets one (``held``: the trigger hold
    that keeps the job back now, named as the cause when its data is all there)."""
    from heartbeat_runner.runner.alerting import overdue_now

    policies = load_run_policies(settings.run_policy_file).alerts
    overdue = (overdue_now(policies, app.store.control_rows(), job_id, app.store.deadlines_seen(),
                           app.store.sensing_failures(), held=held) if policies.enabled else None)
    return None if overdue is None else f"overdue since {overdue.deadline} ({overdue.due:%Y-%m-%d %H:%M} UTC): " \
                                        f"{overdue.reason}"


@_app_command(views=Views.BUILT)
def cmd_alerts(args: argparse.Namespace, app: App) -> int:
    from heartbeat_runner.runner.alerting import list_alerts

    rows = list_alerts(app.store, include_resolved=args.all, limit=args.limit,
                       lakehouse_dir=app.settings.lakehouse_dir)
    if args.json:
        emit_json(rows)
    elif not rows:
        print("no open alerts" if not args.all else "no alerts")
    else:
        emit(rows, ALERT_COLUMNS, as_json=False)
    return 0


def cmd_check(args: argparse.Namespace, settings: Settings) -> int:
    from heartbeat_runner.runner.alerting import liveness_path, watch_runner

    policies = load_run_policies(settings.run_policy_file).alerts
    found = runner_health(settings)
    if not liveness_path(settings.lakehouse_dir).exists() or settings.target is Target.DATABRICKS:
        found = _lakehouse_health(args, settings, found)
    found = watch_runner(settings.lakehouse_dir, policies, found=found)
    if args.json:
        emit_json(found.as_json())
    else:
        print(found.message)
    return 0 if found.healthy else EXIT_NOT_TICKING


def _lakehouse_health(args: argparse.Namespace, settings: Settings, local: Liveness) -> Liveness:
    """The runner's health with the lakehouse's record of ticks (a runner elsewhere, e.g. a job cluster); this
    machine's answer ``local`` when the lakehouse cannot be opened (then nothing says it ticks)."""
    if settings.lakehouse_in_folder and not settings.lakehouse_dir.is_dir():
        return local
    try:
        with _opened(args, settings) as app:
            return runner_health(settings, app.store)
    except HeartbeatError as exc:
        log.warning("could not read the runner's ticks from the lakehouse: %s", exc)
        return local


COMMANDS: dict[str, Command] = {
    "run": cmd_run,
    "seed": cmd_seed,
    "validate": cmd_validate,
    "status": cmd_status,
    "runs": cmd_runs,
    "explain": cmd_explain,
    "reset": cmd_reset,
    "pause": cmd_pause,
    "resume": cmd_resume,
    "retry": cmd_retry,
    "trigger": cmd_trigger,
    "complete": cmd_complete,
    "maintain": cmd_maintain,
    "rebuild": cmd_rebuild,
    "dbt": cmd_dbt,
    "demo": cmd_demo,
    "serve": cmd_serve,
    "ui": cmd_ui,
    "alerts": cmd_alerts,
    "check": cmd_check,
}
