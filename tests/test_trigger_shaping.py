"""Trigger shaping (issue 57): the ``trigger:`` and ``pools:`` sections of the run-policy file, and the holds
they put on a ready job's start (policies/trigger_shaping.py, applied by the triggering step of runner/tick.py)."""

from __future__ import annotations

import json
import math
import os
import pprint
import re
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest
from cli_runner import run_cli
from harness import config_row as row

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.policies.run_policies import load_run_policies
from heartbeat_runner.policies.trigger_shaping import Candidate, Cron, HoldKind, ReleaseReason, hold_decisions

GOOD = """\
pools:
  warehouse: {max_running: 2}
default:
  trigger: {min_interval: 5m}
jobs:
  "J1":
    max_retries: 1
    trigger: {min_interval: 15m, quiet_for: 2m, max_wait: 30m, at: "0 6 * * * Europe/Berlin", pool: warehouse,
              priority: 10}
"""


def test_the_trigger_and_pools_sections_are_parsed_with_the_one_duration_grammar(tmp_path):
    path = tmp_path / "policies.yml"
    path.write_text(GOOD)
    policies = load_run_policies(path)
    j1 = policies.trigger.for_job("J1")
    assert (j1.min_interval_s, j1.quiet_for_s, j1.max_wait_s, j1.pool, j1.priority) == (900, 120, 1800, "warehouse", 10)
    assert str(j1.at) == "0 6 * * * Europe/Berlin"
    assert policies.trigger.for_job("J2").min_interval_s == 300           # the default
    assert policies.trigger.pools == {"warehouse": 2}
    assert policies.retry.for_job("J1").max_retries == 1                   # beside the other sections
    assert "J1" in policies.jobs()
    (tmp_path / "none.yml").write_text('jobs: {"J1": {max_retries: 1}}\n')
    assert not load_run_policies(tmp_path / "none.yml").trigger.enabled    # opt-in: off without a section


@pytest.mark.parametrize(("text", "field", "words"), [
    ('jobs: {J1: {trigger: {min_interval: soon}}}', "jobs.J1.trigger.min_interval", "'soon' is not a duration"),
    ('jobs: {J1: {trigger: {quiet_for: -2m}}}', "jobs.J1.trigger.quiet_for", "is not a duration"),
    ('jobs: {J1: {trigger: {pool: nope}}}', "jobs.J1.trigger.pool", "unknown pool 'nope'"),
    ('pools: {w: {max_running: 0}}', "pools.w.max_running", "0 is not a whole number of at least 1"),
    ('jobs: {J1: {trigger: {at: "61 6 * * *"}}}', "jobs.J1.trigger.at", "cron minute '61' is out of range 0-59"),
    ('jobs: {J1: {trigger: {at: "0 6 32 * *"}}}', "jobs.J1.trigger.at", "cron day of month '32' is out of range"),
    ('jobs: {J1: {trigger: {at: "0 6 * * * Mars/Base"}}}', "jobs.J1.trigger.at", "unknown time zone 'Mars/Base'"),
    ('default: {trigger: {priority: high}}', "default.trigger.priority", "'high' is not a whole number"),
    ('jobs: {J1: {trigger: {max_wait: 5m}}}', "jobs.J1.trigger.max_wait", "needs quiet_for"),
    ('jobs: {J1: {trigger: {min_intervall: 5m}}}', "jobs.J1.trigger", "unknown setting(s) min_intervall"),
])
def test_a_bad_trigger_value_is_one_line_naming_the_file_the_job_and_the_field(tmp_path, text, field, words):
    path = tmp_path / "policies.yml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError) as raised:
        load_run_policies(path)
    (problem,) = raised.value.problems
    assert problem.startswith(f"{path}: invalid trigger policy: {field}") and words in problem, problem
    assert "\n" not in problem


