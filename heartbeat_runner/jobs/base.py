"""The small interface every jobs backend implements.

Exactly-once rests on one property: ``trigger`` is idempotent on
``TriggerRequest.idempotency_token``. Calling it again with the same token (after a
crash, a retry, or from a second runner) must return the run the first call created
and never start a second one.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

from heartbeat_runner.core.errors import JobsBackendError


class RunOutcome(str, enum.Enum):
    PENDING = "PENDING"
    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"

    @property
    def finished(self) -> bool:
        return self in (RunOutcome.SUCCESS, RunOutcome.FAILED)


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

    def timing(self) -> dict[str, str | float]:
        """The run's own times for its end event's payload (``run_started_at``, ``run_ended_at``,
        ``run_queued_s``; what is unknown is left out): the source of every duration shown."""
        timing: dict[str, str | float] = {}
        if self.start_time is not None:
            timing["run_started_at"] = self.start_time.isoformat()
        if self.end_time is not None:
            timing["run_ended_at"] = self.end_time.isoformat()
        if self.queue_s is not None:
            timing["run_queued_s"] = self.queue_s
        return timing


@dataclass(frozen=True)
class RunOutput:
    """Where a run's output can be seen: a page of the jobs service, or the text it captured."""

    url: str | None = None
    text: str | None = None


class JobsBackend(Protocol):
    """Starts jobs and reports on their runs. Implementations subclass it to inherit the defaults."""

    name: str
    #: whether :meth:`cancel_run` can stop a run (used for runs past their maximum duration)
    can_cancel: bool = False

    def trigger(self, request: TriggerRequest) -> str:
        """Start the job (idempotent on the token); return the run id. Raise JobsBackendError."""
        ...

    def run_status(self, job_id: str, run_id: str) -> RunStatus:
        """Current state of one run."""
        ...

    def successful_run_after(self, job_id: str, after: datetime) -> RunStatus | None:
        """A successful run of the job that ended after ``after`` (e.g. a manual rerun), if any."""
        ...

    def run_output(self, job_id: str, run_id: str) -> RunOutput | None:
        """Where to see the output of one run; None when the backend keeps none."""
        return None

    def cancel_run(self, job_id: str, run_id: str) -> None:
        """Ask the backend to stop a run. Only backends with ``can_cancel`` implement it."""
        raise JobsBackendError(f"the {self.name} jobs backend cannot cancel runs (run {run_id} of job {job_id})")
