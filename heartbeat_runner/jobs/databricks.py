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

import enum
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from email.utils import parsedate_to_datetime
from itertools import islice
from typing import Any
from urllib.parse import urlsplit

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

from heartbeat_runner.core.errors import AuthError, JobNotFoundError, JobsBackendError, describe, first_line
from heartbeat_runner.core.metrics import metrics
from heartbeat_runner.core.records import as_utc
from heartbeat_runner.core.secrets import redact
from heartbeat_runner.core.settings import JobsApiLimits, JobsBackendKind, Settings, read_environment, settings_from
from heartbeat_runner.jobs.base import (
    REASON_CHARS,
    FailedJob,
    JobsBackend,
    Reconciliation,
    RunOutcome,
    RunOutput,
    RunRef,
    RunStatus,
    TriggerRequest,
    shorten,
)
from heartbeat_runner.jobs.calls import ApiBudget, RateLimiter, call_all

#: A repaired run keeps its original start time, so look this far back for a successful run.
RECOVERY_LOOKBACK = timedelta(days=7)
#: Upper bound on runs examined when looking for a successful run (runs/list pages hold 25).
RECOVERY_MAX_RUNS = 500
#: Runs a runs/list page holds at most (the API's maximum ``limit``).
PAGE_SIZE = 25
#: The incremental look for successful runs of failed jobs reaches this far before the workspace's time at
#: the previous look (its ``Date`` header): a run created just before a listing may not show in it yet.
LISTING_OVERLAP = timedelta(minutes=2)
_OVERLAP_MS = int(LISTING_OVERLAP.total_seconds() * 1000)
#: Failed runs of failed jobs looked up (runs/get) per tick, in turn: a repair keeps the run's old start time, so
#: one that starts and ends between two looks shows in no listing. With N failed jobs, such a repair is seen
#: within ceil(N / REPAIR_CHECKS) ticks, at a bounded cost per tick.
REPAIR_CHECKS = 8

_PENDING_STATES = {"QUEUED", "PENDING", "BLOCKED", "WAITING", "WAITING_FOR_RETRY"}
_RUNNING_STATES = {"RUNNING", "TERMINATING"}


class TerminationRule(str, enum.Enum):
    """What a finished run's termination code means for its request: one rule per code
    (``TERMINATION_RULES``), written down in docs/databricks.md ("Termination codes")."""

    #: the run succeeded
    SUCCESS = "SUCCESS"
    #: SUCCESS_WITH_FAILURES: success or failure as the job's ``success_with_failures`` policy says, from the
    #: run's task results (runs/get); success by default
    TASKS_DECIDE = "TASKS_DECIDE"
    #: the run never executed (the job's own concurrency): asked again at the next tick with a new token
    SKIPPED = "SKIPPED"
    #: the run never executed for a workspace limit: asked again with a new token after an exponential
    #: back-off (``jobs.base.LIMIT_BACKOFF``), shown in ``explain`` and counted in ``heartbeat_job_runs_not_executed``
    LIMITED = "LIMITED"
    #: the workspace refuses to run the job (disabled, budget policy): a terminal non-run; the job is blocked
    #: with an alert and never asked again by itself (an operator's ``retry`` asks again)
    REFUSED = "REFUSED"
    #: the run failed: the job is blocked until a successful run (or the retry policy)
    FAILED = "FAILED"