def test_validate_and_run_refuse_a_bad_trigger_value_before_writing_anything(tmp_path):
    policies = tmp_path / "policies.yml"
    policies.write_text('pools: {w: {max_running: 1}}\njobs: {J1: {trigger: {min_interval: soon, pool: w}}}\n')
    env = {**os.environ, "HEARTBEAT_HOME": str(tmp_path / "lh"), "HEARTBEAT_CONFIG": str(tmp_path / "cfg.csv"),
           "HEARTBEAT_JOBS_FILE": str(tmp_path / "jobs.yml"), "HEARTBEAT_RUN_POLICY": str(policies)}
    for command in ("validate", "run"):
        proc = run_cli([command], env=env, cwd=tmp_path)
        assert proc.returncode == 1, proc
        assert (f"{policies}: invalid trigger policy: jobs.J1.trigger.min_interval: 'soon' is not a duration"
                in proc.stderr), proc.stderr
        assert "Traceback" not in proc.stderr
    assert not (tmp_path / "lh").exists()                              # nothing written


def test_the_cron_matcher_finds_the_latest_and_next_fire_times_in_its_zone():
    now = datetime(2026, 12, 1, 17, 0, tzinfo=timezone.utc)             # a Tuesday
    berlin = Cron.parse("0 6 * * * Europe/Berlin")
    assert berlin.latest(now) == datetime(2026, 12, 1, 5, 0, tzinfo=timezone.utc)
    assert berlin.next(now) == datetime(2026, 12, 2, 5, 0, tzinfo=timezone.utc)
    every = Cron.parse("*/15 * * * *")
    assert every.latest(now) == now and every.next(now) == now + timedelta(minutes=15)
    weekdays = Cron.parse("5/20 1-3 * * 1-5")
    assert weekdays.latest(now) == datetime(2026, 12, 1, 3, 45, tzinfo=timezone.utc)
    assert Cron.parse("0 0 29 2 *").next(now) == datetime(2028, 2, 29, tzinfo=timezone.utc)


# -- the holds on Sail, in process ----------------------------------------------------------------

def shaping(tmp_path, text):
    """The trigger shaping of a run-policy file holding ``text``."""
    path = tmp_path / "policies.yml"
    path.write_text(text)
    return load_run_policies(path).trigger


def local_jobs(hb, **seconds):
    """Local jobs that each sleep this long, then succeed."""
    lines = ["jobs:"] + [f"  {job!r}: [{sys.executable!r}, '-c', 'import time; time.sleep({s})']"
                         for job, s in seconds.items()]
    hb.jobs_path.write_text("\n".join(lines) + "\n")


def shaped(hb, policy):
    """A runner started with ``policy``, as a process starts with its policy file: a fresh one, so its first
    tick copies the policy to heartbeat_trigger_policies (a quiet period keeps its sources sensed)."""
    heartbeat = hb.new_runner()
    heartbeat.shaping = policy
    return heartbeat


def requests(hb, job):
    return [e for e in hb.events("TRIGGER_REQUESTED") if e["trigger_job_id"] == job]


def data_after_a_run(tmp_path, trigger: str):
    """A CLI lakehouse whose job J1 (local, leaves a marker) reads up.events under the policy ``trigger``: after
    the baseline, one run (the first, which no interval holds) and one more commit waiting."""
    from harness import HEADER, CliLakehouse, marker_jobs_file

    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("delta_table", "up.events", "J1")]) + "\n")
    policies = tmp_path / "policies.yml"
    policies.write_text(f"jobs: {{J1: {{trigger: {{{trigger}}}}}}}\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", "J1"),
                        env={"HEARTBEAT_RUN_POLICY": str(policies)})
    lake.home.mkdir()
    lake.append_ids("up.events", 0)
    lake.cli("seed")
    lake.cli("run")  # the baseline
    lake.append_ids("up.events", 1)
    lake.cli("run")  # the first run starts: an interval counts from here
    lake.append_ids("up.events", 2)
    return lake


def held_metrics(result) -> tuple[dict[str, float], float]:
    """What the metrics say after the loop counted ``result``: held jobs by hold kind, and the next release."""
    from heartbeat_runner.core.metrics import metrics
    from heartbeat_runner.policies.trigger_shaping import HoldKind
    from heartbeat_runner.runner.observability import count_tick

    count_tick(result, "local")
    registry = metrics().registry
    return ({kind.value: registry.get_sample_value("heartbeat_jobs_held", {"hold": kind.value}) for kind in HoldKind},
            registry.get_sample_value("heartbeat_trigger_hold_release_timestamp_seconds"))


