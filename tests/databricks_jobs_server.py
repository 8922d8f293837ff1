"""A stateful stand-in for the Databricks Jobs API, for tests with the real databricks-sdk.

A plain ``ThreadingHTTPServer`` on 127.0.0.1 keeps jobs, runs and idempotency tokens
and answers the calls the SDK makes (API 2.1 and 2.2): ``jobs/run-now``, ``jobs/get``,
``jobs/runs/get``, ``jobs/runs/list``, ``jobs/runs/cancel`` and ``jobs/runs/repair``, in the
JSON shapes of the real API (checked against ``databricks.sdk.service.jobs``). Runs move
QUEUED → RUNNING → TERMINATED only when a test says so, and end in any fate a workspace
reports (``FATES``: SUCCESS, FAILED, SUCCESS_WITH_FAILURES, TIMEDOUT, CANCELED, SKIPPED), in
both shapes: ``status.state`` + ``status.termination_details.{code,type,message}`` (API 2.2)
and the legacy ``state.{life_cycle_state,result_state,state_message}``. A job's
``max_concurrent_runs`` is kept: with queueing off a run-now over it answers a run that is
SKIPPED at once (MAX_CONCURRENT_RUNS_EXCEEDED); with queueing on the run waits QUEUED. A
repair keeps the run id, appends to ``repair_history`` and moves the run back to RUNNING. Faults are injected per endpoint for the
next N calls: an HTTP error (429 with Retry-After, 500, 503, 401, ...) returned before
or *after* the call took effect, or an answer delayed beyond the client's timeout.

At scale, as a workspace behaves: every answer can wait ``latency_s`` (a round trip to a
workspace); an endpoint can have a rate limit (``limit_rate``: more calls in a second than
allowed answer 429 with Retry-After) or throttle every n-th call (``throttle_every``, a 429
storm); ``runs/list`` pages hold at most 25 runs (20 by default) behind a ``page_token``;
``add_other_runs`` fills the workspace with runs of jobs Heartbeat does not track; and
``calls(endpoint)`` counts the calls per endpoint. The socket sets ``TCP_NODELAY``: without
it every answer (headers and body written separately) waited ~47 ms for a delayed ACK.
"""

from __future__ import annotations

import base64
import itertools
import json
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from databricks.sdk import WorkspaceClient
from databricks.sdk.clock import Clock, RealClock
from databricks.sdk.config import Config
from requests.adapters import HTTPAdapter

TOKEN = "dapi-test-token-0123456789"


@dataclass
class Fault:
    """What the next call(s) to an endpoint get instead of a normal answer."""

    status: int | None = None            # HTTP status to answer with (None: answer normally, but late)
    error_code: str = ""
    message: str = ""
    retry_after: int | None = None       # Retry-After header, seconds
    delay_s: float = 0.0                 # sleep before answering (longer than the client's timeout: a read timeout)
    after_effect: bool = False           # apply the call first, then fail: "did it run?" is unknown to the client


@dataclass(frozen=True)
class Fate:
    """How a finished run ended, in both shapes of the API."""

    life_cycle_state: str        # legacy state.life_cycle_state: TERMINATED, SKIPPED, INTERNAL_ERROR
    result_state: str | None     # legacy state.result_state
    code: str                    # status.termination_details.code
    type: str                    # status.termination_details.type
    message: str                 # the message both shapes carry


