"""The local jobs backend starts a token's run once, whatever state a crash left its claim in.

Real job processes; the claim files are the backend's own (``<state>/tokens/<token>``).
"""

from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from heartbeat_runner.jobs.base import RunOutcome, TriggerRequest
from heartbeat_runner.jobs.local import LocalJobsBackend

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