@pytest.mark.engines("sail", "spark-classic")
def test_min_interval_spaces_runs_and_every_version_is_in_exactly_one_window(hb, tmp_path):
    """Commits closer than the minimum interval: the runs are spaced by it, a hold says until when, and every
    arrival is in exactly one run. The interval is three of this machine's ticks with data (3 s at least), so
    the commits are closer than it however loaded the machine is; the commits go on until a held run started."""
    hb.create_table("sales.orders", "id int")
    hb.seed(row("delta_table", "sales.orders", "J1"))
    local_jobs(hb, J1=0)
    hb.heartbeat.tick()  # baseline
    hb.insert("sales.orders", "(0)")
    began = time.monotonic()
    assert hb.heartbeat.tick().triggered_job_ids == ["J1"]        # a run before any policy: the pace of a tick
    interval = max(3, math.ceil(3 * (time.monotonic() - began)))
    heartbeat = shaped(hb, shaping(tmp_path, f"jobs: {{J1: {{trigger: {{min_interval: {interval}s}}}}}}\n"))
    held: list[str] = []
    value = 0
    seen_by_metrics = None
    released = False
    deadline = time.monotonic() + 30 * interval
    while not released and time.monotonic() < deadline:
        value += 1
        hb.insert("sales.orders", f"({value})")                   # a commit closer than the interval
        result = heartbeat.tick()
        held += [p.message for p in result.held]
        released = seen_by_metrics is not None and bool(result.triggered_job_ids)  # a run after a hold
        if result.held and seen_by_metrics is None:
            seen_by_metrics = (result.release_at, held_metrics(result))
        time.sleep(0.3)
    hb.wait_for_jobs()
    time.sleep(interval)
    heartbeat.tick()                                               # the last held data: released now
    hb.wait_for_jobs()
    starts = sorted(e["event_ts"] for e in requests(hb, "J1"))
    assert released, held
    assert all(b - a >= timedelta(seconds=interval) for a, b in zip(starts, starts[1:])), (interval, starts)
    assert any("held by min_interval until" in h for h in held), held
    release_at, (by_kind, next_release) = seen_by_metrics           # the metrics of a tick that held J1
    assert by_kind == {"min_interval": 1, "quiet_for": 0, "at": 0, "pool": 0}
    assert release_at is not None and next_release == release_at.timestamp()  # when that hold ends by itself
    new_data = {e["event_id"]: e for e in hb.events("NEW_DATA")}
    consumed = [i for e in requests(hb, "J1") for i in e["consumed_event_ids"].split(",")]
    assert sorted(consumed) == sorted(new_data), pprint.pformat({   # each arrival in exactly one run (a str: whole)
        "held": held, "starts": starts,
        "arrivals": [(e["event_ts"], e["event_id"], e["cursor_to"])
                     for e in sorted(new_data.values(), key=lambda e: e["event_ts"])],
        "runs": [(e["event_ts"], e["consumed_event_ids"]) for e in requests(hb, "J1")],
        "control": hb.rows("J1"),
        "other events": [(e["event_ts"], e["event_type"]) for e in hb.events() if e["event_type"] != "NEW_DATA"]},
        width=160)
    chain = sorted((json.loads(e["cursor_from"])["version"], json.loads(e["cursor_to"])["version"])
                   for e in new_data.values())
    assert all(a[1] == b[0] for a, b in zip(chain, chain[1:])), chain  # versions contiguous, none twice
    assert chain[0][0] == 0 and chain[-1][1] == value + 1          # from the table's creation to the last commit


