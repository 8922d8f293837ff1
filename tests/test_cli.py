"""The CLI in separate processes: state survives between invocations; clear errors; --json."""

import json
import os
import subprocess
import sys

import pytest
from cli_runner import run_cli
from harness import HEADER
from harness import config_row as row


def cli(tmp_path, *args, check=True, env=None):
    """``python -m heartbeat_runner *args`` on the lakehouse under ``tmp_path`` (in this process where that
    answers as a process does: tests/cli_runner.py; a test marked ``cli_processes`` runs real ones)."""
    env = {**os.environ, **(env or {}), "HEARTBEAT_HOME": str(tmp_path / "lh"), "HEARTBEAT_TRIGGER_DIR": str(tmp_path / "triggers"),
           "HEARTBEAT_JOBS_FILE": str(tmp_path / "jobs.yml"), "HEARTBEAT_CONFIG": str(tmp_path / "cfg.csv")}
    proc = run_cli(list(args), env=env, cwd=tmp_path, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr}")
    return proc


@pytest.mark.slow
@pytest.mark.cli_processes  # its point: what one process recorded, the next reads
def test_state_survives_across_processes(tmp_path):
    (tmp_path / "cfg.csv").write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    (tmp_path / "jobs.yml").write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'print(1)']\n")
    cli(tmp_path, "seed")
    cli(tmp_path, "run")  # baseline
    (tmp_path / "triggers" / "drop").mkdir(parents=True)
    (tmp_path / "triggers" / "drop" / "a.done").write_text("x")
    out = cli(tmp_path, "run", "--json")
    tick = json.loads(out.stdout)
    assert [t["job_id"] for t in tick["triggered"]] == ["J1"]
    status = json.loads(cli(tmp_path, "status", "--json").stdout)
    assert [r["status"] for r in status] == ["IN_PROGRESS"]
    cli(tmp_path, "complete", "--job-id", "J1")
    status = json.loads(cli(tmp_path, "status", "--json").stdout)
    assert [r["status"] for r in status] == ["COMPLETED"] and status[0]["job_end_timestamp"]
    table = cli(tmp_path, "status", "--wide").stdout
    assert "TRIGGER_JOB_ID" in table and "COMPLETED" in table
    view = cli(tmp_path, "status").stdout
    assert any(line.split()[:3] == ["J1", "job_J1", "idle"] for line in view.splitlines()), view


def test_bad_config_is_refused_and_nothing_is_written(tmp_path):
    (tmp_path / "cfg.csv").write_text("\n".join([HEADER, row("delta_table", "db.t", "J1")]) + "\n")
    cli(tmp_path, "seed")
    before = json.loads(cli(tmp_path, "status", "--json").stdout)
    (tmp_path / "cfg.csv").write_text("\n".join([HEADER, row("delta_table", "db.t", "J1", state="MAYBE")]) + "\n")
    for command in ("validate", "seed"):
        proc = cli(tmp_path, command, check=False)
        assert proc.returncode == 1
        assert f"{tmp_path / 'cfg.csv'}: line 2, column job_state" in proc.stderr
    assert json.loads(cli(tmp_path, "status", "--json").stdout) == before


def test_validate_checks_the_config_and_the_run_policies_together_and_reports_every_problem(tmp_path):
    """One run of ``validate`` names every problem of both files (the CSV's row and field, the policy's job
    and setting), warns about a policy for a job no row triggers, and lists the policies in --json."""
    config, policies = tmp_path / "cfg.csv", tmp_path / "policies.yml"
    env = {"HEARTBEAT_RUN_POLICY": str(policies)}
    config.write_text("\n".join([HEADER, row("delta_table", "db.t", "J1"), row("delta_table", "db.t", "J2"),
                                 row("delta_table", "db.u", "J3", state="MAYBE")]) + "\n")
    policies.write_text("jobs:\n  J1: {window: {size: 1h}}\n  J2: {window: {size: 90m}, max_retries: 2}\n"
                        "  J3: {catch_up: {max_window: 7x}}\n")
    proc = cli(tmp_path, "validate", check=False, env=env)
    assert proc.returncode == 1 and "nothing was written" in proc.stderr
    assert f"{config}: line 4, column job_state" in proc.stderr                     # the CSV's problem
    assert f"{policies}: invalid catch_up policy: max_window '7x'" in proc.stderr   # and the policy's

    config.write_text("\n".join([HEADER, row("delta_table", "db.t", "J1"), row("delta_table", "db.t", "J2")]) + "\n")
    policies.write_text("jobs:\n  J1: {window: {size: 1h}}\n  J2: {window: {size: 90m}}\n")
    proc = cli(tmp_path, "validate", check=False, env=env)
    assert proc.returncode == 1
    assert f"{policies}: invalid window policy: delta_table:db.t: window sizes [3600, 5400] s" in proc.stderr

    policies.write_text("jobs:\n  J1: {window: {size: 1h}}\n  J2: {window: {size: 2h}, max_retries: 2}\n"
                        "  J9: {max_retries: 1}\n")
    proc = cli(tmp_path, "validate", env=env)
    assert f"{policies}: 3 retry, 0 catch-up and 2 window policy(ies): valid" in proc.stdout
    assert "job J9, which no config row triggers" in proc.stdout
    found = json.loads(cli(tmp_path, "validate", "--json", env=env).stdout)["run_policies"]
    assert (found["window"], found["retry"], found["unknown_jobs"]) == (["J1", "J2"], ["J1", "J2", "J9"], ["J9"])
    missing = cli(tmp_path, "validate", check=False, env={"HEARTBEAT_RUN_POLICY": str(tmp_path / "polices.yml")})
    assert missing.returncode == 1
    assert f"HEARTBEAT_RUN_POLICY names {tmp_path / 'polices.yml'}, which does not exist" in missing.stderr


