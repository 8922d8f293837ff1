"""The small interface every jobs backend implements.

Exactly-once rests on one property: ``trigger`` is idempotent on
``TriggerRequest.idempotency_token``. Calling it again with the same token (after a
crash, a retry, or from a second runner) must return the run the first call created
and never start a second one.
"""

from __future__ import annotations

import abc
import enum
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from heartbeat_runner.core.backoff import Backoff
from heartbeat_runner.core.errors import JobsBackendError
from heartbeat_runner.core.secrets import redact
from heartbeat_runner.core.settings import Settings
from heartbeat_runner.jobs.calls import ApiBudget, Calls, call_all

if TYPE_CHECKING:  # pragma: no cover
    from heartbeat_runner.sensing.watch import Watch


class RunOutcome(str, enum.Enum):
    """A run's fate as the tick sees it. SKIPPED: the jobs service ended the run without executing it (e.g.
    the job's maximum concurrent runs were reached): its request is asked again, with a new token (after a
    back-off when ``RunStatus.backoff``: a workspace limit). REFUSED: the jobs service will not run the job
    at all (the job is disabled, a budget policy's limit is reached): a terminal non-run, never asked again
    by itself (the job is REFUSED, blocked with a JOB_REFUSED alert until an operator's retry)."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    REFUSED = "REFUSED"

    @property
    def finished(self) -> bool:
        return self in (RunOutcome.SUCCESS, RunOutcome.FAILED, RunOutcome.SKIPPED, RunOutcome.REFUSED)


#: Back-off before the data of a run that a workspace limit stopped (``RunStatus.backoff``) is asked for again:
#: after the n-th skipped run of the same data, ``first_s * 2^(n-1)`` from the latest skip, at most ``max_s``.
LIMIT_BACKOFF = Backoff(first_s=30.0, max_s=1800.0)
#: The payload keys of a RUN_SKIPPED event: the run's termination code, and whether its data waits for a back-off.
SKIP_CODE_KEY, SKIP_BACKOFF_KEY = "termination_code", "backoff"
#: How a refused run's REFUSED event message begins (``RunOutcome.REFUSED``): a non-run, not a failure of the job.
REFUSED_PREFIX = "refused by the jobs service, never executed"


@dataclass(frozen=True)
class TriggerRequest:
    job_id: str
    job_name: str | None
    idempotency_token: str
    #: heartbeat run id and, per consumed source, the window it covers (JSON strings)
    parameters: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class RunStatus:
    run_id: str
    outcome: RunOutcome
    message: str | None = None
    #: when the run itself started and ended (not when Heartbeat triggered it or noticed its end)
    start_time: datetime | None = None
    end_time: datetime | None = None
    #: seconds the run waited in the jobs service's queue before it started, where the service says
    queue_s: float | None = None
    #: a failed run: the one line that says what went wrong (redacted, at most REASON_CHARS), if known
    failure_reason: str | None = None
    #: a failed run: the last lines of its output (redacted, at most TAIL_LINES), where the backend keeps them
    output_tail: tuple[str, ...] | None = None
    #: the jobs service's termination code of a finished run, where it gives one (e.g. WORKSPACE_RUN_LIMIT_EXCEEDED)
    code: str | None = None
    #: a SKIPPED run that a workspace limit stopped: its request is asked again only after a back-off
    backoff: bool = False
    #: a SUCCESS that the service calls a success with failures (some task failed): the job's policy decides
    #: (``RetryPolicy.success_with_failures``) from ``failed_tasks``, the keys of the run's failed tasks
    partial: bool = False
    failed_tasks: tuple[str, ...] | None = None

    def timing(self) -> dict[str, str | float | list[str]]:
        """The run's own times for its end event's payload (``run_started_at``, ``run_ended_at``,
        ``run_queued_s``; what is unknown is left out): the source of every duration shown; a failed
        run's ``failure_reason`` and ``output_tail`` ride along."""
        timing: dict[str, str | float | list[str]] = {}
        if self.start_time is not None:
            timing["run_started_at"] = self.start_time.isoformat()
        if self.end_time is not None:
            timing["run_ended_at"] = self.end_time.isoformat()
        if self.queue_s is not None:
            timing["run_queued_s"] = self.queue_s
        if self.failure_reason:
            timing["failure_reason"] = self.failure_reason
        if self.output_tail:
            timing["output_tail"] = list(self.output_tail)
        return timing