def test_a_pool_of_two_never_runs_three_and_starts_the_highest_priorities_first(hb, tmp_path):
    hb.create_table("sales.orders", "id int")
    jobs = {"J1": 1, "J2": 5, "J3": 10, "J4": 3}                     # priorities
    hb.seed(*(row("delta_table", "sales.orders", job) for job in jobs))
    local_jobs(hb, J1=0.5, J2=3, J3=0.5, J4=0.5)                     # J3's place frees first
    policy = "pools: {warehouse: {max_running: 2}}\njobs:\n" + "".join(
        f"  {job}: {{trigger: {{pool: warehouse, priority: {p}}}}}\n" for job, p in jobs.items())
    heartbeat = shaped(hb, shaping(tmp_path, policy))
    heartbeat.tick()  # baseline
    hb.insert("sales.orders", "(1)")
    first = heartbeat.tick()
    assert sorted(first.triggered_job_ids) == ["J2", "J3"]           # the two highest priorities
    assert {p.job_id for p in first.held} == {"J1", "J4"}
    assert all("held by pool" in p.message and "pool warehouse full" in p.message for p in first.held)
    assert held_metrics(first) == ({"min_interval": 0, "quiet_for": 0, "at": 0, "pool": 2}, 0)  # no time hold
    started = {job: 0 for job in first.triggered_job_ids}            # job -> the tick that started it
    deadline, tick = time.monotonic() + 60, 0
    while len(started) < 4 and time.monotonic() < deadline:
        tick += 1
        started.update({job: tick for job in heartbeat.tick().triggered_job_ids})
        running = {job for job in jobs if "IN_PROGRESS" in hb.job_status(job)}
        assert len(running) <= 2, running                            # never three at once
        time.sleep(0.2)
    assert started["J4"] < started["J1"], started                    # priority 3 before priority 1
    assert held_metrics(heartbeat.tick())[0]["pool"] == 0             # none held any more
    release = {e["trigger_job_id"]: json.loads(e["payload"])["_release"] for e in hb.events("TRIGGER_REQUESTED")}
    assert all(reasons == ["pool room"] for reasons in release.values()), release


def test_a_pool_on_the_jobs_api_never_has_more_active_runs_than_its_places(hb, tmp_path):
    """The pool on the Databricks backend (the Jobs API stand-in, the real SDK): four jobs, two places. The
    workspace never holds more than two active runs of the pool's jobs, the highest priorities go first, and each
    run the workspace ends (in any order) frees a place for the next priority at the tick that records the end."""
    from databricks_jobs_server import JobsApiServer

    from heartbeat_runner.jobs.databricks import DatabricksJobsBackend

    priorities = {"101": 1, "102": 5, "103": 10, "104": 3}
    hb.create_table("sales.orders", "id int")
    hb.seed(*(row("delta_table", "sales.orders", job) for job in priorities))
    policy = "pools: {warehouse: {max_running: 2}}\njobs:\n" + "".join(
        f"  '{job}': {{trigger: {{pool: warehouse, priority: {p}}}}}\n" for job, p in priorities.items())
    with JobsApiServer() as api:
        for job in priorities:
            api.add_job(f"job_{job}", job_id=int(job))
        heartbeat = hb.app.heartbeat(backend=DatabricksJobsBackend(api.client()))
        heartbeat.shaping = shaping(tmp_path, policy)

        def active() -> list[str]:
            return sorted(str(run.job_id) for run in api.runs.values() if run.fate is None)

        heartbeat.tick()  # baseline
        hb.insert("sales.orders", "(1)")
        order = heartbeat.tick().triggered_job_ids
        assert sorted(order) == ["102", "103"] and active() == ["102", "103"]  # the two highest priorities
        for ends in ("102", "103", None, None):                  # the workspace ends the lower priority first
            ending = ends or active()[0]
            (run,) = [r for r in api.runs.values() if str(r.job_id) == ending and r.fate is None]
            api.finish_run(run.run_id, "SUCCESS")
            order += heartbeat.tick().triggered_job_ids
            assert len(active()) <= 2, active()
        assert order == ["103", "102", "104", "101"] or order == ["102", "103", "104", "101"], order
        assert sorted(str(run.job_id) for run in api.runs.values()) == sorted(priorities)  # each ran once


