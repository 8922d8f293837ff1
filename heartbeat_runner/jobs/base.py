"""The small interface every jobs backend implements.

Exactly-once rests on one property: ``trigger`` is idempotent on
``TriggerRequest.idempotency_token``. Calling it again with the same token (after a
crash, a retry, or from a second runner) must return the run the first call created
and never start a second one.
"""

from __future__ import annotations

import abc
import enum
from dataclasses import dataclass, field
from datetime import datetime

from heartbeat_runner.core.errors import JobsBackendError
from heartbeat_runner.core.settings import Settings


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
    start_time: datetime | None = None
    end_time: datetime | None = None


@dataclass(frozen=True)
class RunOutput:
    """Where a run's output can be seen: a page of the jobs service, or the text it captured."""

    url: str | None = None
    text: str | None = None


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

    def run_output(self, job_id: str, run_id: str) -> RunOutput | None:
        """Where to see the output of one run; None when the backend keeps none."""
        return None

    def cancel_run(self, job_id: str, run_id: str) -> None:
        """Ask the backend to stop a run. Only backends with ``can_cancel`` implement it."""
        raise JobsBackendError(f"the {self.name} jobs backend cannot cancel runs (run {run_id} of job {job_id})")