#: The most lines of a failed run's output kept with its outcome, and the longest line / reason kept.
TAIL_LINES = 20
TAIL_LINE_CHARS = 300
REASON_CHARS = 200
#: An output line that names a failure: an ERROR/FATAL log line, an exception (Python's last traceback line).
_FAILURE_LINE = re.compile(r"\b(ERROR|FATAL|CRITICAL)\b|^(\w+\.)*\w*(Error|Exception)\b(:|$)|\bTraceback\b")


def shorten(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` characters, ending in an ellipsis when cut."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def output_tail(text: str, secrets: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The last TAIL_LINES non-empty lines of ``text``, each redacted and at most TAIL_LINE_CHARS long."""
    lines = [line for line in text.splitlines() if line.strip()][-TAIL_LINES:]
    return tuple(shorten(redact(line, secrets), TAIL_LINE_CHARS) for line in lines)


def failure_reason(tail: tuple[str, ...]) -> str | None:
    """The line of a failed run's output tail that says what went wrong: the last one naming an error
    (``ERROR …``, ``ValueError: …``, the final line of a traceback), else the last line; None when empty.
    Invariant: one line, at most REASON_CHARS characters, taken from the already redacted tail."""
    named = [line for line in tail if _FAILURE_LINE.search(line.strip()) and line.strip() != "Traceback "
             "(most recent call last):"]
    chosen = named[-1] if named else (tail[-1] if tail else None)
    return None if chosen is None else shorten(chosen.strip(), REASON_CHARS)


@dataclass(frozen=True)
class RunOutput:
    """Where a run's output can be seen: a page of the jobs service, or the text it captured."""

    url: str | None = None
    text: str | None = None


@dataclass(frozen=True)
class RunRef:
    """A run Heartbeat tracks (IN_PROGRESS with a run id)."""

    job_id: str
    run_id: str


@dataclass(frozen=True)
class FailedJob:
    """A job blocked by a failure at ``failed_at``, waiting for a successful run that ends after it."""

    job_id: str
    failed_at: datetime
    #: the run whose failure blocked the job, when known: a repair of it keeps this id
    run_id: str | None = None


@dataclass(frozen=True)
class CallProblem:
    """A call about one job that failed; the job is looked at again next tick."""

    job_id: str
    message: str


@dataclass
class Reconciliation:
    """What :meth:`JobsBackend.reconcile` learnt in one tick.

    A run or job absent from ``statuses``/``recovered`` is unchanged as far as the tick knows (still running,
    still failed, or ``deferred``/in ``problems``); nothing in it is ever a guess."""

    #: run id -> status, for tracked runs whose status was read this tick
    statuses: dict[str, RunStatus] = field(default_factory=dict)
    #: job id -> its successful run that ended after the failure, for failed jobs found recovered
    recovered: dict[str, RunStatus] = field(default_factory=dict)
    problems: list[CallProblem] = field(default_factory=list)
    #: job ids not looked at because the tick's API budget was spent (looked at next tick)
    deferred: list[str] = field(default_factory=list)
    #: what the run report should say about how the backend read (e.g. a listing over its page budget)
    notes: list[str] = field(default_factory=list)


    def absorb_statuses(self, calls: Calls[RunRef, RunStatus]) -> None:
        """Add the answers of per-run :meth:`JobsBackend.run_status` calls; the runs not asked are deferred."""
        for answer in calls.answers:
            if answer.error is not None:
                self.problems.append(CallProblem(answer.item.job_id, f"run status: {answer.error}"))
            elif answer.value is not None:
                self.statuses[answer.item.run_id] = answer.value
        self.deferred += [ref.job_id for ref in calls.not_started]

    def absorb_recoveries(self, calls: Calls[FailedJob, RunStatus | None]) -> None:
        """Add the answers of per-job :meth:`JobsBackend.successful_run_after` calls (not the ones not started)."""
        for answer in calls.answers:
            if answer.error is not None:
                self.problems.append(CallProblem(answer.item.job_id, f"looking for a successful run: {answer.error}"))
            elif answer.value is not None:
                self.recovered[answer.item.job_id] = answer.value


class JobsBackend(abc.ABC):
    """Starts jobs and reports on their runs: the jobs-backend plugin API (docs/plugins.md).

    Implementations subclass it (the built-ins are listed in ``jobs.registry``; an installed package
    adds one through the entry-point group ``heartbeat.jobs_backends``). ``trigger``, ``run_status``
    and ``successful_run_after`` are required; the rest have defaults.
    """

    name: str
    #: capability: :meth:`cancel_run` can stop a run (used for runs past their maximum duration)
    can_cancel: bool = False

    @classmethod
    def from_settings(cls, settings: Settings) -> JobsBackend:
        """The backend the runner uses with ``settings`` (``--jobs-backend NAME``). The default takes no
        argument; a backend with its own settings reads them from the environment here (secrets too)."""
        return cls()

    @abc.abstractmethod
    def trigger(self, request: TriggerRequest) -> str:
        """Start the job (idempotent on the token); return the run id. Raise JobsBackendError."""

    @abc.abstractmethod
    def run_status(self, job_id: str, run_id: str) -> RunStatus:
        """Current state of one run."""

    @abc.abstractmethod
    def successful_run_after(self, job_id: str, after: datetime) -> RunStatus | None:
        """A successful run of the job that ended after ``after`` (e.g. a manual rerun), if any."""

    def reconcile(self, runs: list[RunRef], failed: list[FailedJob], budget: ApiBudget) -> Reconciliation:
        """Statuses of ``runs`` and successful runs of ``failed`` jobs, within ``budget``.

        The default asks per run (:meth:`run_status`) and per job (:meth:`successful_run_after`) on the
        tick's pool of workers; a backend that can answer many at once (Databricks: one listing of the
        workspace's active runs) overrides it."""
        found = Reconciliation()
        statuses = call_all(runs, lambda ref: self.run_status(ref.job_id, ref.run_id), budget)
        found.absorb_statuses(statuses)
        recoveries = call_all(failed, lambda job: self.successful_run_after(job.job_id, job.failed_at), budget)
        found.absorb_recoveries(recoveries)
        found.deferred += [job.job_id for job in recoveries.not_started]
        return found

    def run_output(self, job_id: str, run_id: str) -> RunOutput | None:
        """Where to see the output of one run; None when the backend keeps none."""
        return None

    def memory(self) -> dict[str, Any] | None:
        """What this backend learnt that the next process may start from (JSON-able, nothing secret); the tick
        carries it in its run summary. None: nothing to carry.

        Invariant: a stale memory (an older tick's) only makes the backend read more, never answer wrong."""
        return None

    def remember(self, memory: dict[str, Any]) -> None:
        """Start from the memory an earlier process left (:meth:`memory`); one it cannot read is ignored. The
        default keeps nothing."""
        return None

    def watch_runs(self, wake: Callable[[], None]) -> Watch | None:
        """Capability: call ``wake()`` soon after a run this backend started may have ended, so a running loop
        records its end at once (a tick that senses nothing) rather than at its next poll. A missed call costs
        one interval. The default starts nothing (runs are reconciled at each poll)."""
        return None

    def cancel_run(self, job_id: str, run_id: str) -> None:
        """Ask the backend to stop a run. Only backends with ``can_cancel`` implement it."""
        raise JobsBackendError(f"the {self.name} jobs backend cannot cancel runs (run {run_id} of job {job_id})")
