"""The local jobs backend starts a token's run once, whatever state a crash left its claim in.

Real job processes; the claim files are the backend's own (``<state>/tokens/<token>``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path

import pytest

from heartbeat_runner.core.errors import JobsBackendError
from heartbeat_runner.jobs.base import RunOutcome, TriggerRequest
from heartbeat_runner.jobs.local import LAUNCH_SCRIPT, LocalJobsBackend, is_job_run

APPEND = "import sys; open(sys.argv[1], 'a').write('ran\\n')"


def _backend(tmp_path: Path) -> tuple[LocalJobsBackend, Path]:
    marker = tmp_path / "ran.txt"
    jobs = tmp_path / "jobs.yml"
    jobs.write_text(f"jobs:\n  J: [{sys.executable!r}, '-c', {APPEND!r}, {str(marker)!r}]\n")
    return LocalJobsBackend(jobs, tmp_path / "state"), marker


def _finished(backend: LocalJobsBackend, run_id: str) -> RunOutcome:
    deadline = time.monotonic() + 60
    while (outcome := backend.run_status("J", run_id).outcome) in (RunOutcome.PENDING, RunOutcome.RUNNING):
        assert time.monotonic() < deadline, f"run {run_id} did not end"
        time.sleep(0.1)
    return outcome


def test_sixteen_concurrent_calls_with_one_token_start_one_run(tmp_path):
    backend, marker = _backend(tmp_path)
    request = TriggerRequest("J", None, "token-1")
    with ThreadPoolExecutor(max_workers=16) as pool:
        run_ids = set(pool.map(lambda _: backend.trigger(request), range(16)))
    assert len(run_ids) == 1
    assert _finished(backend, run_ids.pop()) is RunOutcome.SUCCESS
    assert marker.read_text() == "ran\n"
    assert not [p for p in (tmp_path / "state" / "tokens").iterdir() if p.name.startswith(".")], "claims left aside"


def test_a_claim_a_crash_left_empty_or_without_its_run_directory_still_starts_its_run_once(tmp_path):
    """An empty claim (what an earlier version left when killed between creating and writing it) and a
    claim whose run directory was never made (a kill right after the claim) both start the run at the
    next call, once: before, the empty one answered 'being claimed' for ever."""
    backend, marker = _backend(tmp_path)
    tokens = tmp_path / "state" / "tokens"
    (tokens / "token-empty").write_text("")
    (tokens / "token-bare").write_text("20261125T000000-deadbeef")
    runs = {token: {backend.trigger(TriggerRequest("J", None, token)) for _ in range(3)}
            for token in ("token-empty", "token-bare")}
    assert all(len(ids) == 1 for ids in runs.values())
    assert runs["token-bare"] == {"20261125T000000-deadbeef"}
    for ids in runs.values():
        assert _finished(backend, next(iter(ids))) is RunOutcome.SUCCESS
    assert marker.read_text() == "ran\nran\n"


def test_a_run_killed_before_its_launcher_started_is_started_by_the_resumed_call_once(tmp_path):
    """A runner killed after it claimed the token and wrote the run's meta, before its launcher claimed
    the run: the call that resumes the request starts it, and the command runs once even when the old
    launcher did start after all (two launchers of one run: one claims it, the other exits untouched)."""
    backend, marker = _backend(tmp_path)
    run_id = "20261125T000000-feedfeed"
    (tmp_path / "state" / "tokens" / "token-1").write_text(run_id)
    run_dir = tmp_path / "state" / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "meta.json").write_text('{"job_id": "J", "token": "token-1"}')  # what the kill left
    assert backend.run_status("J", run_id).outcome is RunOutcome.PENDING
    with ThreadPoolExecutor(max_workers=3) as pool:  # the resumed call, and launchers racing it
        assert set(pool.map(lambda _: backend.trigger(TriggerRequest("J", None, "token-1")), range(3))) == {run_id}
    backend._launch(backend.jobs["J"], TriggerRequest("J", None, "token-1"), run_id, run_dir)  # a late old launcher
    assert _finished(backend, run_id) is RunOutcome.SUCCESS
    time.sleep(1.0)  # the late launcher has long exited
    assert marker.read_text() == "ran\n"
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith("launched")) == ["launched"]


def test_a_run_an_older_version_marked_launched_without_a_process_is_failed_and_never_started_twice(tmp_path):
    """Older versions marked the run launched before starting its process: a runner killed in between
    left a run reported FAILED (retried with a new token), never one a later call starts again."""
    backend, marker = _backend(tmp_path)
    run_id = "20261125T000000-cafecafe"
    (tmp_path / "state" / "tokens" / "token-1").write_text(run_id)
    run_dir = tmp_path / "state" / "runs" / run_id
    run_dir.mkdir(parents=True)
    (run_dir / "launched").touch()  # what the kill left: marked, no process, no pid
    assert backend.trigger(TriggerRequest("J", None, "token-1")) == run_id
    status = backend.run_status("J", run_id)
    assert status.outcome is RunOutcome.FAILED and "never started" in (status.message or "")
    assert not marker.exists()


def _a_job_run_once_execd(pid: int, timeout_s: float = 30.0) -> bool:
    """``is_job_run(pid)`` of a process just started: until it has exec'd, its command line is still the test's
    own (CI once read it then), so it is asked again for up to ``timeout_s`` (an exited process stays False)."""
    deadline = time.monotonic() + timeout_s
    while not is_job_run(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return is_job_run(pid)


def test_runs_the_retired_python_launcher_started_still_reconcile_as_the_shell_launchers_do(tmp_path):
    """The Python launcher (``python -m heartbeat_runner.jobs.local_launcher``) is retired; a runner upgraded
    while runs an older one started are in flight still reads them from the files that launcher left: its
    ``launched``/``pid`` marker and its ``result.json``. Ended: SUCCESS, or FAILED with the exit code a shell
    reports (it recorded -9 for a job killed by SIGKILL: now 137, as the shell launcher's runs say). In flight:
    RUNNING while its process lives (a real process with the old launcher's command line), which ``cancel_run``
    recognises as a job run and stops; then FAILED without an exit code."""
    backend, _ = _backend(tmp_path)
    runs = tmp_path / "state" / "runs"

    def left_by_python_launcher(run_id: str, pid: int, result: dict | None) -> None:
        run_dir = runs / run_id
        run_dir.mkdir(parents=True)
        (run_dir / "meta.json").write_text(json.dumps({"job_id": "J", "token": run_id, "parameters": {},
                                                       "started_at": "2026-11-01T10:00:00+00:00", "pid": pid}))
        (run_dir / "launched").write_text(str(pid))
        (run_dir / "pid").write_text(str(pid))
        if result is not None:
            (run_dir / "result.json").write_text(json.dumps({"started_at": "2026-11-01T10:00:01+00:00",
                                                             "ended_at": "2026-11-01T10:05:01+00:00", **result}))

    left_by_python_launcher("old-ok", 2 ** 22 + 1, {"exit_code": 0})
    left_by_python_launcher("old-killed", 2 ** 22 + 2, {"exit_code": -9})
    ok, killed = backend.run_status("J", "old-ok"), backend.run_status("J", "old-killed")
    assert ok.outcome is RunOutcome.SUCCESS and (ok.end_time - ok.start_time).total_seconds() == 300
    assert killed.outcome is RunOutcome.FAILED and (killed.message or "").startswith("exit code 137")

    old_launcher = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)",
                                     "heartbeat_runner.jobs.local_launcher", str(runs / "old-live"), "--", "etl"],
                                    start_new_session=True)
    try:
        left_by_python_launcher("old-live", old_launcher.pid, None)
        assert _a_job_run_once_execd(old_launcher.pid)
        assert backend.run_status("J", "old-live").outcome is RunOutcome.RUNNING
        backend.cancel_run("J", "old-live")
        assert old_launcher.wait(timeout=30) == -15  # SIGTERM to its process group
        status = backend.run_status("J", "old-live")
        assert status.outcome is RunOutcome.FAILED and "without reporting an exit code" in (status.message or "")
    finally:
        if old_launcher.poll() is None:
            old_launcher.kill()
            old_launcher.wait()


def test_a_command_that_cannot_start_is_a_trigger_error_and_the_next_call_tries_again(tmp_path):
    jobs = tmp_path / "jobs.yml"
    jobs.write_text(f"jobs:\n  J:\n    command: [{sys.executable!r}, '-c', 'pass']\n    cwd: {str(tmp_path / 'gone')!r}\n")
    backend = LocalJobsBackend(jobs, tmp_path / "state")
    request = TriggerRequest("J", None, "token-1")
    with pytest.raises(JobsBackendError, match="could not start job J"):
        backend.trigger(request)
    (tmp_path / "gone").mkdir()
    run_id = backend.trigger(request)
    assert _finished(backend, run_id) is RunOutcome.SUCCESS


def test_two_launchers_of_one_run_run_its_command_once_and_report_it_whole(tmp_path):
    """The launcher a run is started through (a shell script, not a Python interpreter per job): started twice on
    the same run directory at once, the command runs once; ``result.json`` holds its exit code and its own start
    and end, which the backend reads back as the run's outcome and times."""

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    marker = tmp_path / "ran.txt"
    command = ["/bin/sh", "-c", f"sleep 0.3; echo ran >> {marker}; exit 3"]
    launchers = [subprocess.Popen(["/bin/sh", str(LAUNCH_SCRIPT), str(run_dir), "--", *command]) for _ in range(2)]
    assert any(_a_job_run_once_execd(p.pid, timeout_s=0.5) for p in launchers)
    codes = sorted(p.wait(30) for p in launchers)
    assert codes == [0, 3]                                   # the second launcher ran nothing, quietly
    assert marker.read_text() == "ran\n"
    result = json.loads((run_dir / "result.json").read_text())
    assert result["exit_code"] == 3
    started, ended = (datetime.fromisoformat(result[k]) for k in ("started_at", "ended_at"))
    assert 0.2 <= (ended - started).total_seconds() < 30 and started.utcoffset().total_seconds() == 0
    assert not [p.name for p in run_dir.iterdir() if p.name.startswith(".")], "files left aside"


def test_a_job_killed_by_a_signal_or_whose_command_is_missing_fails_with_its_reason(tmp_path):
    """What an on-call reads: a command that does not exist fails with the shell's own words in the run's output;
    a job killed by SIGKILL fails (exit code 137, as a shell reports it)."""
    jobs = tmp_path / "jobs.yml"
    jobs.write_text("jobs:\n  missing: ['/no/such/etl-command']\n  killed: ['/bin/sh', '-c', 'kill -9 $$']\n")
    backend = LocalJobsBackend(jobs, tmp_path / "state")
    missing = backend.trigger(TriggerRequest("missing", None, "t-missing"))
    killed = backend.trigger(TriggerRequest("killed", None, "t-killed"))
    statuses = {}
    for job, run_id in (("missing", missing), ("killed", killed)):
        deadline = time.monotonic() + 60
        while (status := backend.run_status(job, run_id)).outcome in (RunOutcome.PENDING, RunOutcome.RUNNING):
            assert time.monotonic() < deadline
            time.sleep(0.1)
        statuses[job] = status
    assert statuses["missing"].outcome is RunOutcome.FAILED and "exit code 127" in (statuses["missing"].message or "")
    assert "/no/such/etl-command" in "\n".join(statuses["missing"].output_tail or ())
    assert statuses["killed"].outcome is RunOutcome.FAILED and "exit code 137" in (statuses["killed"].message or "")
