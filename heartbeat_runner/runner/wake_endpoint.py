"""``POST /wake``: anything that knows a source changed (a Databricks file-arrival or table-update job, an
upstream product's webhook, a script) tells the running loop, which senses it at once.

Request: ``POST /wake`` with ``Authorization: Bearer <HEARTBEAT_WAKE_TOKEN>`` and, optionally, a JSON body
``{"sources": ["<sensor_id or source_key>", ...]}``; without sources the loop polls every source now.
Answers: 202 with what was woken and what was not known, 400 for a body that is not that shape, 401
without the token, 404 elsewhere, 413 past MAX_BODY bytes.

Invariants:

- the endpoint only wakes the loop (runner/wakeups.py): it reads and writes no table, so a caller can
  never make a tick do anything a poll would not; a wake-up for an unknown name wakes nothing;
- it is off unless ``HEARTBEAT_WAKE_PORT`` is set, and then refuses to start without a token; the token
  is compared in constant time and never logged or echoed;
- it binds ``HEARTBEAT_WAKE_HOST`` (default 127.0.0.1: this machine only) and serves from a daemon thread.
"""

from __future__ import annotations

import contextlib
import hmac
import json
import logging
import threading
from collections.abc import Callable, Iterator
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from heartbeat_runner.core.errors import InvalidInputError
from heartbeat_runner.core.http_bodies import BodyTooLarge, read_body
from heartbeat_runner.core.settings import Settings
from heartbeat_runner.runner.wakeups import WakeSignal

log = logging.getLogger(__name__)

#: the largest request body read
MAX_BODY = 64 * 1024
#: names one request may wake
MAX_SOURCES = 10_000

#: the source keys a name (a sensor_id or a source key) stands for, among the sources being watched
Names = Callable[[str], frozenset[str]]


def check_wake_token(settings: Settings, port_from: str = "HEARTBEAT_WAKE_PORT") -> None:
    """InvalidInputError when a wake port is set without HEARTBEAT_WAKE_TOKEN, naming where the port came from
    (``port_from``: the variable, or ``--wake-port`` when the flag set it). ``run --loop`` asks it before it
    opens anything."""
    if settings.wake_port is not None and not settings.wake_token:
        raise InvalidInputError(f"{port_from} is set but HEARTBEAT_WAKE_TOKEN is not: "
                                "POST /wake needs a token (set it from a secret, never in a file)")


@contextlib.contextmanager
def wake_endpoint(settings: Settings, wakes: WakeSignal, names: Names) -> Iterator[ThreadingHTTPServer | None]:
    """Serve ``POST /wake`` while the block runs (None, nothing served, when no port is set)."""
    if settings.wake_port is None:
        yield None
        return
    check_wake_token(settings)
    token = settings.wake_token or ""  # set: checked just above
    server = make_wake_server(settings.wake_host, settings.wake_port, token, wakes, names)
    thread = threading.Thread(target=server.serve_forever, name="heartbeat-wake", daemon=True)
    thread.start()
    log.info("POST /wake served on %s:%d", settings.wake_host, server.server_address[1])
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def make_wake_server(host: str, port: int, token: str, wakes: WakeSignal, names: Names) -> ThreadingHTTPServer:
    """The server (not started); port 0 picks a free one (``server.server_address``)."""

    class Handler(_WakeHandler):
        pass

    Handler.token, Handler.wakes, Handler.names = token, wakes, staticmethod(names)
    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:
        raise InvalidInputError(f"POST /wake cannot listen on {host}:{port}: {exc.strerror or exc}") from exc
    server.daemon_threads = True
    return server


class _WakeHandler(BaseHTTPRequestHandler):
    token: str
    wakes: WakeSignal
    names: Names

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        log.debug("wake endpoint: " + format, *args)

    def do_POST(self) -> None:  # noqa: N802 - http.server's naming
        try:
            status, answer = self._wake()
        except (BrokenPipeError, ConnectionResetError):
            return
        self._answer(status, answer)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self._answer(HTTPStatus.METHOD_NOT_ALLOWED if self.path == "/wake" else HTTPStatus.NOT_FOUND,
                     {"error": "POST /wake"})

    def _wake(self) -> tuple[HTTPStatus, dict[str, Any]]:
        if self.path.split("?")[0] != "/wake":
            return HTTPStatus.NOT_FOUND, {"error": "POST /wake"}
        if not self._authorized():
            return HTTPStatus.UNAUTHORIZED, {"error": "Authorization: Bearer <HEARTBEAT_WAKE_TOKEN> required"}
        try:
            asked = _sources(read_body(self.headers, self.rfile, MAX_BODY))
        except BodyTooLarge as exc:
            return HTTPStatus.REQUEST_ENTITY_TOO_LARGE, {"error": str(exc)}
        except InvalidInputError as exc:
            return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        if asked is None:
            self.wakes.wake()
            return HTTPStatus.ACCEPTED, {"woken": "every source"}
        woken: set[str] = set()
        unknown = []
        for name in asked:
            keys = self.names(name)
            woken |= keys
            if not keys:
                unknown.append(name[:200])
        self.wakes.wake_all(sorted(woken))
        return HTTPStatus.ACCEPTED, {"woken": len(woken), "unknown": unknown}

    def _authorized(self) -> bool:
        scheme, _, given = (self.headers.get("Authorization") or "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self.token.encode())

    def _answer(self, status: HTTPStatus, answer: dict[str, Any]) -> None:
        body = json.dumps(answer).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller went away; it has nothing to learn


def _sources(body: bytes) -> list[str] | None:
    """The names in ``{"sources": [...]}``; None for an empty body or no ``sources`` (wake every source)."""
    if not body.strip():
        return None
    try:
        found = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise InvalidInputError('the body must be JSON: {"sources": ["<sensor_id>", ...]}') from None
    if not isinstance(found, dict):
        raise InvalidInputError('the body must be a JSON object: {"sources": ["<sensor_id>", ...]}')
    sources = found.get("sources")
    if sources is None:
        return None
    if not isinstance(sources, list) or not all(isinstance(s, str) and s for s in sources):
        raise InvalidInputError('"sources" must be a list of sensor ids or source keys (text)')
    if len(sources) > MAX_SOURCES:
        raise InvalidInputError(f'"sources" names more than {MAX_SOURCES}')
    return sources
