"""The run-policy YAML as a whole: retry, catch-up, event-time window, alert and trigger policies, built once.

Each section has its own parser (``policies/retry.py``, ``policies/catch_up.py``, ``policies/event_windows.py``,
``policies/alerts.py``); ``load_run_policies`` builds them all from one read of the file
(``policies/run_policy_file.py``) and reports every problem together. It is the one loader of the
file: the runner, ``validate``, ``explain``, the alert commands and the status page all ask it, and it
builds the policies once per content of the file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.policies.alerts import AlertPolicies, alert_policies, destination_problems
from heartbeat_runner.policies.catch_up import CatchUpPolicy, catch_up_policies
from heartbeat_runner.policies.event_windows import WindowPolicy, window_policies
from heartbeat_runner.policies.retry import RetryPolicies, retry_policies
from heartbeat_runner.policies.run_policy_file import (
    build_section,
    built_from_file,
    missing_file_problem,
    policy_problem,
)
from heartbeat_runner.policies.trigger_shaping import TriggerShaping, trigger_shaping

T = TypeVar("T")


@dataclass(frozen=True)
class RunPolicies:
    """Every job's run policies: retry, catch-up (a backlog cut into runs), event-time windows."""

    retry: RetryPolicies = field(default_factory=RetryPolicies)
    catch_up: Mapping[str, CatchUpPolicy] = field(default_factory=dict)
    windows: Mapping[str, WindowPolicy] = field(default_factory=dict)
    alerts: AlertPolicies = field(default_factory=AlertPolicies)
    #: per-job holds on a ready job's start and the pools (policies/trigger_shaping.py); opt-in
    trigger: TriggerShaping = field(default_factory=TriggerShaping)

    def jobs(self) -> set[str]:
        """The job ids the file names (``"*"``, the default, is none of them)."""
        return (set(self.retry.jobs) | set(self.catch_up) | set(self.windows) | set(self.alerts.jobs)
                | set(self.trigger.jobs)) - {"*"}

    def unknown_jobs(self, known: Iterable[str]) -> list[str]:
        """Job ids with a policy but no row in the config (a typo, or a job removed since)."""
        return sorted(self.jobs() - set(known))


def load_run_policies(path: Path | None) -> RunPolicies:
    """Every policy of the run-policy YAML at ``path`` (none when there is no file), built once per content
    of the file (an edited file is built again at the next call).

    ConfigError listing each section's problem, each naming the file and the policy.
    """
    return built_from_file(path, _built)


def _built(path: Path | None, data: Mapping[str, Any]) -> RunPolicies:
    """Every section of the run-policy mapping ``data``; ConfigError with every section's problems."""
    problems: list[str] = []

    def section(name: str, build: Callable[[Mapping[str, Any]], T], empty: T) -> T:
        try:
            return build_section(data, path, name, build)
        except ConfigError as exc:
            problems.extend(exc.problems)
            return empty

    policies = RunPolicies(retry=section("retry", retry_policies, RetryPolicies()),
                           catch_up=section("catch_up", catch_up_policies, {}),
                           windows=section("window", window_policies, {}),
                           alerts=section("alerts", alert_policies, AlertPolicies()),
                           trigger=section("trigger", trigger_shaping, TriggerShaping()))
    if problems:
        raise ConfigError(problems)
    return policies


def alert_destination_problems(path: Path | None, alerts: AlertPolicies,
                               environ: Mapping[str, str] | None = None) -> list[str]:
    """What this machine's environment lacks to send to the alert destinations of the file at ``path`` (an
    unset variable, a webhook URL without scheme or host, a malformed routing key), each naming the file and
    the field, never a secret's value. ``validate`` reports them; ``run`` refuses to start a tick with one."""
    found = destination_problems(alerts.destinations, os.environ if environ is None else environ)
    return [policy_problem(path, "alerts", problem) for problem in found]


def check_alert_destinations(path: Path | None, alerts: AlertPolicies) -> None:
    """ConfigError with every problem of ``alert_destination_problems`` (nothing when there is none)."""
    problems = alert_destination_problems(path, alerts)
    if problems:
        raise ConfigError(problems)


def runnable_policies(path: Path | None, variable: str = "HEARTBEAT_RUN_POLICY") -> RunPolicies:
    """The run policies a runner may start with: the file that ``variable`` names exists, every section is
    valid and every alert destination can be sent to. ConfigError otherwise, naming the variable and the
    path for a missing file. ``run`` asks this before it opens the lakehouse or claims the tick lease, so a
    refused run touches nothing."""
    missing = missing_file_problem(path, variable)
    if missing is not None:
        raise ConfigError([missing])
    policies = load_run_policies(path)
    check_alert_destinations(path, policies.alerts)
    return policies
