"""The ``databricks`` jobs backend: Databricks Jobs through databricks-sdk.

Authentication is the SDK's unified chain, so nothing secret lives in Heartbeat's
config, logs or tables: ``DATABRICKS_HOST`` + ``DATABRICKS_TOKEN`` (or OAuth M2M
``DATABRICKS_CLIENT_ID``/``DATABRICKS_CLIENT_SECRET``), a ``~/.databrickscfg`` profile
named by ``DATABRICKS_CONFIG_PROFILE``, or the job's own identity on a cluster.

Exactly-once: every ``run-now`` carries the request's idempotency token. The SDK
retries 429/503 and timeouts by itself; with the token a retried call returns the run
the first call created instead of starting a second one, and so does the next tick's
retry of a request whose outcome was unknown (``retryable=True``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from itertools import islice
from typing import Any

import requests
from databricks.sdk import WorkspaceClient
from databricks.sdk.config import Config
from databricks.sdk.errors import (
    BadRequest,
    DatabricksError,
    NotFound,
    PermissionDenied,
    ResourceConflict,
    Unauthenticated,
)
from databricks.sdk.service.jobs import BaseRun, Run

from heartbeat_runner.core.errors import AuthError, JobNotFoundError, JobsBackendError, describe, first_line
from heartbeat_runner.core.records import as_utc
from heartbeat_runner.core.settings import JobsBackendKind, Settings
from heartbeat_runner.jobs.base import JobsBackend, RunOutcome, RunOutput, RunStatus, TriggerRequest

#: Seconds one HTTP call may take (``HEARTBEAT_DATABRICKS_HTTP_TIMEOUT``).
HTTP_TIMEOUT_S = 30.0
#: Seconds the SDK keeps retrying 429/503/timeouts before giving up (``HEARTBEAT_DATABRICKS_RETRY_TIMEOUT``).
RETRY_TIMEOUT_S = 120
#: A repaired run keeps its original start time, so look this far back for a successful run.
RECOVERY_LOOKBACK = timedelta(days=7)
#: Upper bound on runs examined when looking for a successful run (runs/list pages hold 25).
RECOVERY_MAX_RUNS = 500

_PENDING_STATES = {"QUEUED", "PENDING", "BLOCKED", "WAITING", "WAITING_FOR_RETRY"}
_RUNNING_STATES = {"RUNNING", "TERMINATING"}
#: Terminal result codes that count as success. SUCCESS_WITH_FAILURES: the job's leaf
#: tasks (including the final ``heartbeat complete`` task) succeeded.
_SUCCESS_CODES = {"SUCCESS", "SUCCESS_WITH_FAILURES"}


def parse_job_id(job_id: str) -> int:
    """Databricks job ids are positive integers; the config holds them as text."""
    text = (job_id or "").strip()
    if not text.isdigit() or int(text) == 0:
        raise JobNotFoundError(
            f"trigger_job_id {job_id!r} is not a Databricks job id: expected the job's number "
            "(Jobs UI > job > Job details > Job ID, e.g. 123456789012345)")
    return int(text)


class DatabricksJobsBackend(JobsBackend):
    """Triggers and tracks Databricks job runs."""

    name = JobsBackendKind.DATABRICKS.value
    can_cancel = True

    def __init__(self, client: WorkspaceClient, *, recovery_lookback: timedelta = RECOVERY_LOOKBACK,
                 recovery_max_runs: int = RECOVERY_MAX_RUNS):
        self.client = client
        self.recovery_lookback = recovery_lookback
        self.recovery_max_runs = recovery_max_runs

    @classmethod
    def from_settings(cls, settings: Settings) -> DatabricksJobsBackend:
        """Authenticated by the SDK's auth chain from the environment (see :meth:`from_environment`)."""
        return cls.from_environment()

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None, **config: Any) -> DatabricksJobsBackend:
        """A backend authenticated by the SDK's unified auth chain; ``config`` overrides ``Config`` fields.

        ``config`` is passed through to ``Config(**kwargs)``, whose fields have many types (hence ``Any``).
        """
        env = os.environ if env is None else env
        try:
            options: dict[str, Any] = {
                "http_timeout_seconds": float(env.get("HEARTBEAT_DATABRICKS_HTTP_TIMEOUT", HTTP_TIMEOUT_S)),
                "retry_timeout_seconds": int(env.get("HEARTBEAT_DATABRICKS_RETRY_TIMEOUT", RETRY_TIMEOUT_S)),
            }
        except ValueError as exc:
            raise JobsBackendError(f"HEARTBEAT_DATABRICKS_*_TIMEOUT must be a number of seconds: {exc}") from exc
        options.update(config)
        try:
            cfg = Config(product="heartbeat-runner", product_version=_version(), **options)
        except ValueError as exc:
            raise AuthError(
                "Databricks authentication is not configured. Set DATABRICKS_HOST and DATABRICKS_TOKEN "
                "(or DATABRICKS_CLIENT_ID/DATABRICKS_CLIENT_SECRET), or DATABRICKS_CONFIG_PROFILE naming a "
                f"~/.databrickscfg profile, or run on Databricks. The SDK said: {first_line(exc)}") from exc
        return cls(WorkspaceClient(config=cfg))

    # -- JobsBackend ------------------------------------------------------------------------

    def run_output(self, job_id: str, run_id: str) -> RunOutput | None:
        """The run's page in the workspace (no API call: the URL is built from the host)."""
        host = (self.client.config.host or "").rstrip("/")
        return RunOutput(url=f"{host}/jobs/{parse_job_id(job_id)}/runs/{_run_number(run_id)}") if host else None

    def trigger(self, request: TriggerRequest) -> str:
        job = parse_job_id(request.job_id)
        with self._api(f"run-now of job {job}", job=job):
            waiter = self.client.jobs.run_now(job, idempotency_token=request.idempotency_token,
                                              job_parameters=dict(request.parameters) or None)
        if waiter.run_id is None:
            raise JobsBackendError(f"run-now of job {job} returned no run id (is it a continuous job?)")
        return str(waiter.run_id)

    def run_status(self, job_id: str, run_id: str) -> RunStatus:
        with self._api(f"runs/get of run {run_id} (job {job_id})"):
            run = self.client.jobs.get_run(_run_number(run_id))
        return run_status_of(run)

    def successful_run_after(self, job_id: str, after: datetime) -> RunStatus | None:
        job = parse_job_id(job_id)
        after = as_utc(after)
        since_ms = int((after - self.recovery_lookback).timestamp() * 1000)
        best: RunStatus | None = None
        with self._api(f"runs/list of job {job}", job=job):
            runs = self.client.jobs.list_runs(job_id=job, completed_only=True, start_time_from=since_ms)
            for run in islice(runs, self.recovery_max_runs):
                status = run_status_of(run)
                if status.outcome is not RunOutcome.SUCCESS or status.end_time is None or status.end_time <= after:
                    continue
                if best is None or status.end_time > best.end_time:  # type: ignore[operator]
                    best = status
        return best

    # -- extras -----------------------------------------------------------------------------

    def cancel_run(self, job_id: str, run_id: str) -> None:
        """Ask Databricks to cancel a run (e.g. one past its maximum duration); returns at once."""
        with self._api(f"runs/cancel of run {run_id} (job {job_id})"):
            self.client.jobs.cancel_run(_run_number(run_id))

    # -- internals --------------------------------------------------------------------------

    @contextmanager
    def _api(self, what: str, *, job: int | None = None) -> Iterator[None]:
        """Translate SDK and transport errors into the runner's error types."""
        try:
            yield
        except JobsBackendError:
            raise
        except (Unauthenticated, PermissionDenied) as exc:
            raise AuthError(f"{what}: Databricks refused our credentials or permissions ({_describe(exc)}); "
                            "check the auth chain (DATABRICKS_HOST/DATABRICKS_TOKEN, DATABRICKS_CONFIG_PROFILE) "
                            "and that the identity may run this job (CAN_MANAGE_RUN)") from exc
        except (NotFound, BadRequest) as exc:
            if job is not None and _says_missing(exc):
                raise JobNotFoundError(f"{what}: job {job} does not exist in this workspace, or is not visible "
                                       f"to this identity ({_describe(exc)})") from exc
            raise JobsBackendError(f"{what}: rejected ({_describe(exc)})") from exc
        except ResourceConflict as exc:
            raise JobsBackendError(f"{what}: conflict ({_describe(exc)})") from exc
        except DatabricksError as exc:
            # 5xx or unclassified: the call may or may not have taken effect.
            raise JobsBackendError(f"{what}: Databricks answered {_describe(exc)}; outcome unknown, will retry",
                                   retryable=True) from exc
        except (TimeoutError, requests.RequestException) as exc:
            cause = exc.__cause__ or exc
            raise JobsBackendError(f"{what}: no answer from Databricks ({type(cause).__name__}: "
                                   f"{first_line(cause)}); outcome unknown, will retry", retryable=True) from exc