#: Every fate a run can end in, by name (``finish_run(run_id, NAME)``).
FATES: dict[str, Fate] = {
    "SUCCESS": Fate("TERMINATED", "SUCCESS", "SUCCESS", "SUCCESS", ""),
    "FAILED": Fate("TERMINATED", "FAILED", "RUN_EXECUTION_ERROR", "CLIENT_ERROR", "Task etl failed."),
    # the final leaf task succeeded, another leaf failed: the job's run is a success with failures
    "SUCCESS_WITH_FAILURES": Fate("TERMINATED", "SUCCESS_WITH_FAILURES", "SUCCESS_WITH_FAILURES", "SUCCESS",
                                  "Some tasks failed; the leaf tasks succeeded."),
    # a run past its timeout_seconds is cancelled by the platform
    "TIMEDOUT": Fate("TERMINATED", "TIMEDOUT", "CANCELED", "CLIENT_ERROR", "Run timed out after 3600 seconds."),
    "CANCELED": Fate("TERMINATED", "CANCELED", "USER_CANCELED", "SUCCESS", "Run cancelled."),
    "SKIPPED": Fate("SKIPPED", "MAXIMUM_CONCURRENT_RUNS_REACHED", "MAX_CONCURRENT_RUNS_EXCEEDED", "CLIENT_ERROR",
                    "Skipping this run because the limit of 1 maximum concurrent runs has been reached."),
    # runs that never executed for a workspace limit or a policy: the legacy shape only says FAILED
    "WORKSPACE_RUN_LIMIT_EXCEEDED": Fate("TERMINATED", "FAILED", "WORKSPACE_RUN_LIMIT_EXCEEDED", "CLIENT_ERROR",
                                         "The workspace has reached the quota for concurrent active runs."),
    "CLUSTER_REQUEST_LIMIT_EXCEEDED": Fate("TERMINATED", "FAILED", "CLUSTER_REQUEST_LIMIT_EXCEEDED", "CLIENT_ERROR",
                                           "Cluster creation requests exceeded the allowed rate limit."),
    "DISABLED": Fate("TERMINATED", "DISABLED", "DISABLED", "CLIENT_ERROR", "The run was disabled."),
    "BUDGET_POLICY_LIMIT_EXCEEDED": Fate("TERMINATED", "FAILED", "BUDGET_POLICY_LIMIT_EXCEEDED", "CLIENT_ERROR",
                                         "The budget policy's limit was reached."),
}
#: legacy life cycle states in which a run is over
FINISHED = ("TERMINATED", "SKIPPED", "INTERNAL_ERROR")


@dataclass
class FakeRun:
    run_id: int
    job_id: int
    parameters: dict[str, str]
    token: str | None
    start_ms: int
    run_name: str
    trigger: str = "ONE_TIME"
    #: status.state while active (QUEUED, PENDING, RUNNING, TERMINATING, BLOCKED, WAITING); the fate's
    #: life cycle state once over
    lifecycle: str = "QUEUED"
    fate: Fate | None = None
    message: str = ""
    end_ms: int = 0
    #: repairs of this run (the API's repair_history after its ORIGINAL entry)
    repairs: list[dict[str, Any]] = field(default_factory=list)
    #: the run's tasks once over: task key -> fate name (runs/get ``tasks``; runs/list leaves them out)
    tasks: dict[str, str] = field(default_factory=dict)

    @property
    def result(self) -> str | None:
        return self.fate.result_state if self.fate else None


@dataclass
class FakeJob:
    job_id: int
    name: str
    parameters: dict[str, str] = field(default_factory=dict)  # declared job parameters and defaults
    max_concurrent_runs: int = 1000
    #: bundle jobs queue by default; with queueing off a run over max_concurrent_runs is skipped
    queue: bool = True
    #: a fate (name of FATES) every new run of the job ends in at once: the workspace did not execute it
    #: (WORKSPACE_RUN_LIMIT_EXCEEDED, DISABLED, ...); None: runs start normally
    refuse: str | None = None