#: The rule of every termination code: ``status.termination_details.code`` of API 2.2 (databricks-sdk
#: ``jobs.TerminationCodeCode``, all of its members) and the legacy ``state.result_state``. A code not
#: here (a future one) is FAILED: the job is blocked and the code shown, never silently taken as success.
TERMINATION_RULES: dict[str, TerminationRule] = {
    # API 2.2 termination codes (TerminationCodeCode)
    "SUCCESS": TerminationRule.SUCCESS,
    "SUCCESS_WITH_FAILURES": TerminationRule.TASKS_DECIDE,
    "SKIPPED": TerminationRule.SKIPPED,
    "MAX_CONCURRENT_RUNS_EXCEEDED": TerminationRule.SKIPPED,
    "WORKSPACE_RUN_LIMIT_EXCEEDED": TerminationRule.LIMITED,
    "CLUSTER_REQUEST_LIMIT_EXCEEDED": TerminationRule.LIMITED,
    "MAX_JOB_QUEUE_SIZE_EXCEEDED": TerminationRule.LIMITED,
    "MAX_SPARK_CONTEXTS_EXCEEDED": TerminationRule.LIMITED,
    "DISABLED": TerminationRule.REFUSED,
    "BUDGET_POLICY_LIMIT_EXCEEDED": TerminationRule.REFUSED,
    "USER_CANCELED": TerminationRule.FAILED,
    "CANCELED": TerminationRule.FAILED,
    "RUN_EXECUTION_ERROR": TerminationRule.FAILED,
    "INTERNAL_ERROR": TerminationRule.FAILED,
    "DRIVER_ERROR": TerminationRule.FAILED,
    "CLUSTER_ERROR": TerminationRule.FAILED,
    "CLOUD_FAILURE": TerminationRule.FAILED,
    "REPOSITORY_CHECKOUT_FAILED": TerminationRule.FAILED,
    "INVALID_CLUSTER_REQUEST": TerminationRule.FAILED,
    "INVALID_RUN_CONFIGURATION": TerminationRule.FAILED,
    "FEATURE_DISABLED": TerminationRule.FAILED,
    "LIBRARY_INSTALLATION_ERROR": TerminationRule.FAILED,
    "STORAGE_ACCESS_ERROR": TerminationRule.FAILED,
    "RESOURCE_NOT_FOUND": TerminationRule.FAILED,
    "UNAUTHORIZED_ERROR": TerminationRule.FAILED,
    "BREAKING_CHANGE": TerminationRule.FAILED,
    # legacy state.result_state values not above
    "MAXIMUM_CONCURRENT_RUNS_REACHED": TerminationRule.SKIPPED,
    "FAILED": TerminationRule.FAILED,
    "TIMEDOUT": TerminationRule.FAILED,
    "EXCLUDED": TerminationRule.FAILED,
    "UPSTREAM_FAILED": TerminationRule.FAILED,
    "UPSTREAM_CANCELED": TerminationRule.FAILED,
}
#: Task result states of a run that count as the task's success (runs/get ``tasks[].state.result_state``).
_TASK_OK = {"SUCCESS", "EXCLUDED"}


def termination_rule(code: str | None, result_state: str | None = None) -> TerminationRule:
    """The rule of a finished run: its code's, else its legacy result state's, else FAILED (unknown code)."""
    for value in (code, result_state):  # the API 2.2 code first: more specific than a legacy "FAILED"
        if value and value in TERMINATION_RULES:
            return TERMINATION_RULES[value]
    return TerminationRule.FAILED


#: the jobs API endpoints Heartbeat calls: the ``endpoint`` label of their metrics (any other path: "other")
_ENDPOINTS = frozenset({"run-now", "runs/get", "runs/list", "runs/cancel"})
#: answers the SDK retries by itself (after Retry-After, within HEARTBEAT_DATABRICKS_RETRY_TIMEOUT)
_RETRIED_STATUSES = frozenset({429, 503})


def _count_answers(client: WorkspaceClient) -> None:
    """Count every HTTP answer of the client in the metrics (calls, 429s, answers the SDK sends again), by
    endpoint: a response hook on the SDK's session sees the retries it makes by itself, which no caller
    does. A client without that session (another SDK release) is simply not counted."""
    session = getattr(getattr(client.api_client, "_api_client", None), "_session", None)
    if isinstance(session, requests.Session) and _count_answer not in session.hooks["response"]:
        session.hooks["response"].append(_count_answer)