def run_status_of(run: Run | BaseRun) -> RunStatus:
    """Map a Databricks run (``status`` of API 2.2, else the older ``state``) to a RunStatus."""
    lifecycle, code, message = _lifecycle(run)
    if lifecycle in _PENDING_STATES:
        outcome = RunOutcome.PENDING
    elif lifecycle in _RUNNING_STATES:
        outcome = RunOutcome.RUNNING
    elif code in _SUCCESS_CODES:
        outcome = RunOutcome.SUCCESS
    else:  # TERMINATED with a failure code, SKIPPED, INTERNAL_ERROR
        outcome = RunOutcome.FAILED
    text = None
    if outcome is RunOutcome.FAILED or (outcome is RunOutcome.SUCCESS and code != "SUCCESS"):
        text = ": ".join(p for p in (code or lifecycle, message) if p)
        if run.run_page_url:
            text += f" ({run.run_page_url})"
    return RunStatus(run_id=str(run.run_id), outcome=outcome, message=text,
                     start_time=_from_ms(run.start_time), end_time=_from_ms(run.end_time) if outcome.finished else None)


def _lifecycle(run: Run | BaseRun) -> tuple[str | None, str | None, str | None]:
    """(lifecycle state, result code, message) of a run."""
    status = run.status
    if status is not None and status.state is not None:
        details = status.termination_details
        code = details.code.value if details and details.code else None
        return status.state.value, code, details.message if details else None
    state = run.state
    if state is None:
        return None, None, None
    return (state.life_cycle_state.value if state.life_cycle_state else None,
            state.result_state.value if state.result_state else None,
            state.state_message or None)


def _run_number(run_id: str) -> int:
    if not str(run_id).strip().isdigit():
        raise JobsBackendError(f"run id {run_id!r} is not a Databricks run id")
    return int(run_id)


def _says_missing(exc: DatabricksError) -> bool:
    return isinstance(exc, NotFound) or exc.error_code == "RESOURCE_DOES_NOT_EXIST" or "does not exist" in str(exc)


def _describe(exc: DatabricksError) -> str:
    return describe(exc, exc.error_code)


def _from_ms(value: int | None) -> datetime | None:
    return datetime.fromtimestamp(value / 1000, tz=timezone.utc) if value else None


def _version() -> str:
    from heartbeat_runner import __version__

    return __version__