@pytest.mark.slow
def test_one_shot_runners_killed_and_racing_after_a_hold_still_start_the_held_run_once(tmp_path):
    """One-shot mode (a `run` process per tick), a minimum interval: data held by it, the process that releases
    it killed right after recording the request, then two runners at once: one run of the held data, with its
    release reason, at least the interval after the previous start; every arrival in exactly one run."""
    from concurrent.futures import ThreadPoolExecutor

    from heartbeat_runner.core.faults import CRASH_EXIT_CODE, FaultPoint

    # long enough that the next one-shot run comes within it on a loaded machine (CI: a 6 s interval had passed
    # by the time the second process ticked, 5 s of tick); waited for from the first run's end, not guessed
    interval = 15
    lake = data_after_a_run(tmp_path, f"min_interval: {interval}s")
    first_ended = time.monotonic()  # the first run started before this
    held = json.loads(lake.cli("run", "--json").stdout)
    assert [h["job_id"] for h in held["held"]] == ["J1"], held    # within the interval: held, nothing started
    assert lake.executions().get("J1") == 1
    time.sleep(max(0.0, first_ended + interval - time.monotonic()))
    crashed = lake.cli("run", check=False, env={"HEARTBEAT_CRASH_AT": FaultPoint.AFTER_TRIGGER_REQUESTED.value})
    assert crashed.returncode == CRASH_EXIT_CODE, crashed.stderr[-3000:]
    with ThreadPoolExecutor(max_workers=2) as pool:               # two runners at once after the kill
        for done in [pool.submit(lake.cli, "run", "--wait-lease", "120") for _ in range(2)]:
            done.result()
    lake.wait_local_runs()
    lake.cli("run")
    assert lake.executions().get("J1") == 2
    runs = lake.events("TRIGGER_REQUESTED")
    assert len(runs) == 2 and runs[1]["event_ts"] - runs[0]["event_ts"] >= timedelta(seconds=interval), runs
    assert json.loads(runs[1]["payload"])["_release"] == ["interval passed"]
    consumed = [i for e in runs for i in e["consumed_event_ids"].split(",")]
    assert sorted(consumed) == sorted(e["event_id"] for e in lake.events("NEW_DATA"))  # each arrival once


def test_an_automatic_retry_waits_for_room_in_its_pool(hb, tmp_path):
    from heartbeat_runner.policies.retry import RetryPolicies, RetryPolicy

    hb.create_table("sales.orders", "id int")
    hb.seed(row("delta_table", "sales.orders", "J1"), row("delta_table", "sales.orders", "J2"))
    hb.jobs_path.write_text(f"jobs:\n  J1: [{sys.executable!r}, '-c', 'raise SystemExit(1)']\n"
                            f"  J2: [{sys.executable!r}, '-c', 'import time; time.sleep(2)']\n")
    heartbeat = shaped(hb, shaping(tmp_path, "pools: {p: {max_running: 1}}\n"
                                             "jobs:\n  J1: {trigger: {pool: p, priority: 10}}\n  J2: {trigger: {pool: p}}\n"))
    heartbeat.policies = RetryPolicies(jobs={"J1": RetryPolicy(max_retries=1, backoff_s=0)})
    heartbeat.tick()  # baseline
    hb.insert("sales.orders", "(1)")
    assert heartbeat.tick().triggered_job_ids == ["J1"]            # the higher priority; J2 waits for room
    held_retry, retried, deadline = False, False, time.monotonic() + 60
    while not retried and time.monotonic() < deadline:
        result = heartbeat.tick()
        running = {job for job in ("J1", "J2") if "IN_PROGRESS" in hb.job_status(job)}
        assert len(running) <= 1, running                           # the pool's one place, retries included
        held_retry |= any(p.job_id == "J1" and "held by pool" in p.message for p in result.held)
        retried = "J1" in result.retried
        time.sleep(0.2)
    assert retried and held_retry                                   # the retry waited for J2's place


def test_quiet_for_starts_one_run_after_the_last_commit_and_max_wait_releases_under_constant_commits(hb, tmp_path):
    """QUIET gets a commit every tick, then none: one run, after the last. BUSY gets a commit every tick throughout:
    its max_wait releases it. The periods are in units of this machine's tick (the baseline's, 2 s at least), so
    the commits stay closer than the quiet period however loaded the machine is."""
    hb.create_table("sales.orders", "id int")
    hb.create_table("sales.stream", "id int")
    hb.seed(row("delta_table", "sales.orders", "QUIET"), row("delta_table", "sales.stream", "BUSY"))
    local_jobs(hb, QUIET=0, BUSY=0)
    began = time.monotonic()
    hb.heartbeat.tick()  # baseline
    quiet = max(2, math.ceil(2.5 * (time.monotonic() - began)))
    heartbeat = shaped(hb, shaping(tmp_path, f"jobs:\n  QUIET: {{trigger: {{quiet_for: {quiet}s}}}}\n"
                                             f"  BUSY: {{trigger: {{quiet_for: {quiet + 1}s, max_wait: {2 * quiet}s}}}}\n"))
    began, value = time.monotonic(), 0
    while time.monotonic() - began < 1.5 * quiet:                    # QUIET gets commits, then none
        value += 1
        hb.insert("sales.orders", f"({value})")
        hb.insert("sales.stream", f"({value})")
        assert "QUIET" not in heartbeat.tick().triggered_job_ids     # never while its data keeps coming
        time.sleep(0.4)
    while time.monotonic() - began < 4.5 * quiet:                    # BUSY keeps getting commits
        value += 1
        hb.insert("sales.stream", f"({value})")
        heartbeat.tick()
        time.sleep(0.4)
    hb.wait_for_jobs()
    quiet = requests(hb, "QUIET")
    assert len(quiet) == 1                                           # one run, after the last commit
    assert len(quiet[0]["consumed_event_ids"].split(",")) == len(
        [e for e in hb.events("NEW_DATA") if e["sensor_id"] == "sales.orders"])
    assert json.loads(quiet[0]["payload"])["_release"] == ["quiet"]
    busy = requests(hb, "BUSY")
    assert busy, "max_wait never released the busy job"
    assert json.loads(busy[0]["payload"])["_release"] == ["max_wait reached"]