def _count_answer(response: requests.Response, *args: Any, **kwargs: Any) -> None:
    path = urlsplit(response.url).path
    tail = path.split("/jobs/", 1)[1] if "/jobs/" in path else ""
    endpoint = tail if tail in _ENDPOINTS else "other"
    m = metrics()
    m.api_calls.labels(endpoint=endpoint).inc()
    if response.status_code == 429:
        m.api_throttled.labels(endpoint=endpoint).inc()
    if response.status_code in _RETRIED_STATUSES:
        m.api_retries.labels(endpoint=endpoint).inc()


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
                 recovery_max_runs: int = RECOVERY_MAX_RUNS, limits: JobsApiLimits | None = None):
        self.client = client
        _count_answers(client)
        self.recovery_lookback = recovery_lookback
        self.recovery_max_runs = recovery_max_runs
        self.limits = limits or JobsApiLimits()
        self._limiters: dict[str, RateLimiter] = {}
        self._limiters_lock = threading.Lock()
        #: start times (ms) of tracked runs, exact from listings; pruned to the tracked runs every reconcile
        self._started_ms: dict[int, int] = {}
        #: start times (ms, the local clock around run-now) of runs triggered since the last reconcile
        self._triggered_ms: dict[int, int] = {}
        #: how far the previous tick's look for successful runs of failed jobs reached
        self._recovery: _RecoveryMemory | None = None

    @classmethod
    def from_settings(cls, settings: Settings) -> DatabricksJobsBackend:
        """Authenticated by the SDK's auth chain from the environment; timeouts and API limits from ``settings``."""
        return cls._connected(settings.databricks_http_timeout_s, settings.databricks_retry_timeout_s, settings.jobs_api)

    @classmethod
    def from_environment(cls, env: Mapping[str, str] | None = None, **config: Any) -> DatabricksJobsBackend:
        """A backend authenticated by the SDK's unified auth chain; ``config`` overrides ``Config`` fields.

        Timeouts and API limits come from the HEARTBEAT_* variables of ``env`` (default ``os.environ``),
        read through the settings declaration (SettingsError names a bad one). ``config`` is passed
        through to ``Config(**kwargs)``, whose fields have many types (hence ``Any``).
        """
        settings = settings_from(read_environment(env))
        return cls._connected(settings.databricks_http_timeout_s, settings.databricks_retry_timeout_s,
                              settings.jobs_api, **config)

    @classmethod
    def _connected(cls, http_timeout_s: float, retry_timeout_s: int, limits: JobsApiLimits,
                   **config: Any) -> DatabricksJobsBackend:
        options: dict[str, Any] = {"http_timeout_seconds": http_timeout_s, "retry_timeout_seconds": retry_timeout_s}
        options.update(config)
        try:
            cfg = Config(product="heartbeat-runner", product_version=_version(), **options)
        except ValueError as exc:
            raise AuthError(
                "Databricks authentication is not configured. Set DATABRICKS_HOST and DATABRICKS_TOKEN "
                "(or DATABRICKS_CLIENT_ID/DATABRICKS_CLIENT_SECRET), or DATABRICKS_CONFIG_PROFILE naming a "
                f"~/.databrickscfg profile, or run on Databricks. The SDK said: {first_line(exc)}") from exc
        return cls(WorkspaceClient(config=cfg), limits=limits)

    # -- JobsBackend ------------------------------------------------------------------------

    def memory(self) -> dict[str, Any] | None:
        """How far the look for successful runs of failed jobs reached (see :class:`_RecoveryMemory`)."""
        return self._recovery.as_dict() if self._recovery is not None else None

    def remember(self, memory: dict[str, Any]) -> None:
        """Start from an earlier process's look (a process per tick would otherwise read every failed job's
        history each tick); a stale one only makes the next listing longer."""
        if self._recovery is None:
            self._recovery = _RecoveryMemory.from_dict(memory)

    def run_output(self, job_id: str, run_id: str) -> RunOutput | None:
        """The run's page in the workspace (no API call: the URL is built from the host)."""
        host = (self.client.config.host or "").rstrip("/")
        return RunOutput(url=f"{host}/jobs/{parse_job_id(job_id)}/runs/{_run_number(run_id)}") if host else None

    def trigger(self, request: TriggerRequest) -> str:
        job = parse_job_id(request.job_id)
        called_ms = _now_ms()
        body: dict[str, Any] = {"job_id": job, "idempotency_token": request.idempotency_token}
        if request.parameters:
            body["job_parameters"] = dict(request.parameters)
        with self._api(f"run-now of job {job}", "run-now", job=job):
            answer = self.client.api_client.do("POST", "/api/2.2/jobs/run-now", body=body,
                                               headers={"Accept": "application/json",
                                                        "Content-Type": "application/json"})
        run_id = answer.get("run_id") if isinstance(answer, dict) else None
        if not isinstance(run_id, int):
            raise JobsBackendError(f"run-now of job {job} returned no run id (is it a continuous job?)")
        self._triggered_ms[run_id] = (called_ms + _now_ms()) // 2  # exact after the next listing
        return str(run_id)

    def run_status(self, job_id: str, run_id: str) -> RunStatus:
        return run_status_of(self._get_run(job_id, run_id))

    def reconcile(self, runs: list[RunRef], failed: list[FailedJob], budget: ApiBudget) -> Reconciliation:
        """One listing of the workspace's active runs (in start-time slices read in parallel) answers every
        tracked run still active; only runs absent from it (finished, or moved between two pages while
        they were read) are looked up one by one. Failed jobs: see :meth:`_recover`."""
        found = Reconciliation()
        if not runs and not failed:
            self._recovery = None
            return found
        began_ms = _now_ms()
        listing = self._list_active(runs, budget)
        if not listing.complete:
            found.notes.append(
                f"the workspace has more active runs than {self.limits.list_pages} pages of {PAGE_SIZE} "
                "(HEARTBEAT_JOBS_API_LIST_PAGES) or the tick's API budget allows: runs not listed were "
                "looked up one by one")
        self._remember_starts(runs, listing)
        # a success with failures is decided by its task results, which a listing does not hold: runs/get
        missing = [ref for ref in runs if (run := listing.get(ref.run_id)) is None
                   or (run.failed_tasks is None and run_status_of(run).partial)]
        found.statuses.update({ref.run_id: run_status_of(run) for ref in runs
                               if (run := listing.get(ref.run_id)) is not None and ref not in missing})
        lookups = call_all(missing, lambda ref: self.run_status(ref.job_id, ref.run_id), budget)
        found.absorb_statuses(lookups)
        self._recover(failed, listing, began_ms, budget, found)
        return found

    def successful_run_after(self, job_id: str, after: datetime) -> RunStatus | None:
        job = parse_job_id(job_id)
        after = as_utc(after)
        since_ms = int((after - self.recovery_lookback).timestamp() * 1000)
        query = {"job_id": job, "completed_only": "true", "start_time_from": since_ms, "limit": PAGE_SIZE}
        runs: list[WireRun] = []
        token: str | None = None
        while len(runs) < self.recovery_max_runs:
            with self._api(f"runs/list of job {job}", "runs/list", job=job):
                body = self._do_list({**query, **({"page_token": token} if token else {})})
            runs += [wire_run(run) for run in body.get("runs") or []]
            token = body.get("next_page_token") if body.get("has_more") else None
            if not token:
                break
        return latest_success_after(islice(runs, self.recovery_max_runs), after)

    # -- bulk reconciliation ----------------------------------------------------------------

    def _remember_starts(self, runs: list[RunRef], listing: _Listing) -> None:
        """Keep the start times of the tracked runs (exact when listed) and of the runs triggered since the
        last reconcile (tracked from the next); forget the rest (memory bounded by the tracked runs)."""
        known = {**self._started_ms, **self._triggered_ms}
        self._started_ms = {int(ref.run_id): started for ref in runs if (started := listing.started_ms(ref.run_id, known))}
        for run_id, started in self._triggered_ms.items():
            self._started_ms.setdefault(run_id, started)
        self._triggered_ms = {}

    def _recover(self, failed: list[FailedJob], listing: _Listing, began_ms: int, budget: ApiBudget,
                 found: Reconciliation) -> None:
        """Successful runs of failed jobs, incrementally: a job failed since the previous look (or the first
        look of this process) is looked up once (its history since the failure); after that, a tick reads
        one workspace-wide listing of the runs *completed* since the previous look, plus a ``runs/get`` of
        each run of a failed job that was active at the previous look and is not any more (a repaired run
        keeps its old start time). A run that ends after the failure is either of those, so nothing is missed,
        except a repair of the failed run itself that starts and ends between two looks: the failed runs are
        looked up ``REPAIR_CHECKS`` a tick, in turn (the turn is carried in the memory).
        """
        memory = self._recovery if listing.complete else None
        known = [job for job in failed if memory is not None and job.job_id in memory.jobs]
        fresh = [job for job in failed if job not in known]
        covered: set[str] = set()
        newest_ms = max(listing.seen_until_ms, memory.looked_at_ms if memory is not None else 0)
        if memory is not None and known:
            covered = self._recover_known(known, memory, listing, budget, found)
            fresh += [job for job in known if job.job_id not in covered]
        recoveries = call_all(fresh, lambda job: self.successful_run_after(job.job_id, job.failed_at), budget)
        found.absorb_recoveries(recoveries)
        covered |= {a.item.job_id for a in recoveries.answers if a.error is None}
        found.deferred += [job.job_id for job in recoveries.not_started]
        failed_ids = {job.job_id for job in failed}
        self._recovery = _RecoveryMemory(
            newest_ms or began_ms - _OVERLAP_MS, covered - set(found.recovered),
            {run_id: str(run.job_id) for run_id, run in listing.runs.items() if str(run.job_id) in failed_ids},
            memory.repair_turn if memory is not None else 0,
        ) if listing.complete else None

    def _recover_known(self, known: list[FailedJob], memory: _RecoveryMemory, listing: _Listing,
                       budget: ApiBudget, found: Reconciliation) -> set[str]:
        """The incremental look for ``known`` jobs: the jobs it covered (the others are looked up anew)."""
        wanted = {job.job_id for job in known}
        since_ms = memory.looked_at_ms - _OVERLAP_MS
        try:
            completed = self._list(_Slice(since_ms, None), budget.time_only(), _Pages(self.limits.list_pages),
                                   completed=True)
        except JobsBackendError as exc:
            found.notes.append(f"listing the runs completed since the previous look failed ({exc}): "
                               "failed jobs were looked up one by one")
            return set()
        if not completed.complete:
            found.notes.append("runs completed since the previous look exceed the page budget "
                               "(HEARTBEAT_JOBS_API_LIST_PAGES): failed jobs were looked up one by one")
            return set()
        lookups = {run_id: job for run_id, job in memory.watched.items() if job in wanted and run_id not in listing.runs}
        repairable = sorted((int(job.run_id), job.job_id) for job in known
                            if job.run_id and job.run_id.isdigit() and int(job.run_id) not in listing.runs)
        if repairable:
            first = memory.repair_turn % len(repairable)
            turn = (repairable[first:] + repairable[:first])[:REPAIR_CHECKS]
            lookups.update({run_id: job for run_id, job in turn if run_id not in lookups})
            memory.repair_turn = first + len(turn)
        left = sorted(lookups)
        gets = call_all(left, lambda run_id: self._get_run(lookups[run_id], str(run_id)), budget)
        if gets.not_started or any(a.error is not None for a in gets.answers):
            return set()
        candidates: list[WireRun] = [*completed.runs.values()]
        candidates += [a.value for a in gets.answers if a.value is not None]
        by_job: dict[str, list[WireRun]] = {}
        for run in candidates:
            if str(run.job_id) in wanted:
                by_job.setdefault(str(run.job_id), []).append(run)
        for job in known:
            best = latest_success_after(by_job.get(job.job_id, []), as_utc(job.failed_at))
            if best is not None:
                found.recovered[job.job_id] = best
        return wanted

    def _list_active(self, runs: list[RunRef], budget: ApiBudget) -> _Listing:
        """The workspace's active runs, read in start-time slices in parallel (each slice's pages in turn)."""
        starts = sorted(self._started_ms[int(ref.run_id)] for ref in runs
                        if ref.run_id.isdigit() and int(ref.run_id) in self._started_ms)
        slices = _slices(starts, self.limits.concurrency)
        pages = _Pages(self.limits.list_pages)
        listing_budget = budget.time_only()
        listed = call_all(slices, lambda part: self._list(part, listing_budget, pages, completed=False),
                          listing_budget)
        merged = _Listing(complete=not listed.not_started)
        for answer in listed.answers:
            if answer.value is None:
                merged.complete = False
                continue
            merged.runs.update(answer.value.runs)
            merged.server_ms = min(filter(None, (merged.server_ms, answer.value.server_ms)), default=0)
            merged.complete &= answer.value.complete
        return merged

    def _list(self, part: _Slice, budget: ApiBudget, pages: _Pages, *, completed: bool) -> _Listing:
        """Runs of the whole workspace (no job filter) that started within ``part``: active ones, or
        completed ones; incomplete when the page budget or the tick's budget ends first."""
        query: dict[str, Any] = {"limit": PAGE_SIZE, ("completed_only" if completed else "active_only"): "true"}
        if part.from_ms is not None:
            query["start_time_from"] = part.from_ms
        if part.to_ms is not None:
            query["start_time_to"] = part.to_ms
        listing = _Listing(complete=False)
        token: str | None = None
        # the first page is paid by the slice's own call of the tick's budget; later pages by the page budget
        while (token is None or not budget.spent) and pages.take():
            with self._api("runs/list of the workspace's runs", "runs/list"):
                body = self._do_list({**query, **({"page_token": token} if token else {})})
            listing.server_ms = listing.server_ms or _http_date_ms(body.get("Date"))
            runs = [wire_run(run) for run in body.get("runs") or []]
            listing.runs.update({run.run_id: run for run in runs if run.run_id})
            token = body.get("next_page_token") if body.get("has_more") else None
            if token is None:
                listing.complete = True
                break
        return listing

    # -- extras -----------------------------------------------------------------------------

    def cancel_run(self, job_id: str, run_id: str) -> None:
        """Ask Databricks to cancel a run (e.g. one past its maximum duration); returns at once."""
        with self._api(f"runs/cancel of run {run_id} (job {job_id})", "runs/cancel"):
            self.client.jobs.cancel_run(_run_number(run_id))

    # -- internals --------------------------------------------------------------------------

    def _get_run(self, job_id: str, run_id: str) -> WireRun:
        with self._api(f"runs/get of run {run_id} (job {job_id})", "runs/get"):
            body = self.client.api_client.do("GET", "/api/2.2/jobs/runs/get", query={"run_id": _run_number(run_id)},
                                             headers={"Accept": "application/json"})
        if not isinstance(body, dict):
            raise JobsBackendError(f"runs/get of run {run_id} answered {type(body).__name__}, not a JSON object")
        return wire_run(body)

    def _do_list(self, query: dict[str, Any]) -> dict[str, Any]:
        """One runs/list page as the wire says it (with the answer's ``Date`` header)."""
        body = self.client.api_client.do("GET", "/api/2.2/jobs/runs/list", query=query,
                                         headers={"Accept": "application/json"}, response_headers=["Date"])
        if not isinstance(body, dict):
            raise JobsBackendError(f"runs/list answered {type(body).__name__}, not a JSON object")
        return body

    def _limiter(self, endpoint: str) -> RateLimiter:
        with self._limiters_lock:
            if endpoint not in self._limiters:
                self._limiters[endpoint] = RateLimiter(self.limits.rate_per_s)
            return self._limiters[endpoint]

    @contextmanager
    def _api(self, what: str, endpoint: str, *, job: int | None = None) -> Iterator[None]:
        """Wait for the endpoint's turn (client-side rate limit), then translate SDK and transport errors
        into the runner's error types. A 429 is retried by the SDK after its Retry-After in the worker
        that got it; the tick's other workers go on."""
        self._limiter(endpoint).acquire()
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