def _lakehouse_files(root):
    """Every file of the lakehouse with its size and modification time: what a refused command must not change."""
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in root.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_missing_or_bad_run_policy_file_is_refused_before_anything_is_touched(tmp_path):
    """HEARTBEAT_RUN_POLICY naming a file that is not there (a typo) stops ``run``, ``run --loop`` and ``validate``
    with exit 1 and one line naming the variable and the path, as does a file with a bad policy; in every case
    before the lakehouse is opened: no file of it changes (the tick lease is not claimed, no run row)."""
    (tmp_path / "cfg.csv").write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    (tmp_path / "jobs.yml").write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'print(1)']\n")
    cli(tmp_path, "seed")
    before = _lakehouse_files(tmp_path / "lh")
    typo = tmp_path / "run_polcy.yml"
    for args in (["run"], ["run", "--loop", "--interval", "1"], ["validate"]):
        proc = cli(tmp_path, *args, check=False, env={"HEARTBEAT_RUN_POLICY": str(typo)})
        assert proc.returncode == 1, proc
        assert f"HEARTBEAT_RUN_POLICY names {typo}, which does not exist" in proc.stderr
        assert "Traceback" not in proc.stderr
    bad = tmp_path / "run_policy.yml"
    bad.write_text("jobs:\n  J1: {catch_up: {max_window: 7x}}\n")
    for args in (["run"], ["run", "--loop", "--interval", "1"]):
        proc = cli(tmp_path, *args, check=False, env={"HEARTBEAT_RUN_POLICY": str(bad)})
        assert proc.returncode == 1 and f"{bad}: invalid catch_up policy: max_window '7x'" in proc.stderr, proc
    assert _lakehouse_files(tmp_path / "lh") == before
    assert not json.loads(cli(tmp_path, "runs", "--json").stdout)


def test_commands_before_seed_explain_what_to_do(tmp_path):
    proc = cli(tmp_path, "run", check=False)
    assert proc.returncode == 1 and "run `python -m heartbeat_runner seed` first" in proc.stderr


def test_pause_unknown_job_is_a_clear_error(tmp_path):
    (tmp_path / "cfg.csv").write_text("\n".join([HEADER, row("delta_table", "db.t", "J1")]) + "\n")
    cli(tmp_path, "seed")
    proc = cli(tmp_path, "pause", "--job-id", "NOPE", check=False)
    assert proc.returncode == 1 and "job 'NOPE' is not in the control table" in proc.stderr
    cli(tmp_path, "pause", "--job-id", "J1")
    status = json.loads(cli(tmp_path, "status", "--json").stdout)
    assert status[0]["job_state"] == "PAUSED"


def test_a_tick_lists_a_job_whose_own_complete_it_saw_beside_those_it_reconciled():
    from heartbeat_runner.interfaces.demo import completed_during

    before = {"101": {"IN_PROGRESS"}, "102": {"IN_PROGRESS"}, "103": {"COMPLETED"}}
    after = {"101": {"COMPLETED"}, "102": {"COMPLETED"}, "103": {"COMPLETED"}}
    assert completed_during(before, after, ["101"]) == ["101", "102 (its own `complete`)"]
    assert completed_during(before, {**after, "102": {"IN_PROGRESS"}}, []) == ["101 (its own `complete`)"]


@pytest.mark.slow
def test_the_demos_last_tick_lists_job_102_which_ended_with_its_own_complete(tmp_path):
    """Job 102 ends with the spec's final task (`complete`); the tick that sees that end said "completed: none",
    and with OpenLineage on (the client's file transport) 102's COMPLETE was never sent: now 3 START, 3 COMPLETE."""
    from collections import Counter

    pytest.importorskip("openlineage.client", reason="openlineage-python (the lineage extra)")
    sent = tmp_path / "lineage.jsonl"
    (tmp_path / "openlineage.yml").write_text(f"transport:\n  type: file\n  log_file_path: {sent}\n  append: true\n")
    proc = subprocess.run([sys.executable, "-m", "heartbeat_runner", "demo", "--lakehouse-dir", str(tmp_path / "demo")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "OPENLINEAGE_CONFIG": str(tmp_path / "openlineage.yml")})
    assert proc.returncode == 0, proc.stderr[-3000:]
    kinds = Counter(json.loads(line)["eventType"] for line in sent.read_text().splitlines() if line.strip())
    assert kinds == Counter({"START": 3, "COMPLETE": 3})
    ticks = [line for line in proc.stdout.splitlines() if line.strip().startswith("tick:")]
    # usually "completed: 102 (its own `complete`)"; "completed: 102" when its exit code was reconciled first
    assert "102" in ticks[-1].split("; completed: ", 1)[1], ticks