# -- the rule alone (pure function, fixed clock) ---------------------------------------------------

NOW = datetime(2026, 12, 1, 17, 0, tzinfo=timezone.utc)


def test_at_starts_once_per_fire_time_and_waits_for_the_next_one(tmp_path):
    policy = shaping(tmp_path, 'jobs: {J1: {trigger: {at: "0 6 * * * Europe/Berlin"}}}\n')
    fire = datetime(2026, 12, 1, 5, 0, tzinfo=timezone.utc)            # 06:00 in Berlin
    ran_before = Candidate("J1", last_start=fire - timedelta(hours=1), added_at=fire - timedelta(days=9))
    assert hold_decisions(policy, [ran_before], [], NOW).released == {"J1": (ReleaseReason.FIRE_TIME,)}
    ran_since = Candidate("J1", last_start=fire + timedelta(minutes=1), added_at=fire - timedelta(days=9))
    hold = hold_decisions(policy, [ran_since], [], NOW).held["J1"]
    assert (hold.kind, hold.until) == (HoldKind.AT, fire + timedelta(days=1))   # at most one run per fire
    added_after = Candidate("J1", added_at=fire + timedelta(hours=2))          # a new job: from the next fire
    assert hold_decisions(policy, [added_after], [], NOW).held["J1"].kind is HoldKind.AT


def test_operators_skip_the_time_holds_but_count_against_the_pool_and_retries_keep_the_interval(tmp_path):
    policy = shaping(tmp_path, "pools: {p: {max_running: 1}}\n"
                               "default: {trigger: {min_interval: 1h, quiet_for: 10m, pool: p}}\n")
    recent = dict(last_start=NOW - timedelta(minutes=5), first_arrival=NOW - timedelta(minutes=1),
                  last_arrival=NOW - timedelta(minutes=1))
    operator = hold_decisions(policy, [Candidate("J1", operator=True, **recent)], [], NOW)
    assert operator.released == {"J1": (ReleaseReason.OPERATOR, ReleaseReason.POOL_ROOM)}
    full = hold_decisions(policy, [Candidate("J1", operator=True, **recent)], ["J2"], NOW)
    assert full.held["J1"].kind is HoldKind.POOL and "running J2" in full.held["J1"].detail
    retry = hold_decisions(policy, [Candidate("J1", follow_up=True, **recent)], [], NOW)
    assert retry.held["J1"].kind is HoldKind.MIN_INTERVAL
    assert retry.held["J1"].until == NOW + timedelta(minutes=55)
    later = dict(recent, last_start=NOW - timedelta(hours=2))
    assert hold_decisions(policy, [Candidate("J1", follow_up=True, **later)], [], NOW).released == {
        "J1": (ReleaseReason.INTERVAL_PASSED, ReleaseReason.POOL_ROOM)}          # no quiet period for a retry
    assert hold_decisions(policy, [Candidate("J1", **later)], [], NOW).held["J1"].kind is HoldKind.QUIET


