"""``ui``: the status page, a small HTTP server over the lakehouse.

One process serves the page and its JSON API from the package itself (no CDN: it works
offline). Every API call reads the same views as the CLI through one open engine; the
engine is used by one request at a time (``_engine_lock``) and the overview is cached
for a second so that many open pages cost one read. Between two reads, under the same lock,
the embedded engine's process is recycled when due (``runner.memory.EngineRecycler``). It binds to 127.0.0.1 unless told
otherwise (a Databricks App binds where ``DATABRICKS_APP_PORT`` says, behind the
workspace's sign-in proxy).

Routes::

    GET  /                               the page (overview, graph, job, ticks by #hash)
    GET  /static/<file>                  its script and style sheet
    GET  /favicon.svg, /favicon.ico      its icon (SVG)
    GET  /metrics                        this process's Prometheus metrics (core/metrics.py)
    GET  /api/meta                       version, refresh interval, whether this user may act, time zone
    GET  /api/runner                     is a runner ticking: last tick, its interval, the limit
    GET  /api/overview                   every job: phase, dependencies, last run
    GET  /api/alerts                     the open alerts (heartbeat_alerts), newest first
    GET  /api/graph                      sources -> jobs (nodes and hard/soft edges)
    GET  /api/jobs/<job>                 explain verdict, runs, events
    GET  /api/jobs/<job>/runs/<run>/output   the run's output (text, or a redirect to its page)
    GET  /api/ticks                      recent ticks, stage durations, errors and skips
    POST /api/actions/<action>           pause | resume | complete | retry | trigger | reset (see ui.actions)
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import unquote, urlsplit

from heartbeat_runner import __version__
from heartbeat_runner.core.errors import HeartbeatError, InvalidInputError, describe
from heartbeat_runner.core.http_bodies import read_body
from heartbeat_runner.core.metrics import CONTENT_TYPE, metrics
from heartbeat_runner.interfaces.operations import refresh_if_idle, runner_health, shown_id
from heartbeat_runner.interfaces.outcomes import outcome_of
from heartbeat_runner.interfaces.ui import data
from heartbeat_runner.interfaces.ui.actions import ActionPolicy, ActionRefused, ActionRequest, forwarded_user, perform
from heartbeat_runner.jobs.base import JobsBackend
from heartbeat_runner.policies.run_policies import load_run_policies
from heartbeat_runner.runner.app import App
from heartbeat_runner.runner.lease import tick_lease
from heartbeat_runner.runner.memory import EngineRecycler

log = logging.getLogger(__name__)

#: What the page's files are served as; nothing else under static/ is served.
STATIC_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml"}
#: A POST to /api/actions must carry this header: a cross-site form cannot set it (CSRF).
ACTION_HEADER = "X-Heartbeat-Action"
DEFAULT_REFRESH_S = 5.0
OVERVIEW_CACHE_S = 1.0
MAX_BODY_BYTES = 64 * 1024
#: what writing to (or reading from) a client that went away raises
CLIENT_GONE = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


@dataclass
class StatusPage:
    """What the handler needs: the open app, who may act, and a lazily made jobs backend."""

    app: App
    policy: ActionPolicy
    refresh_s: float = DEFAULT_REFRESH_S
    backend_factory: Callable[[], JobsBackend] | None = None
    _engine_lock: threading.Lock = field(default_factory=threading.Lock)
    _cache: tuple[float, list[data.JobSummary]] | None = None
    _backend: JobsBackend | None = None
    _recycler: EngineRecycler | None = None

    def read(self, what: Callable[[], Any]) -> Any:
        """Run one read against the engine (one at a time); then recycle the engine if it is due."""
        if self._recycler is None:
            # never parked: a page's next poll would wait for a new engine
            self._recycler = EngineRecycler(self.app, replace(self.app.settings.memory, engine_park_after_s=0))
        with self._engine_lock:
            try:
                return what()
            finally:
                self._recycler.after_use()

    def jobs(self) -> list[data.JobSummary]:
        now = time.monotonic()
        if self._cache is None or now - self._cache[0] > OVERVIEW_CACHE_S:
            shaping = load_run_policies(self.app.settings.run_policy_file).trigger
            self._cache = (now, self.read(lambda: data.overview(self.app.store, self.app.settings.lakehouse_dir,
                                                                shaping)))
        return self._cache[1]

    def backend(self) -> JobsBackend:
        if self._backend is None:
            self._backend = (self.backend_factory or self.app.jobs_backend)()
        return self._backend

    def act(self, request: ActionRequest, by: str) -> str:
        """Perform an action (its event appended), then rebuild the control table if no runner is ticking and
        this process has the dbt project. Without it (a Databricks App holds the wheel alone) the event is the
        whole action: the runner's next tick derives the control table from it, as it does for an event any
        other process appends, and the answer says so."""
        def run() -> str:
            done = perform(self.app, request, by)
            if not self.app.dbt.available:
                return f"{done}; the runner's next tick shows it in the control table"
            refresh_if_idle(self.app, tick_lease(self.app.store))
            return done

        message = self.read(run)
        self._cache = None
        log.info("ui action: %s", message)
        return message


class Handler(BaseHTTPRequestHandler):
    """Routes GETs to the page and its API, and POSTs to actions."""

    page: StatusPage  # set on the subclass make_server() builds
    server_version = f"heartbeat/{__version__}"

    # -- plumbing -----------------------------------------------------------------------------

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("%s " + format, self.address_string(), *args)

    def _send(self, status: int, body: bytes, content_type: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
                         "frame-ancestors 'self'")
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, value: Any, status: int = HTTPStatus.OK) -> None:
        self._send(status, json.dumps(data.as_json(value)).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json({"error": message}, status)

    def _guarded(self, route: Callable[[], None]) -> None:
        """Turn errors into JSON answers, by their kind (``outcomes.ERROR_OUTCOMES``: 403 refused, 404 unknown
        job/run, 400 bad input, 409 conflict, 503 try again, 500 otherwise). A client that went away while
        its answer was written (the page navigated on) is one line at info level (``ui -v``), never a
        traceback: nobody is left to answer."""
        try:
            route()
        except CLIENT_GONE as exc:
            log.info("ui client %s went away during %s: %s", self.address_string(), shown_id(self.path), exc)
            self.close_connection = True
        except HeartbeatError as exc:
            self._error(outcome_of(exc).http_status, str(exc))
        except Exception as exc:  # noqa: BLE001 - a failing read answers this request only; the page stays up
            log.exception("ui request %s failed", shown_id(self.path))
            self._error(outcome_of(exc).http_status, describe(exc))

    def handle_one_request(self) -> None:
        """http.server's, with a client gone mid-request (reset while its request is read) ending quietly."""
        try:
            super().handle_one_request()
        except CLIENT_GONE as exc:
            log.info("ui client %s went away: %s", self.address_string(), exc)
            self.close_connection = True

    # -- GET ----------------------------------------------------------------------------------

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        path = urlsplit(self.path).path
        parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
        self._guarded(lambda: self._route_get(parts))

    def _route_get(self, parts: list[str]) -> None:
        page = self.page
        if not parts or parts == ["index.html"]:
            return self._static("index.html")
        if parts in (["favicon.svg"], ["favicon.ico"]):  # the page's icon (an SVG, also where browsers look)
            return self._static("favicon.svg")
        if parts[0] == "static" and len(parts) == 2:
            return self._static(parts[1])
        if parts == ["metrics"]:
            return self._send(HTTPStatus.OK, metrics().exposition(), CONTENT_TYPE)
        if parts[0] != "api":
            return self._error(HTTPStatus.NOT_FOUND, f"no page at /{shown_id('/'.join(parts))}")
        route = parts[1:]
        if route == ["meta"]:
            return self._json(self._meta())
        if route == ["runner"]:
            return self._json(page.read(lambda: runner_health(page.app.settings, page.app.store)).as_json())
        if route == ["overview"]:
            return self._json({"jobs": page.jobs()})
        if route == ["alerts"]:
            return self._json({"alerts": page.read(lambda: data.open_alerts(page.app.store, page.app.settings.lakehouse_dir))})
        if route == ["graph"]:
            return self._json(data.graph(page.jobs()))
        if route == ["ticks"]:
            return self._json(page.read(lambda: data.ticks(page.app.store)))
        if len(route) == 2 and route[0] == "jobs":
            settings = page.app.settings
            return self._json(page.read(lambda: data.job_page(page.app.store, route[1], settings.run_policy_file,
                                                              settings.lakehouse_dir)))
        if len(route) == 5 and route[0] == "jobs" and route[2] == "runs" and route[4] == "output":
            return self._run_output(route[1], route[3])
        return self._error(HTTPStatus.NOT_FOUND, f"no API at /{shown_id('/'.join(parts))}")

    def _meta(self) -> dict[str, Any]:
        policy = self.page.policy
        return {"version": __version__, "refresh_s": self.page.refresh_s, "actions_enabled": policy.enabled,
                "can_act": policy.can_act(self.headers), "user": forwarded_user(self.headers),
                "schema": self.page.app.settings.schema, "phases": [phase.value for phase in data.JobPhase],
                "timezone": self.page.app.settings.timezone}

    def _static(self, name: str) -> None:
        suffix = name[name.rfind("."):] if "." in name else ""
        if "/" in name or suffix not in STATIC_TYPES:
            return self._error(HTTPStatus.NOT_FOUND, f"no file {shown_id(name)}")
        asset = resources.files("heartbeat_runner.interfaces.ui").joinpath("static", name)
        if not asset.is_file():
            return self._error(HTTPStatus.NOT_FOUND, f"no file {shown_id(name)}")
        self._send(HTTPStatus.OK, asset.read_bytes(), STATIC_TYPES[suffix])

    def _run_output(self, job_id: str, run_id: str) -> None:
        output = self.page.read(lambda: data.run_output(self.page.app.store, self.page.backend(), job_id, run_id))
        if output is None:
            return self._error(HTTPStatus.NOT_FOUND, f"no output is kept for run {shown_id(run_id)} of job "
                                                     f"{shown_id(job_id)} "
                                                     "(or it is not a run of that job)")
        if output.url:
            return self._send(HTTPStatus.FOUND, b"", "text/plain", {"Location": output.url})
        self._send(HTTPStatus.OK, (output.text or "").encode(), "text/plain; charset=utf-8")

    # -- POST ---------------------------------------------------------------------------------

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        parts = [unquote(p) for p in urlsplit(self.path).path.strip("/").split("/")]
        self._guarded(lambda: self._route_post(parts))

    def _route_post(self, parts: list[str]) -> None:
        if len(parts) != 3 or parts[:2] != ["api", "actions"]:
            return self._error(HTTPStatus.NOT_FOUND, "actions are POSTed to /api/actions/<action>")
        by = self.page.policy.operator(self.headers)
        if self.headers.get(ACTION_HEADER) != "confirm":
            raise ActionRefused(f"an action needs the {ACTION_HEADER}: confirm header (sent by the page after "
                                "you confirm)")
        request = ActionRequest.parse(parts[2], self._body())
        self._json({"done": self.page.act(request, by)})

    def _body(self) -> dict[str, Any]:
        """The request's JSON object; InvalidInputError (400, one line) for a Content-Length that is not a
        whole number from 0 to MAX_BODY_BYTES, a body that is not JSON, or JSON that is not an object."""
        try:
            body = json.loads(read_body(self.headers, self.rfile, MAX_BODY_BYTES) or b"{}")
        except ValueError as exc:
            raise InvalidInputError(f"request body is not JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise InvalidInputError("request body must be a JSON object")
        return body


def make_server(page: StatusPage, host: str, port: int) -> ThreadingHTTPServer:
    """A threaded HTTP server bound to ``host:port`` (port 0: any free port) serving ``page``."""
    handler = type("StatusPageHandler", (Handler,), {"page": page})
    try:
        server = ThreadingHTTPServer((host, port), handler)
    except OSError as exc:  # busy port, an address this machine does not have, a port below 1024 without root
        raise HeartbeatError(f"cannot listen on {host}:{port}: {exc.strerror or exc} "
                             "(is another program using it? choose another with --port / --host)") from exc
    server.daemon_threads = True
    return server