class JobsApiServer:
    """The server plus the test-facing controls (add jobs, move runs, inject faults, inspect state)."""

    def __init__(self, token: str = TOKEN):
        self.token = token
        self.host = ""
        self.jobs: dict[int, FakeJob] = {}
        self.runs: dict[int, FakeRun] = {}
        self._by_job: dict[int, list[FakeRun]] = {}
        self.tokens: dict[str, int] = {}
        self.requests: list[tuple[str, str, dict[str, Any]]] = []  # (method, path, query or body)
        self.counts: Counter[str] = Counter()  # calls per endpoint (``run-now``, ``runs/get``, ``runs/list``)
        #: seconds every answer waits (not holding the state lock: calls overlap as on a real workspace)
        self.latency_s = 0.0
        self.record_requests = True
        self._rates: dict[str, _Window] = {}
        self._every: dict[str, tuple[int, int]] = {}  # endpoint -> (n, Retry-After seconds)
        self._hooks: dict[tuple[str, int], Callable[[], None]] = {}
        self._faults: dict[str, list[Fault]] = {}
        self._lock = threading.RLock()
        self._ids = itertools.count(1001)
        self._httpd: ThreadingHTTPServer | None = None
        self.workspace = WorkspaceApi()  # secrets and SCIM users: a separate block below

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> JobsApiServer:
        self._httpd = _Server(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self.host = f"http://127.0.0.1:{self._httpd.server_port}"
        threading.Thread(target=self._httpd.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-jobs-api",
                         daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._httpd is not None
        self._httpd.shutdown()
        self._httpd.server_close()

    def client(self, *, token: str | None = None, http_timeout_s: float = 5.0, retry_timeout_s: int = 20,
               fast_retries: bool = True) -> WorkspaceClient:
        """A real SDK client for this server. ``fast_retries`` shortens the SDK's sleeps between retries."""
        cfg = Config(host=self.host, token=token or self.token, http_timeout_seconds=http_timeout_s,
                     retry_timeout_seconds=retry_timeout_s, clock=_FastClock() if fast_retries else RealClock())
        client = WorkspaceClient(config=cfg)
        # The SDK sizes its connection pool (20) for https only; give plain http the same, as a workspace has.
        client.api_client._api_client._session.mount("http://", HTTPAdapter(pool_connections=20, pool_maxsize=20,
                                                                            pool_block=True))
        return client

    # -- test controls ------------------------------------------------------------------------

    def add_job(self, name: str = "downstream", parameters: dict[str, str] | None = None, *,
                job_id: int | None = None, max_concurrent_runs: int = 1000, queue: bool = True) -> int:
        with self._lock:
            job_id = job_id or next(self._ids) * 1_000_000
            declared = {"heartbeat_run_id": "", "heartbeat_windows": "[]"} if parameters is None else parameters
            self.jobs[job_id] = FakeJob(job_id, name, declared, max_concurrent_runs, queue)
            return job_id

    def start_run(self, run_id: int | str, state: str = "RUNNING") -> None:
        """Move an active run to ``state`` (RUNNING, PENDING, BLOCKED, WAITING, TERMINATING, QUEUED)."""
        with self._lock:
            self.runs[int(run_id)].lifecycle = state

    def finish_run(self, run_id: int | str, result: str = "SUCCESS", message: str = "", *,
                   end_ms: int | None = None, tasks: dict[str, str] | None = None) -> None:
        """End the run in fate ``result`` (a name of ``FATES``); ``message`` replaces the fate's own; ``tasks``
        (task key -> fate name) are its tasks' results, which runs/get shows."""
        with self._lock:
            run = self.runs[int(run_id)]
            run.tasks = dict(tasks or {})
            run.fate = FATES[result]
            run.lifecycle, run.end_ms = run.fate.life_cycle_state, end_ms or _now_ms()
            run.message = message or run.fate.message
            if run.repairs:
                run.repairs[-1]["end_time"] = run.end_ms
                run.repairs[-1]["state"] = self._state_json(run)
                run.repairs[-1]["status"] = self._status_json(run)

    def create_manual_run(self, job_id: int, result: str, *, start_ms: int | None = None,
                          end_ms: int | None = None) -> int:
        """A finished run started by a person (Run now in the UI), not by Heartbeat."""
        with self._lock:
            run = self._new_run(job_id, {}, None, trigger="ONE_TIME", start_ms=start_ms)
            self.finish_run(run.run_id, result, end_ms=end_ms)
            return run.run_id

    def inject(self, endpoint: str, fault: Fault, times: int = 1) -> None:
        """The next ``times`` calls to ``endpoint`` (e.g. ``run-now``, ``runs/get``) get ``fault``."""
        with self._lock:
            self._faults.setdefault(endpoint, []).extend([fault] * times)

    def clear_faults(self) -> None:
        with self._lock:
            self._faults.clear()

    def limit_rate(self, endpoint: str, per_second: int, retry_after: int = 1) -> None:
        """More than ``per_second`` calls to ``endpoint`` within one second answer 429 with Retry-After."""
        with self._lock:
            self._rates[endpoint] = _Window(per_second, retry_after)

    def throttle_every(self, endpoint: str, n: int, retry_after: int = 1) -> None:
        """Every ``n``-th call to ``endpoint`` answers 429 with Retry-After (before taking effect); 0: off."""
        with self._lock:
            if n:
                self._every[endpoint] = (n, retry_after)
            else:
                self._every.pop(endpoint, None)

    def add_other_runs(self, active: int, completed: int = 0, *, start_ms: int | None = None) -> list[int]:
        """Runs of a job Heartbeat does not track (other teams' work in the same workspace)."""
        with self._lock:
            job = self.add_job("someone else's job")
            started = start_ms or _now_ms()
            runs = [self._new_run(job, {}, None, start_ms=started - i) for i in range(active + completed)]
            for run in runs[:active]:
                run.lifecycle = "RUNNING"
            for run in runs[active:]:
                self.finish_run(run.run_id, "SUCCESS", end_ms=run.start_ms + 1000)
            return [run.run_id for run in runs]

    def after_call(self, endpoint: str, n: int, action: Callable[[], None]) -> None:
        """Run ``action`` once the ``n``-th call to ``endpoint`` (counted from now) has taken effect, e.g.
        finish runs between two pages of a listing."""
        with self._lock:
            self._hooks[(endpoint, self.counts[endpoint] + n)] = action

    def reset_counts(self) -> None:
        with self._lock:
            self.counts.clear()

    def runs_of(self, job_id: int) -> list[FakeRun]:
        with self._lock:
            return [run for run in self.runs.values() if run.job_id == job_id]

    def calls(self, endpoint: str) -> int:
        with self._lock:
            return self.counts[endpoint]

    # -- the API ------------------------------------------------------------------------------

    def handle(self, method: str, path: str, params: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]]:
        """Answer one call: (status, JSON body, extra headers)."""
        endpoint = _endpoint(path)
        with self._lock:
            if self.record_requests:
                self.requests.append((method, path, params))
            self.counts[endpoint] += 1
            number = self.counts[endpoint]
            fault = self._faults[endpoint].pop(0) if self._faults.get(endpoint) else self._throttled(endpoint)
        time.sleep(self.latency_s)
        if fault is not None and not fault.after_effect:
            time.sleep(fault.delay_s)
            if fault.status is not None:
                return _fault_answer(fault)
        status, body = self._apply(method, path, endpoint, params)
        with self._lock:
            hook = self._hooks.pop((endpoint, number), None)
            if hook is not None:
                hook()
        if fault is not None and fault.after_effect:
            time.sleep(fault.delay_s)
            if fault.status is not None:
                return _fault_answer(fault)
        return status, body, {}

    def _throttled(self, endpoint: str) -> Fault | None:
        """A 429 when the endpoint's rate limit or throttle cadence says so (under the lock)."""
        window = self._rates.get(endpoint)
        if window is not None and not window.admit(time.monotonic()):
            return replace(THROTTLED, retry_after=window.retry_after)
        every = self._every.get(endpoint)
        if every is not None and self.counts[endpoint] % every[0] == 0:
            return replace(THROTTLED, retry_after=every[1])
        return None

    def _apply(self, method: str, path: str, endpoint: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        if path == "/.well-known/databricks-config":
            return 200, {}
        if path.startswith(WorkspaceApi.PREFIXES):
            return self.workspace.answer(method, path, params)
        routes = {
            ("POST", "run-now"): self._run_now,
            ("GET", "get"): self._get_job,
            ("GET", "runs/get"): self._get_run,
            ("GET", "runs/list"): self._list_runs,
            ("POST", "runs/cancel"): self._cancel_run,
            ("POST", "runs/repair"): self._repair_run,
        }
        route = routes.get((method, endpoint)) if path.startswith(("/api/2.1/jobs/", "/api/2.2/jobs/")) else None
        if route is None:
            return 404, {"error_code": "ENDPOINT_NOT_FOUND", "message": f"No API found for '{method} {path}'"}
        with self._lock:
            return route(params)

    def _run_now(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        job_id = int(body.get("job_id") or 0)
        if job_id not in self.jobs:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Job {job_id} does not exist."}
        token = body.get("idempotency_token")
        if token is not None and len(token) > 64:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": "idempotency_token is too long"}
        if token in self.tokens:
            run_id = self.tokens[token]
        else:
            job = self.jobs[job_id]
            active = sum(1 for r in self._by_job.get(job_id, []) if r.lifecycle not in FINISHED)
            run = self._new_run(job_id, dict(body.get("job_parameters") or {}), token)
            run_id = run.run_id
            if job.refuse is not None:
                self.finish_run(run_id, job.refuse, end_ms=run.start_ms)
            elif active >= job.max_concurrent_runs and not job.queue:
                self.finish_run(run_id, "SKIPPED", FATES["SKIPPED"].message.replace(
                    "limit of 1", f"limit of {job.max_concurrent_runs}"), end_ms=run.start_ms)
        return 200, {"run_id": run_id, "number_in_job": run_id}

    def _new_run(self, job_id: int, parameters: dict[str, str], token: str | None, *, trigger: str = "ONE_TIME",
                 start_ms: int | None = None) -> FakeRun:
        run_id = next(self._ids)
        run = FakeRun(run_id, job_id, parameters, token, start_ms or _now_ms(), self.jobs[job_id].name, trigger)
        self.runs[run_id] = run
        self._by_job.setdefault(job_id, []).append(run)
        if token is not None:
            self.tokens[token] = run_id
        return run

    def _get_job(self, query: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        job = self.jobs.get(int(query.get("job_id", 0)))
        if job is None:
            return 400, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": f"Job {query.get('job_id')} does not exist."}
        return 200, {"job_id": job.job_id, "creator_user_name": "owner@example.com", "created_time": 0,
                     "settings": {"name": job.name, "max_concurrent_runs": job.max_concurrent_runs,
                                  "queue": {"enabled": job.queue},
                                  "parameters": [{"name": k, "default": v} for k, v in job.parameters.items()]}}

    def _get_run(self, query: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        run = self.runs.get(int(query.get("run_id", 0)))
        if run is None:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Run {query.get('run_id')} does not exist."}
        return 200, self._run_json(run, tasks=True)

    def _list_runs(self, query: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        runs: list[FakeRun] | Any = self.runs.values()
        if "job_id" in query:
            job_id = int(query["job_id"])
            if job_id not in self.jobs:
                return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Job {job_id} does not exist."}
            runs = self._by_job.get(job_id, [])
        if query.get("completed_only") == "true":
            runs = [r for r in runs if r.lifecycle in FINISHED]
        if query.get("active_only") == "true":
            runs = [r for r in runs if r.lifecycle not in FINISHED]
        if "start_time_from" in query:
            runs = [r for r in runs if r.start_ms >= int(query["start_time_from"])]
        if "start_time_to" in query:
            runs = [r for r in runs if r.start_ms <= int(query["start_time_to"])]
        runs = sorted(runs, key=lambda r: (r.start_ms, r.run_id), reverse=True)
        limit = min(int(query.get("limit") or 20) or 25, 25)
        offset = int(query.get("page_token") or 0)
        page = runs[offset:offset + limit]
        more = offset + limit < len(runs)
        answer: dict[str, Any] = {"runs": [self._run_json(r) for r in page], "has_more": more}
        if more:
            answer["next_page_token"] = str(offset + limit)
        return 200, answer

    def _cancel_run(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        run = self.runs.get(int(body.get("run_id") or 0))
        if run is None:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Run {body.get('run_id')} does not exist."}
        if run.lifecycle not in FINISHED:
            self.finish_run(run.run_id, "CANCELED")
        return 200, {}

    def _repair_run(self, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """POST runs/repair: a finished, unsuccessful run runs again under the same run id; its
        repair_history gains an entry and the run is RUNNING until a test finishes it."""
        run = self.runs.get(int(body.get("run_id") or 0))
        if run is None:
            return 400, {"error_code": "INVALID_PARAMETER_VALUE", "message": f"Run {body.get('run_id')} does not exist."}
        if run.lifecycle not in FINISHED or run.result == "SUCCESS":
            return 400, {"error_code": "INVALID_STATE_TRANSITION",
                         "message": f"Run {run.run_id} cannot be repaired: it is {run.result or run.lifecycle}."}
        repair_id = next(self._ids)
        run.repairs.append({"id": repair_id, "type": "REPAIR", "start_time": _now_ms(), "end_time": 0,
                            "task_run_ids": []})
        run.lifecycle, run.fate, run.message, run.end_ms = "RUNNING", None, "", 0
        run.repairs[-1]["state"], run.repairs[-1]["status"] = self._state_json(run), self._status_json(run)
        return 200, {"repair_id": repair_id}

    def repair_run(self, run_id: int | str) -> int:
        """Repair a finished run as a person would (Repair run in the UI); returns the repair id."""
        with self._lock:
            status, body = self._repair_run({"run_id": int(run_id)})
            assert status == 200, body
            return int(body["repair_id"])

    @staticmethod
    def _state_json(run: FakeRun) -> dict[str, Any]:
        """The legacy ``state`` of a run."""
        state: dict[str, Any] = {"life_cycle_state": run.lifecycle if run.fate is None else run.fate.life_cycle_state,
                                 "state_message": run.message,
                                 "user_cancelled_or_timedout": run.result in ("CANCELED", "TIMEDOUT")}
        if run.fate is not None and run.fate.result_state is not None:
            state["result_state"] = run.fate.result_state
        return state

    @staticmethod
    def _status_json(run: FakeRun) -> dict[str, Any]:
        """The API 2.2 ``status`` of a run: a SKIPPED run is TERMINATED with its skip code."""
        if run.fate is None:
            status: dict[str, Any] = {"state": run.lifecycle}
            if run.lifecycle == "QUEUED":
                status["queue_details"] = {"code": "ACTIVE_RUNS_LIMIT_REACHED", "message": "Queued"}
            return status
        return {"state": "TERMINATED", "termination_details": {
            "code": run.fate.code, "type": run.fate.type, "message": run.message}}

    def _run_json(self, run: FakeRun, *, tasks: bool = False) -> dict[str, Any]:
        """A run as API 2.2 returns it: the deprecated ``state`` and the newer ``status``; a repaired run
        its ``repair_history`` (the ORIGINAL attempt first, then each repair); with ``tasks`` (runs/get, not
        runs/list without expand_tasks) its tasks, each with its own state and status."""
        finished = run.fate is not None
        state, status = self._state_json(run), self._status_json(run)
        declared = self.jobs[run.job_id].parameters
        values = {**declared, **run.parameters}
        return {
            "job_id": run.job_id, "run_id": run.run_id, "number_in_job": run.run_id,
            "original_attempt_run_id": run.run_id, "creator_user_name": "heartbeat@example.com",
            "run_name": run.run_name, "run_type": "JOB_RUN", "trigger": run.trigger,
            "run_page_url": f"{self.host}/jobs/{run.job_id}/runs/{run.run_id}",
            "start_time": run.start_ms, "end_time": run.end_ms if finished else 0,
            "setup_duration": 0, "cleanup_duration": 0,
            "execution_duration": (run.end_ms - run.start_ms) if finished else 0,
            "run_duration": (run.end_ms - run.start_ms) if finished else 0,
            "state": state, "status": status,
            "job_parameters": [{"name": k, "default": declared.get(k, ""), "value": v} for k, v in values.items()],
            **({"tasks": [{"task_key": key, "run_id": run.run_id * 100 + n,
                            "state": {"life_cycle_state": FATES[fate].life_cycle_state,
                                      "result_state": FATES[fate].result_state},
                            "status": {"state": "TERMINATED", "termination_details": {
                                "code": FATES[fate].code, "type": FATES[fate].type}}}
                           for n, (key, fate) in enumerate(run.tasks.items())]} if tasks else {}),
            **({"repair_history": [{"id": run.run_id, "type": "ORIGINAL", "start_time": run.start_ms,
                                    "end_time": run.repairs[0]["start_time"], "task_run_ids": []},
                                   *[dict(r) for r in run.repairs]]} if run.repairs else {}),
        }


@dataclass
# -- the workspace beside the Jobs API: secrets and SCIM users (kept apart from the jobs parts) -------


class WorkspaceApi:
    """Secret scopes (``GET /api/2.0/secrets/get``) and workspace users with their groups (``GET
    /api/2.0/preview/scim/v2/Users`` filtered by ``userName eq "..."``), in the real API's shapes.

    Tests put secrets and users here (``server.workspace.put_secret``, ``add_user``); ``reads`` counts
    the secret reads per ``scope/key``."""

    PREFIXES = ("/api/2.0/secrets/", "/api/2.0/preview/scim/v2/")

    def __init__(self) -> None:
        self.secrets: dict[tuple[str, str], bytes] = {}
        self.users: dict[str, frozenset[str]] = {}  # userName (e-mail) -> group display names
        self.reads: Counter[str] = Counter()
        self._lock = threading.Lock()

    def put_secret(self, scope: str, key: str, value: str) -> None:
        with self._lock:
            self.secrets[(scope, key)] = value.encode()

    def add_user(self, email: str, groups: tuple[str, ...] = ()) -> None:
        with self._lock:
            self.users[email] = frozenset(groups)

    def answer(self, method: str, path: str, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        with self._lock:
            if (method, path) == ("GET", "/api/2.0/secrets/get"):
                return self._get_secret(str(params.get("scope", "")), str(params.get("key", "")))
            if (method, path) == ("GET", "/api/2.0/preview/scim/v2/Users"):
                return self._list_users(params)
        return 404, {"error_code": "ENDPOINT_NOT_FOUND", "message": f"No API found for '{method} {path}'"}

    def _get_secret(self, scope: str, key: str) -> tuple[int, dict[str, Any]]:
        if not any(s == scope for s, _ in self.secrets):
            return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST", "message": f"Scope {scope} does not exist!"}
        if (scope, key) not in self.secrets:
            return 404, {"error_code": "RESOURCE_DOES_NOT_EXIST",
                         "message": f"Failed to get secret for key: {key} in scope: {scope}"}
        self.reads[f"{scope}/{key}"] += 1
        return 200, {"key": key, "value": base64.b64encode(self.secrets[(scope, key)]).decode()}

    def _list_users(self, params: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        match = re.fullmatch(r'userName eq "(.*)"', str(params.get("filter", "")))
        found = [{"id": str(abs(hash(name)) % 10**12), "userName": name,
                  "groups": [{"display": g, "value": str(abs(hash(g)) % 10**12)} for g in sorted(groups)]}
                 for name, groups in sorted(self.users.items())
                 if match is None or name.lower() == match.group(1).lower()]
        start = int(params.get("startIndex", 1))
        count = int(params.get("count", 100))
        page = found[start - 1:start - 1 + count]
        return 200, {"schemas": ["urn:ietf:params:scim:api:messages:2.0:ListResponse"], "totalResults": len(found),
                     "startIndex": start, "itemsPerPage": len(page), "Resources": page}


class _Window:
    """A sliding one-second window of admitted calls (a rate limit)."""

    per_second: int
    retry_after: int
    admitted: deque[float] = field(default_factory=deque)

    def admit(self, now: float) -> bool:
        while self.admitted and now - self.admitted[0] >= 1.0:
            self.admitted.popleft()
        if len(self.admitted) >= self.per_second:
            return False
        self.admitted.append(now)
        return True


class _FastClock(Clock):
    """Real time, but the SDK's back-off sleeps between retries are capped at 50 ms."""

    def __init__(self) -> None:
        self._skipped = 0.0

    def time(self) -> float:
        return time.time() + self._skipped

    def sleep(self, seconds: float) -> None:
        time.sleep(min(seconds, 0.05))
        self._skipped += max(0.0, seconds - 0.05)


def _handler_for(server: JobsApiServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # TCP_NODELAY: headers and body go out at once, not ~47 ms apart

        def do_GET(self) -> None:
            self._serve({k: v[-1] for k, v in parse_qs(urlparse(self.path).query).items()})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            self._serve(json.loads(raw) if raw else {})

        def _serve(self, params: dict[str, Any]) -> None:
            path = urlparse(self.path).path
            if path.startswith("/api/") and self.headers.get("Authorization") != f"Bearer {server.token}":
                status, body, headers = 403, {"error_code": "403", "message": "Invalid access token."}, {}
            else:
                status, body, headers = server.handle(self.command, path, params)
            payload = json.dumps(body).encode()
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client gave up waiting (an injected read timeout)

        def log_message(self, format: str, *args: object) -> None:
            pass

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # many workers connect at once


def _fault_answer(fault: Fault) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers = {"Retry-After": str(fault.retry_after)} if fault.retry_after is not None else {}
    return fault.status or 500, {"error_code": fault.error_code, "message": fault.message}, headers


def _endpoint(path: str) -> str:
    """``/api/2.2/jobs/runs/get`` → ``runs/get``."""
    for prefix in ("/api/2.1/jobs/", "/api/2.2/jobs/"):
        if path.startswith(prefix):
            return path[len(prefix):]
    return path


def _now_ms() -> int:
    return int(time.time() * 1000)


#: Ready-made faults.
THROTTLED = Fault(429, "REQUEST_LIMIT_EXCEEDED", "Too many requests, slow down.", retry_after=0)
UNAVAILABLE = Fault(503, "TEMPORARILY_UNAVAILABLE", "The service is temporarily unavailable.", retry_after=0)
UNAVAILABLE_AFTER_RUN = Fault(503, "TEMPORARILY_UNAVAILABLE", "The service is temporarily unavailable.",
                              retry_after=0, after_effect=True)
SERVER_ERROR = Fault(500, "INTERNAL_ERROR", "Internal server error (request id 7f3a).", after_effect=True)
UNAUTHENTICATED = Fault(401, "UNAUTHENTICATED",
                        "Credential was not sent or was of an unsupported type for this API.")


def slow(delay_s: float) -> Fault:
    """Apply the call, then answer only after ``delay_s`` (beyond the client's timeout: a read timeout)."""
    return Fault(None, delay_s=delay_s, after_effect=True)


__all__ = ["JobsApiServer", "WorkspaceApi", "Fault", "FakeRun", "Fate", "FATES", "THROTTLED", "UNAVAILABLE", "UNAVAILABLE_AFTER_RUN",
           "SERVER_ERROR", "UNAUTHENTICATED", "slow", "TOKEN"]
