"""The ``local`` jobs backend: jobs are commands on this machine.

A jobs file maps ``trigger_job_id`` to a command::

    jobs:
      "111":
        command: ["python", "etl.py"]   # a list, or a string run by the shell
        cwd: /path/to/project          # optional
        env: {STAGE: dev}              # optional, added to the environment

Each run gets ``<lakehouse>/jobs/runs/<run_id>/`` holding ``output.log`` and, when the
command ends, ``result.json`` with its exit code. Runs are started detached, so the
runner can exit (or crash) while they go on; a later tick reads the result.

Idempotency: the token is claimed by creating ``tokens/<token>`` exclusively, whole (its
run id is written aside and hard-linked into place, so a crash at any instant leaves no
claim or a complete one); the run it names runs at most once: its launcher process claims the
``launched`` marker (created exclusively, holding the launcher's pid) before it starts the
command, and a second launcher of the same run exits untouched. So a retry after a crash, or a
second runner, gets the same run, and a runner killed before its launcher started leaves a run
the resumed request starts (where it used to be reported FAILED, "never started").
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shlex
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from heartbeat_runner.core.errors import ConfigError, JobNotFoundError, JobsBackendError
from heartbeat_runner.core.files import create_exclusively, replace_whole
from heartbeat_runner.core.processes import pid_alive, process_command
from heartbeat_runner.core.settings import JobsBackendKind, Settings
from heartbeat_runner.core.yaml_files import read_yaml_mapping
from heartbeat_runner.jobs.base import (
    JobsBackend,
    RunOutcome,
    RunOutput,
    RunStatus,
    TriggerRequest,
    failure_reason,
    output_tail,
)
from heartbeat_runner.sensing.watch import FolderWatch

#: How much of the end of a run's output.log ``run_output`` returns.
OUTPUT_TAIL_BYTES = 64 * 1024
#: the one key a run's end wakes the loop with (no source: the tick it starts senses nothing)
_RUN_ENDED = frozenset({"run ended"})
#: the launcher each run is started through: a POSIX shell script (a shell starts in about a millisecond, a Python
#: interpreter in tens: a busy tick launching hundreds of jobs is not held up by them)
LAUNCH_SCRIPT = Path(__file__).with_name("local_launch.sh")
#: what a launcher's command line holds: the script, or the Python launcher (retired) that older runners started;
#: its runs left the same files, read the same way (tests/test_local_backend.py)
LAUNCHER_MARKS = (LAUNCH_SCRIPT.name.encode(), b"heartbeat_runner.jobs.local_launcher")


@dataclass(frozen=True)
class LocalJob:
    job_id: str
    command: list[str]
    cwd: str | None = None
    env: dict[str, str] = field(default_factory=dict)


def load_jobs_file(path: Path) -> dict[str, LocalJob]:
    """Parse the jobs file; a missing file means no local jobs."""
    if not path.exists():
        return {}
    expected = "a top-level 'jobs:' mapping of job id to command"
    jobs = read_yaml_mapping(path, expected).get("jobs")
    if not isinstance(jobs, dict):
        raise ConfigError([f"{path}: expected {expected}"])
    parsed: dict[str, LocalJob] = {}
    problems = []
    for job_id, spec in jobs.items():
        if isinstance(spec, (str, list)):
            spec = {"command": spec}
        if not isinstance(spec, dict) or not spec.get("command"):
            problems.append(f"{path}: job {job_id!r}: needs a 'command' (string or list)")
            continue
        command = spec["command"]
        argv = ["/bin/sh", "-c", command] if isinstance(command, str) else [str(a) for a in command]
        env = {str(k): str(v) for k, v in (spec.get("env") or {}).items()}
        parsed[str(job_id)] = LocalJob(str(job_id), argv, spec.get("cwd"), env)
    if problems:
        raise ConfigError(problems)
    return parsed


class LocalJobsBackend(JobsBackend):
    """Runs jobs as detached local processes."""

    name = JobsBackendKind.LOCAL.value
    can_cancel = True

    def __init__(self, jobs_file: Path, state_dir: Path, lakehouse_dir: Path | None = None,
                 lakehouse_env: Mapping[str, str] | None = None):
        """``lakehouse_env``: variables every job gets (Settings.lakehouse_env: the lakehouse and engine)."""
        self.jobs_file = jobs_file
        self.lakehouse_env = dict(lakehouse_env or {})
        self.jobs = load_jobs_file(jobs_file)
        self.state_dir = state_dir
        self.lakehouse_dir = lakehouse_dir
        (state_dir / "runs").mkdir(parents=True, exist_ok=True)
        (state_dir / "tokens").mkdir(parents=True, exist_ok=True)

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalJobsBackend:
        """The jobs of the settings' jobs file; run state under ``<lakehouse>/jobs``."""
        return cls(settings.effective_jobs_file, settings.lakehouse_dir / "jobs", settings.lakehouse_dir,
                   settings.lakehouse_env())

    # -- JobsBackend ------------------------------------------------------------------------

    def trigger(self, request: TriggerRequest) -> str:
        job = self.jobs.get(request.job_id)
        if job is None:
            raise JobNotFoundError(f"job {request.job_id!r} is not defined in {self.jobs_file}")
        run_id = self._claim_token(request)
        run_dir = self._run_dir(run_id)
        run_dir.mkdir(parents=True, exist_ok=True)  # already there unless a crash came right after the claim
        with self._locked(run_dir):
            if not (run_dir / "launched").exists():
                self._launch(job, request, run_id, run_dir)
        return run_id

    def watch_runs(self, wake: Callable[[], None]) -> FolderWatch:
        """File-system notifications on the runs folder: a run's ``result.json`` (written when it ends) wakes the
        loop."""
        runs = (self.state_dir / "runs").absolute()
        return FolderWatch(lambda folder: _RUN_ENDED if folder.parent == runs else frozenset(), {runs},
                           lambda key: wake(), ignore=lambda name: name != "result.json").start()

    def run_output(self, job_id: str, run_id: str) -> RunOutput | None:
        """The end of the run's ``output.log`` (at most OUTPUT_TAIL_BYTES)."""
        log_path = self._run_dir(run_id) / "output.log"
        if not log_path.is_file():
            return None
        with open(log_path, "rb") as log:
            log.seek(max(0, log_path.stat().st_size - OUTPUT_TAIL_BYTES))
            return RunOutput(text=log.read().decode("utf-8", errors="replace"))

    def _output_tail(self, run_dir: Path) -> tuple[str, ...]:
        """The last lines of a run's output.log, redacted (empty when it has none)."""
        log_path = run_dir / "output.log"
        if not log_path.is_file():
            return ()
        with open(log_path, "rb") as log:
            log.seek(max(0, log_path.stat().st_size - OUTPUT_TAIL_BYTES))
            return output_tail(log.read().decode("utf-8", errors="replace"))

    def run_status(self, job_id: str, run_id: str) -> RunStatus:
        run_dir = self._run_dir(run_id)
        if not run_dir.is_dir():
            raise JobsBackendError(f"run {run_id} of job {job_id} is unknown to the local backend")
        meta = _read_json(run_dir / "meta.json") or {}
        started = _parse_ts(meta.get("started_at"))
        result = _read_json(run_dir / "result.json")
        if result is not None:
            code = shell_exit_code(int(result["exit_code"]))
            tail = () if code == 0 else self._output_tail(run_dir)
            reason = failure_reason(tail)
            where = f"exit code {code}; output in {run_dir / 'output.log'}"
            return RunStatus(
                run_id=run_id,
                outcome=RunOutcome.SUCCESS if code == 0 else RunOutcome.FAILED,
                message=None if code == 0 else f"{reason} ({where})" if reason else where,
                start_time=_parse_ts(result.get("started_at")) or started,
                end_time=_parse_ts(result.get("ended_at")),
                failure_reason=reason, output_tail=tail or None,
            )
        if not (run_dir / "launched").exists():
            return self._unclaimed_status(job_id, run_id, run_dir, meta, started)
        # the launcher that claimed the run wrote its pid into the marker (an older version: into ``pid``)
        pid = _read_pid(run_dir / "launched") or _read_pid(run_dir / "pid") or meta.get("pid")
        if pid and pid_alive(int(pid)):
            return RunStatus(run_id, RunOutcome.RUNNING, start_time=started)
        # The launcher writes result.json before it exits; re-check to avoid a race.
        if (run_dir / "result.json").exists():
            return self.run_status(job_id, run_id)
        if not pid:
            return RunStatus(run_id, RunOutcome.FAILED, start_time=started,
                             message="the job process never started (the runner stopped while starting it); "
                                     "`retry` runs it")
        return RunStatus(run_id, RunOutcome.FAILED, message="the job process ended without reporting an exit code",
                         start_time=started)

    def _unclaimed_status(self, job_id: str, run_id: str, run_dir: Path, meta: Mapping,
                          started: datetime | None) -> RunStatus:
        """A run no launcher has claimed yet: PENDING while its launcher may still start (or a resumed
        request starts one); FAILED once the launcher the runner started has ended without claiming it."""
        pid = meta.get("pid")
        if not pid or pid_alive(int(pid)):
            return RunStatus(run_id, RunOutcome.PENDING, start_time=started)
        if (run_dir / "launched").exists():  # claimed just before its launcher ended
            return self.run_status(job_id, run_id)
        return RunStatus(run_id, RunOutcome.FAILED, start_time=started,
                         message="the job's launcher ended before it started the job; `retry` runs it")

    def successful_run_after(self, job_id: str, after: datetime) -> RunStatus | None:
        best: RunStatus | None = None
        for run_dir in (self.state_dir / "runs").iterdir():
            meta = _read_json(run_dir / "meta.json") or {}
            if meta.get("job_id") != job_id or not (run_dir / "result.json").exists():
                continue
            status = self.run_status(job_id, run_dir.name)
            if (status.outcome is RunOutcome.SUCCESS and status.end_time and status.end_time > after
                    and (best is None or status.end_time > (best.end_time or after))):
                best = status
        return best

    # -- internals --------------------------------------------------------------------------

    def cancel_run(self, job_id: str, run_id: str) -> None:
        """Stop a local run: SIGTERM to its launcher's process group (the launcher starts in its own session,
        so the group is the run: the job's command and its children). The run then ends without an exit code
        and is reconciled as FAILED. A run that already ended, or a pid that is no launcher any more (reused),
        is left alone."""
        run_dir = self._run_dir(run_id)
        pid = _read_pid(run_dir / "launched") or _read_pid(run_dir / "pid") or (_read_json(run_dir / "meta.json")
                                                                                 or {}).get("pid")
        if not pid or not pid_alive(int(pid)) or not is_job_run(int(pid)):
            return
        try:
            os.killpg(int(pid), signal.SIGTERM)
        except ProcessLookupError:
            return  # it ended meanwhile
        except PermissionError as exc:
            raise JobsBackendError(f"could not cancel run {run_id} of job {job_id}: {exc}") from exc

    def _run_dir(self, run_id: str) -> Path:
        return self.state_dir / "runs" / run_id

    def _claim_token(self, request: TriggerRequest) -> str:
        """The run that owns ``request``'s token: the one an earlier call claimed, or a new one.

        The token file appears with its run id or not at all (``os.link`` of a file written aside), so
        a crash never leaves a claim without a run id."""
        token_file = self.state_dir / "tokens" / request.idempotency_token
        run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:8]}"
        if create_exclusively(token_file, run_id):
            return run_id
        claimed = token_file.read_text().strip()
        if claimed:
            return claimed
        replace_whole(token_file, run_id)  # an empty claim, left by a crash of a version that wrote it in place
        return run_id

    @contextlib.contextmanager
    def _locked(self, run_dir: Path) -> Iterator[None]:
        with open(run_dir / "lock", "w") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _launch(self, job: LocalJob, request: TriggerRequest, run_id: str, run_dir: Path) -> None:
        env = dict(os.environ)
        env.update(job.env)
        env.update({
            "HEARTBEAT_JOB_ID": job.job_id,
            "HEARTBEAT_JOB_RUN_ID": run_id,
            "HEARTBEAT_PARAMETERS": json.dumps(request.parameters, sort_keys=True),
        })
        if self.lakehouse_dir is not None:
            env["HEARTBEAT_HOME"] = str(self.lakehouse_dir)
        env.update(self.lakehouse_env)
        for key, value in request.parameters.items():
            env[f"HEARTBEAT_PARAM_{key.upper()}"] = value
        argv = ["/bin/sh", str(LAUNCH_SCRIPT), str(run_dir), "--", *job.command]
        meta = {"job_id": request.job_id, "token": request.idempotency_token, "parameters": request.parameters,
                "started_at": datetime.now(timezone.utc).isoformat(), "command": job.command}
        _write_json(run_dir / "meta.json", meta)
        # The launcher claims the run (the ``launched`` marker) before it starts the command: a kill
        # before it did leaves the run unclaimed, and the call that resumes the request starts it.
        try:
            with open(run_dir / "output.log", "ab") as log:
                process = subprocess.Popen(argv, cwd=job.cwd, env=env, stdin=subprocess.DEVNULL, stdout=log,
                                           stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:  # it certainly did not start: the next call tries again
            raise JobsBackendError(f"could not start job {job.job_id} ({shlex.join(job.command)}): {exc}") from exc
        _write_json(run_dir / "meta.json", {**meta, "pid": process.pid})


def shell_exit_code(code: int) -> int:
    """A run's exit code as a shell reports it: a command killed by signal N is 128+N. The retired Python
    launcher recorded -N there (``subprocess.call``); a run it started reads as the launcher's runs do."""
    return 128 - code if code < 0 else code


def is_job_run(pid: int) -> bool:
    """Whether ``pid`` is a local job run's launcher (a runner's descendant whose memory is the job's)."""
    command = process_command(pid)
    return any(mark in command for mark in LAUNCHER_MARKS)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _write_json(path: Path, value: dict) -> None:
    replace_whole(path, json.dumps(value, indent=2, sort_keys=True))


def _parse_ts(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None