@dataclass(frozen=True)
class _Slice:
    """Runs that started in [from_ms, to_ms] (None: unbounded), listed on their own page chain."""

    from_ms: int | None
    to_ms: int | None


@dataclass
class _Listing:
    """Runs read from a listing, by run id; ``complete`` when every page was read."""

    complete: bool
    runs: dict[int, WireRun] = field(default_factory=dict)

    #: the workspace's time (``Date`` of the first answer, ms) when the listing began; 0 when not known
    server_ms: int = 0

    @property
    def seen_until_ms(self) -> int:
        """Every run that started before this (the workspace's clock) was visible to the listing: the
        time it began (less the ``Date`` header's one-second resolution), else the newest start it saw."""
        if self.server_ms:
            return self.server_ms - 1000
        return max((run.start_ms for run in self.runs.values()), default=0)

    def get(self, run_id: str) -> WireRun | None:
        return self.runs.get(int(run_id)) if run_id.isdigit() else None

    def started_ms(self, run_id: str, known: dict[int, int]) -> int:
        """The run's start time as listed, else as ``known``; 0 when unknown."""
        run = self.get(run_id)
        if run is not None and run.start_ms:
            return run.start_ms
        return known.get(int(run_id), 0) if run_id.isdigit() else 0


@dataclass
class _RecoveryMemory:
    """How far the previous look for successful runs of failed jobs reached (bounded by the failed jobs and
    their active runs). Carried from process to process in the tick's run summary: a stale one (an older
    tick's) only makes the listing of completed runs reach further back, never misses a run."""

    #: the workspace's time when the look's active listing began: every run that started before it was
    #: either read as completed or listed as active (and then watched)
    looked_at_ms: int
    #: failed jobs whose runs up to ``looked_at_ms`` have been read
    jobs: set[str]
    #: runs of failed jobs active at that look: run id -> job id
    watched: dict[int, str]
    #: where the next turn of failed-run lookups begins (see REPAIR_CHECKS)
    repair_turn: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {"looked_at_ms": self.looked_at_ms, "jobs": sorted(self.jobs),
                "watched": {str(run): job for run, job in sorted(self.watched.items())},
                "repair_turn": self.repair_turn}

    @classmethod
    def from_dict(cls, memory: Mapping[str, Any]) -> _RecoveryMemory | None:
        """The memory written by :meth:`as_dict`; None when it is not one (then the look starts afresh)."""
        looked_at, jobs, watched = memory.get("looked_at_ms"), memory.get("jobs"), memory.get("watched")
        if not isinstance(looked_at, int) or looked_at <= 0 or not isinstance(jobs, list) \
                or not isinstance(watched, dict):
            return None
        try:
            turn = memory.get("repair_turn", 0)
            return cls(looked_at, {str(job) for job in jobs}, {int(run): str(job) for run, job in watched.items()},
                       turn if isinstance(turn, int) and turn >= 0 else 0)
        except (TypeError, ValueError):
            return None


