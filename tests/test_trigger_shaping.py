"""Trigger shaping (issue 57): the ``trigger:`` and ``pools:`` sections of the run-policy file, and the holds
they put on a ready job's start (policies/trigger_shaping.py, applied by the triggering step of runner/tick.py)."""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone

import pytest
from cli_runner import run_cli

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.policies.run_policies import load_run_policies
from heartbeat_runner.policies.trigger_shaping import Cron

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