def test_explain_says_which_hold_applies_and_until_when_and_an_operator_skips_it(hb, tmp_path):
    from cli_runner import run_cli

    from heartbeat_runner.interfaces.operations import ask_trigger, trigger_hold
    from heartbeat_runner.interfaces.ui.data import JobPhase, overview

    hb.create_table("sales.orders", "id int")
    hb.seed(row("delta_table", "sales.orders", "J1"))
    local_jobs(hb, J1=0)
    policy = shaping(tmp_path, "jobs: {J1: {trigger: {min_interval: 1h}}}\n")
    heartbeat = shaped(hb, policy)
    heartbeat.tick()  # baseline
    hb.insert("sales.orders", "(1)")
    assert heartbeat.tick().triggered_job_ids == ["J1"]           # never ran: no interval to wait for
    hb.wait_for_jobs()
    hb.insert("sales.orders", "(2)")
    (held,) = heartbeat.tick().held
    start = requests(hb, "J1")[0]["event_ts"]
    outlook = trigger_hold(hb.app.store, policy, "J1", is_ready=True)
    assert outlook is not None and outlook.held
    said = outlook.text
    assert said == held.message
    later = trigger_hold(hb.app.store, policy, "J1", is_ready=True, now=start + timedelta(hours=2))
    assert later is not None and not later.held, later                # the same facts an interval on: no hold
    assert later.text == f"no hold: starts at the next tick ({ReleaseReason.INTERVAL_PASSED.value})", later
    assert said.startswith(f"held by min_interval until {(start + timedelta(hours=1)).isoformat(timespec='seconds')}")
    (job,) = overview(hb.app.store, shaping=policy)               # what `status` and the page show of J1
    assert job.phase is JobPhase.READY and job.verdict == f"{overview(hb.app.store)[0].verdict}; {said}"
    env = {**os.environ, **hb.settings.lakehouse_env(), "HEARTBEAT_HOME": str(hb.home),
           "HEARTBEAT_CONFIG": str(hb.config_path), "HEARTBEAT_JOBS_FILE": str(hb.jobs_path),
           "HEARTBEAT_RUN_POLICY": str(tmp_path / "policies.yml"), "COLUMNS": "200"}
    status = run_cli(["status"], env=env, cwd=hb.root)
    assert status.returncode == 0 and "held by min_interval until" in status.stdout, status.stdout + status.stderr
    rows = json.loads(run_cli(["status", "--json"], env=env, cwd=hb.root).stdout)
    assert {row["trigger_hold"] for row in rows if row["trigger_job_id"] == "J1"} == {said}
    explained = run_cli(["explain", "--job-id", "J1"], env=env, cwd=hb.root)
    assert f"trigger: {said}" in explained.stdout, explained.stdout + explained.stderr
    assert json.loads(run_cli(["explain", "--job-id", "J1", "--json"], env=env, cwd=hb.root).stdout)["trigger_hold"] == said
    assert "J1" in {r["trigger_job_id"] for r in hb.app.store.read("heartbeat_trigger_policies")}
    ask_trigger(hb.app, "J1", by="ops")                            # an operator's trigger skips the interval
    assert heartbeat.tick().triggered_job_ids == ["J1"]
    last = requests(hb, "J1")[-1]
    assert json.loads(last["payload"])["_release"] == ["operator's run"] and "manual run asked by ops" in last["message"]
    assert len(last["consumed_event_ids"].split(",")) == 1        # the held data, consumed once


@pytest.mark.slow
def test_a_loop_polls_when_a_hold_ends_not_at_its_next_interval(tmp_path):
    """`run --loop --interval 600` with a 40 s minimum interval: data held by it starts its run once the
    interval has passed, not ten minutes later (the loop's next poll is the hold's end). The interval outlasts
    the loop's cold start on a loaded machine (with 15 s, a loop that took longer to start found nothing held)."""
    import signal

    lake = data_after_a_run(tmp_path, "min_interval: 40s")
    loop = lake.start("run", "--loop", "--interval", "600")  # its first tick finds the new data held
    try:
        deadline = time.monotonic() + 150
        while lake.executions().get("J1", 0) < 2 and time.monotonic() < deadline and loop.poll() is None:
            time.sleep(0.2)
    finally:
        loop.send_signal(signal.SIGTERM)
        out, err = loop.communicate(timeout=60)
    assert lake.executions().get("J1") == 2, out + err
    first = re.search(r"tick 1 · OK .* next in ([0-9.]+) s", err)
    assert first and float(first.group(1)) < 60, err  # the loop said it polls at the hold's end
    starts = [e["event_ts"] for e in lake.events("TRIGGER_REQUESTED")]
    assert len(starts) == 2 and starts[1] - starts[0] >= timedelta(seconds=40), starts
