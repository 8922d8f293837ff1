"""The run-policy file: read and built once per content, one duration grammar in every section."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.core.windows import WindowLimit
from heartbeat_runner.policies.run_policies import load_run_policies
from heartbeat_runner.policies.run_policy_file import read_policy_file


def test_the_policies_are_built_once_per_content_of_the_file(tmp_path):
    path = tmp_path / "policies.yml"
    path.write_text('jobs: {"42": {max_retries: 2}}\n')
    first = load_run_policies(path)
    assert load_run_policies(path) is first  # the eight callers of one process share one build
    path.write_text('jobs: {"42": {max_retries: 3}}\n')  # same size, maybe the same mtime: the bytes differ
    assert load_run_policies(path).retry.for_job("42").max_retries == 3


def test_a_caller_changing_its_mapping_does_not_change_the_next_callers(tmp_path):
    path = tmp_path / "policies.yml"
    path.write_text('default: {max_retries: 1}\n')
    read_policy_file(path)["default"]["max_retries"] = 9
    assert read_policy_file(path) == {"default": {"max_retries": 1}}


def test_a_broken_file_is_refused_each_time_and_a_missing_one_is_no_policy(tmp_path):
    path = tmp_path / "policies.yml"
    path.write_text('jobs: {"42": {max_retries: 2, backof_s: 60}}\n')
    for _ in range(2):
        with pytest.raises(ConfigError, match="unknown retry policy setting"):
            load_run_policies(path)
    os.remove(path)
    assert not load_run_policies(path).jobs()


def test_every_section_takes_the_one_duration_grammar(tmp_path):
    path = tmp_path / "policies.yml"
    path.write_text('default: {backoff_s: 1.5m, max_backoff_s: 1h}\n'
                    'jobs:\n'
                    '  "H": {window: {size: 1.5h, lateness: 90s}}\n'
                    '  "C": {catch_up: {max_window: 1w}}\n'
                    'alerts:\n'
                    '  group_interval: 1w\n')
    policies = load_run_policies(path)
    assert policies.retry.default.backoff_s == 90 and policies.retry.default.max_backoff_s == 3600
    assert (policies.windows["H"].size_s, policies.windows["H"].lateness_s) == (5400, 90)
    assert policies.catch_up["C"].max_window == WindowLimit(span=timedelta(weeks=1))
    assert WindowLimit.parse("1.5h") == WindowLimit(span=timedelta(minutes=90))


@pytest.mark.parametrize(("text", "words"), [
    ('default: {backoff_s: -5}', "invalid retry policy"),
    ('jobs: {"H": {window: {size: soon}}}', "expected a span"),
    ('jobs: {"C": {catch_up: {max_window: -1d}}}', "max_window '-1d'"),
    ('alerts: {group_interval: 2y}', "alerts.group_interval: '2y' is not a duration such as 90s"),
])
def test_a_bad_duration_in_any_section_names_the_file_and_the_field(tmp_path, text, words):
    path = tmp_path / "policies.yml"
    path.write_text(text + "\n")
    with pytest.raises(ConfigError, match="policies.yml") as raised:
        load_run_policies(path)
    assert words in str(raised.value)
