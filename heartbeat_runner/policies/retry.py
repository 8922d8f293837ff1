"""The retry rules the tick applies on top of any jobs backend: automatic retry, maximum duration.

The ``retry`` settings of the run-policy file are parsed here (``retry_policies``); reading the file
is policies/run_policy_file.py's, building every section from one read policies/run_policies.py's.

Pure functions of counts and times, so the tick stays the only place with side effects
and every decision is reproducible from the events table.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.durations import parse_seconds
from heartbeat_runner.jobs.base import RunOutcome, RunStatus

T = TypeVar("T")


@dataclass(frozen=True)
class RetryDecision:
    retry_now: bool
    attempt: int                       # the attempt a retry would be (1 = first retry)
    not_before: datetime | None = None  # when the next retry becomes due (None: never)
    reason: str = ""


@dataclass(frozen=True)
class RetryPolicy:
    """Re-trigger a failed job automatically, with exponential back-off. Off by default.

    ``failures`` counts consecutive failed runs of the job for the same consumed data
    (the first run included), so ``max_retries=2`` allows three runs in all.
    """

    max_retries: int = 0
    backoff_s: float = 300.0
    multiplier: float = 2.0
    max_backoff_s: float = 3600.0
    #: what a run that the jobs service ends as a success with failures (Databricks SUCCESS_WITH_FAILURES:
    #: its leaf tasks succeeded, another task failed) is for this job: ``success`` (the default), ``failed``
    #: (any failed task fails it), or the task keys that must have succeeded (e.g. ``[etl]`` for a job whose
    #: last task is an ALL_DONE cleanup)
    success_with_failures: str | tuple[str, ...] = "success"

    def __post_init__(self) -> None:
        if self.max_retries < 0 or self.backoff_s < 0 or self.multiplier < 1 or self.max_backoff_s < 0:
            raise ValueError(f"invalid retry policy {self!r}: counts and delays must be >= 0, multiplier >= 1")
        choice = self.success_with_failures
        if isinstance(choice, str) and choice not in PARTIAL_CHOICES or not isinstance(choice, (str, tuple)) \
                or isinstance(choice, tuple) and (not choice or not all(isinstance(t, str) and t for t in choice)):
            raise ValueError(f"success_with_failures {choice!r}: expected 'success', 'failed' or a list of the "
                             "task keys that must have succeeded")

    def partial_success_counts(self, failed_tasks: tuple[str, ...] | None) -> bool:
        """Whether a success with failures whose failed tasks are ``failed_tasks`` (None: not known) is a success
        for this job. Invariant: ``success`` always says yes; ``failed`` always says no (some task failed); a
        list of task keys says yes exactly when the failed tasks are known and none of them is listed."""
        choice = self.success_with_failures
        if choice == "success":
            return True
        if choice == "failed" or failed_tasks is None:
            return False
        return not set(choice) & set(failed_tasks)

    @property
    def enabled(self) -> bool:
        return self.max_retries > 0

    @classmethod
    def from_mapping(cls, values: Mapping[str, float | str] | None) -> RetryPolicy:
        """From config such as ``{max_retries: 2, backoff_s: 60}``; unknown keys are an error.

        Values are numbers or numeric strings (YAML); the delays are durations (core/durations.py: a number
        of seconds, or ``90s``, ``5m``, ``1h``); anything else is a ValueError.
        """
        values = dict(values or {})
        # catch_up: the bounded catch-up policy of the same job (policies/catch_up.py reads it)
        values.pop("catch_up", None)
        values.pop("window", None)  # the event-time window policy (policies/event_windows.py)
        values.pop("trigger", None)  # the trigger shaping policy (policies/trigger_shaping.py)
        unknown = set(values) - {"max_retries", "backoff_s", "multiplier", "max_backoff_s", "success_with_failures"}
        if unknown:
            raise ValueError(f"unknown retry policy setting(s): {', '.join(sorted(unknown))}")
        return cls(max_retries=int(values.get("max_retries", cls.max_retries)),
                   backoff_s=parse_seconds(values.get("backoff_s", cls.backoff_s)),
                   multiplier=float(values.get("multiplier", cls.multiplier)),
                   max_backoff_s=parse_seconds(values.get("max_backoff_s", cls.max_backoff_s)),
                   success_with_failures=_partial_choice(values.get("success_with_failures", "success")))

    def delay(self, failures: int) -> timedelta:
        """Wait after the ``failures``-th consecutive failure before the next attempt."""
        backoff = Backoff(first_s=self.backoff_s, max_s=self.max_backoff_s, factor=self.multiplier)
        return timedelta(seconds=backoff.after(max(1, failures)))

    def decide(self, failures: int, last_failure_at: datetime, now: datetime) -> RetryDecision:
        """Should a job that failed ``failures`` times in a row, last at ``last_failure_at``, run again now?"""
        attempt = failures
        if failures < 1:
            return RetryDecision(False, 0, None, "the job has not failed")
        if failures > self.max_retries:
            return RetryDecision(False, attempt, None,
                                 f"gave up after {failures} failed run(s) (max_retries={self.max_retries})")
        due = last_failure_at + self.delay(failures)
        if now < due:
            return RetryDecision(False, attempt, due, f"retry {attempt} of {self.max_retries} due at {due.isoformat()}")
        return RetryDecision(True, attempt, due, f"retry {attempt} of {self.max_retries}")


#: The words ``success_with_failures`` accepts besides a list of task keys.
PARTIAL_CHOICES = ("success", "failed")


def _partial_choice(value: object) -> str | tuple[str, ...]:
    """``success_with_failures`` as written in YAML: a word, or a list of task keys (kept as a tuple)."""
    return tuple(str(v) for v in value) if isinstance(value, list) else str(value)


@dataclass(frozen=True)
class RetryPolicies:
    """The retry policy of each job: a default (off unless set) and per-job overrides."""

    default: RetryPolicy = RetryPolicy()
    jobs: Mapping[str, RetryPolicy] = field(default_factory=dict)

    def for_job(self, job_id: str) -> RetryPolicy:
        return self.jobs.get(job_id, self.default)


def retry_policies(data: Mapping[str, Any]) -> RetryPolicies:
    """The retry policies of a run-policy mapping; ValueError when it is malformed."""
    if set(data) - {"default", "jobs", "alerts", "pools"}:
        raise ValueError("expected only the keys 'default', 'jobs', 'alerts' (policies/alerts.py) and 'pools' "
                         "(policies/trigger_shaping.py)")
    jobs = data.get("jobs") or {}
    if not isinstance(jobs, dict):
        raise ValueError("'jobs' must map job ids to policies")
    return RetryPolicies(default=RetryPolicy.from_mapping(data.get("default")),
                         jobs={str(job): RetryPolicy.from_mapping(values) for job, values in jobs.items()})


def retry_token(base_token: str, attempt: int) -> str:
    """Idempotency token of retry ``attempt`` of a request: deterministic, distinct, at most 64 chars.

    Deterministic so that a crash between recording the retry and calling the API
    replays the same token (no second run); distinct per attempt so the jobs API does
    not just hand back the failed run.
    """
    if attempt < 1:
        return base_token
    return hashlib.sha256(f"{base_token}\x1fretry\x1f{attempt}".encode()).hexdigest()[:36]


def overrun(status: RunStatus, max_duration: timedelta | None, now: datetime | None = None) -> timedelta | None:
    """How far past ``max_duration`` an unfinished run is (None: within bounds, finished, or no limit)."""
    if max_duration is None or status.outcome.finished or status.start_time is None:
        return None
    if status.outcome is RunOutcome.PENDING:
        return None  # queued runs have not started working yet
    now = now or datetime.now(timezone.utc)
    start = status.start_time if status.start_time.tzinfo else status.start_time.replace(tzinfo=timezone.utc)
    over = now - start - max_duration
    return over if over > timedelta(0) else None