class _Pages:
    """A page budget shared by the slices of one listing (thread-safe)."""

    def __init__(self, pages: int):
        self.left = pages
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            if self.left <= 0:
                return False
            self.left -= 1
            return True


def _slices(starts: list[int], workers: int) -> list[_Slice]:
    """Start-time slices covering all time, each holding whole pages of the tracked runs (``starts``,
    sorted), at most ``workers`` of them; a boundary falls between two different start times."""
    if not starts:
        return [_Slice(None, None)]
    per_slice = -(-len(starts) // workers)
    per_slice = -(-per_slice // PAGE_SIZE) * PAGE_SIZE
    bounds: list[int] = []
    for index in range(per_slice, len(starts), per_slice):
        before, at = starts[index - 1], starts[index]
        if at > before and (not bounds or before >= bounds[-1]):
            bounds.append(before + 1 + (at - before - 1) // 2)
    edges: list[int | None] = [None, *bounds]
    return [_Slice(lo, (hi - 1) if hi is not None else None) for lo, hi in zip(edges, [*bounds, None])]


@dataclass(frozen=True)
class WireRun:
    """A run as the Jobs API's JSON says it, read field by field: no SDK enum stands between the wire and
    the outcome (databricks-sdk 0.47 parses a code it does not know, e.g. SUCCESS_WITH_FAILURES, as None).

    Invariant: ``state`` is the life cycle state (``status.state`` of API 2.2, else the legacy
    ``state.life_cycle_state``), ``code`` the termination code (``status.termination_details.code``,
    else the legacy ``state.result_state``); for a repaired run they are its last repair's, and ``end_ms``
    the latest end of the run or any of its repairs."""

    run_id: int
    job_id: int
    state: str | None
    code: str | None
    #: the legacy ``result_state`` (TIMEDOUT, CANCELED, ...): more specific than a code of CANCELED
    result_state: str | None
    message: str | None
    start_ms: int
    end_ms: int
    queue_ms: int
    page_url: str | None
    repairs: int = 0
    #: keys of the run's tasks that did not succeed; None when the answer held no tasks (runs/list)
    failed_tasks: tuple[str, ...] | None = None


def wire_run(body: Mapping[str, Any]) -> WireRun:
    """Read one run of a runs/get or runs/list answer."""
    status = _mapping(body.get("status"))
    details = _mapping(status.get("termination_details"))
    legacy = _mapping(body.get("state"))
    state = _text(status.get("state")) or _text(legacy.get("life_cycle_state"))
    if _text(legacy.get("life_cycle_state")) == "SKIPPED":
        state = "SKIPPED"
    code = _text(details.get("code")) or _text(legacy.get("result_state"))
    message = _text(details.get("message")) or _text(legacy.get("state_message"))
    repairs = [_mapping(item) for item in body.get("repair_history") or [] if _mapping(item).get("type") == "REPAIR"]
    end_ms = max([_int(body.get("end_time")), *(_int(item.get("end_time")) for item in repairs)])
    return WireRun(run_id=_int(body.get("run_id")), job_id=_int(body.get("job_id")), state=state, code=code,
                   result_state=_text(legacy.get("result_state")), message=message,
                   start_ms=_int(body.get("start_time")), end_ms=end_ms, queue_ms=_int(body.get("queue_duration")),
                   page_url=_text(body.get("run_page_url")), repairs=len(repairs), failed_tasks=_failed_tasks(body))


def latest_success_after(runs: Iterable[WireRun], after: datetime) -> RunStatus | None:
    """The successful run among ``runs`` that ended last, after ``after``; None if none did."""
    best: RunStatus | None = None
    for run in runs:
        status = run_status_of(run)
        if status.outcome is not RunOutcome.SUCCESS or status.end_time is None or status.end_time <= after:
            continue
        if best is None or status.end_time > best.end_time:  # type: ignore[operator]
            best = status
    return best


def run_status_of(run: WireRun) -> RunStatus:
    """Map a run read from the wire to a RunStatus: QUEUED/PENDING/BLOCKED/WAITING are pending, RUNNING and
    TERMINATING running; once over, the rule of its termination code decides (``TERMINATION_RULES``, one per
    code): SUCCESS success; SUCCESS_WITH_FAILURES success marked ``partial`` with its failed tasks (the job's
    policy decides); SKIPPED / LIMITED skipped (LIMITED with ``backoff``); REFUSED refused; anything else
    (RUN_EXECUTION_ERROR, TIMEDOUT, CANCELED, INTERNAL_ERROR, an unknown code) failed, with its reason."""
    lifecycle, code = run.state, run.code
    rule: TerminationRule | None = None
    if lifecycle in _PENDING_STATES:
        outcome = RunOutcome.PENDING
    elif lifecycle in _RUNNING_STATES:
        outcome = RunOutcome.RUNNING
    else:
        rule = termination_rule(code, run.result_state)
        if lifecycle == "SKIPPED" and rule not in (TerminationRule.LIMITED, TerminationRule.REFUSED):
            rule = TerminationRule.SKIPPED
        outcome = _OUTCOMES[rule]
    text = None
    if outcome in (RunOutcome.FAILED, RunOutcome.SKIPPED, RunOutcome.REFUSED) or (
            outcome is RunOutcome.SUCCESS and code != "SUCCESS"):
        reason = code or lifecycle
        if run.result_state and run.result_state not in (code, "FAILED"):
            reason = f"{run.result_state} ({reason})" if reason else run.result_state
        text = ": ".join(p for p in (reason, run.message) if p)
        if run.failed_tasks:
            text += f" (failed tasks: {', '.join(run.failed_tasks)})"
        if run.page_url:
            text += f" ({run.page_url})"
    reason = shorten(redact(run.message), REASON_CHARS) if outcome is RunOutcome.FAILED and run.message else None
    return RunStatus(run_id=str(run.run_id), outcome=outcome, message=text,
                     start_time=_from_ms(run.start_ms), end_time=_from_ms(run.end_ms) if outcome.finished else None,
                     queue_s=run.queue_ms / 1000 if run.queue_ms else None, failure_reason=reason,
                     code=(code or run.result_state) if outcome.finished else None,
                     backoff=rule is TerminationRule.LIMITED, partial=rule is TerminationRule.TASKS_DECIDE,
                     failed_tasks=run.failed_tasks)


#: The outcome each rule gives a finished run (TASKS_DECIDE: success, marked partial for the job's policy).
_OUTCOMES = {TerminationRule.SUCCESS: RunOutcome.SUCCESS, TerminationRule.TASKS_DECIDE: RunOutcome.SUCCESS,
             TerminationRule.SKIPPED: RunOutcome.SKIPPED, TerminationRule.LIMITED: RunOutcome.SKIPPED,
             TerminationRule.REFUSED: RunOutcome.REFUSED, TerminationRule.FAILED: RunOutcome.FAILED}


def _failed_tasks(body: Mapping[str, Any]) -> tuple[str, ...] | None:
    """The keys of the run's tasks that did not succeed (runs/get ``tasks``); None when the answer holds no
    tasks (a runs/list page without ``expand_tasks``)."""
    tasks = body.get("tasks")
    if not isinstance(tasks, list) or not tasks:
        return None
    failed = []
    for task in (_mapping(item) for item in tasks):
        details = _mapping(_mapping(task.get("status")).get("termination_details"))
        result = _text(details.get("code")) or _text(_mapping(task.get("state")).get("result_state"))
        if result is not None and result not in _TASK_OK:
            failed.append(_text(task.get("task_key")) or "?")
    return tuple(failed)


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


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


def _http_date_ms(value: object) -> int:
    """An HTTP ``Date`` header in ms since the epoch; 0 when absent or unreadable."""
    try:
        return int(parsedate_to_datetime(str(value)).timestamp() * 1000) if value else 0
    except (TypeError, ValueError):
        return 0


def _now_ms() -> int:
    return int(time.time() * 1000)


def _version() -> str:
    from heartbeat_runner import __version__

    return __version__
