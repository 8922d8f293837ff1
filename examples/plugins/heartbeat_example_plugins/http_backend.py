"""``http_post``: a job run is an HTTP POST to a jobs service (``http_service`` is a small one).

The service's address comes from ``HEARTBEAT_HTTP_JOBS_URL`` (e.g. ``http://127.0.0.1:8765``); a
secret would come from the environment the same way. The service API (JSON):

- ``POST /runs`` ``{"job_id", "idempotency_token", "parameters"}`` -> ``{"run_id"}``; the same token
  returns the same run (the exactly-once contract of ``JobsBackend.trigger``);
- ``GET /runs/<run id>`` -> ``{"run_id", "job_id", "state", "start_time", "end_time", "message"}``,
  ``state`` one of PENDING, RUNNING, SUCCESS, FAILED, times ISO 8601;
- ``GET /runs?job_id=<id>&state=SUCCESS`` -> ``{"runs": [...]}``.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from typing import Any

from heartbeat_runner.core.errors import JobNotFoundError, JobsBackendError
from heartbeat_runner.core.settings import Settings
from heartbeat_runner.jobs.base import JobsBackend, RunOutcome, RunStatus, TriggerRequest

URL_VARIABLE = "HEARTBEAT_HTTP_JOBS_URL"
TIMEOUT_S = 10.0


class HttpPostJobsBackend(JobsBackend):
    name = "http_post"

    def __init__(self, base_url: str):
        self.base_url = base_url.rstrip("/")

    @classmethod
    def from_settings(cls, settings: Settings) -> HttpPostJobsBackend:
        url = os.environ.get(URL_VARIABLE)
        if not url:
            raise JobsBackendError(f"the http_post jobs backend needs {URL_VARIABLE} (the jobs service's URL)")
        return cls(url)

    def trigger(self, request: TriggerRequest) -> str:
        answer = self._call("POST", "/runs", {"job_id": request.job_id, "idempotency_token": request.idempotency_token,
                                              "parameters": request.parameters})
        return str(answer["run_id"])

    def run_status(self, job_id: str, run_id: str) -> RunStatus:
        return _status(self._call("GET", f"/runs/{urllib.parse.quote(run_id)}"))

    def successful_run_after(self, job_id: str, after: datetime) -> RunStatus | None:
        query = urllib.parse.urlencode({"job_id": job_id, "state": RunOutcome.SUCCESS.value})
        runs = [_status(r) for r in self._call("GET", f"/runs?{query}")["runs"]]
        done = [r for r in runs if r.end_time is not None and r.end_time > after]
        return max(done, key=lambda r: r.end_time or after, default=None)

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.base_url + path, data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
                return json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise JobNotFoundError(f"{method} {path}: not found at {self.base_url}") from exc
            raise JobsBackendError(f"{method} {path}: HTTP {exc.code}", retryable=exc.code >= 500) from exc
        except (urllib.error.URLError, TimeoutError) as exc:  # unknown whether the call arrived: retry it
            raise JobsBackendError(f"{method} {path}: {exc}", retryable=True) from exc


def _status(run: dict[str, Any]) -> RunStatus:
    def when(key: str) -> datetime | None:
        return datetime.fromisoformat(run[key]) if run.get(key) else None

    return RunStatus(str(run["run_id"]), RunOutcome(run["state"]), run.get("message"), when("start_time"),
                     when("end_time"))
