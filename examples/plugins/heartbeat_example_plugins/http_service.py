"""A small jobs service for the ``http_post`` backend: it keeps every run in memory and "runs" a job
by recording the parameters it was sent (the run succeeds at once). For trying the plugin and for
Heartbeat's tests; binds loopback only.

    python -m heartbeat_example_plugins.http_service --port 8765
"""

from __future__ import annotations

import argparse
import json
import threading
import urllib.parse
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class JobsService(ThreadingHTTPServer):
    """The runs (by id) and the tokens that created them."""

    def __init__(self, port: int = 0):
        super().__init__(("127.0.0.1", port), _Handler)
        self.runs: dict[str, dict[str, Any]] = {}
        self.by_token: dict[str, str] = {}
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start_run(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            token = str(body["idempotency_token"])
            if token not in self.by_token:
                now = datetime.now(timezone.utc).isoformat()
                run_id = str(len(self.runs) + 1)
                self.runs[run_id] = {"run_id": run_id, "job_id": str(body["job_id"]), "state": "SUCCESS",
                                     "start_time": now, "end_time": now, "message": None,
                                     "parameters": body.get("parameters") or {}}
                self.by_token[token] = run_id
            return {"run_id": self.by_token[token]}


class _Handler(BaseHTTPRequestHandler):
    server: JobsService

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        if self.path != "/runs":
            return self._send(404, {"error": "not found"})
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length))
            return self._send(200, self.server.start_run(body))
        except (ValueError, KeyError, TypeError) as exc:
            return self._send(400, {"error": f"bad request: {exc}"})

    def do_GET(self) -> None:  # noqa: N802 - the http.server API
        url = urllib.parse.urlsplit(self.path)
        query = dict(urllib.parse.parse_qsl(url.query))
        with self.server.lock:
            if url.path == "/runs":
                runs = [r for r in self.server.runs.values()
                        if all(str(r.get(k)) == v for k, v in query.items())]
                return self._send(200, {"runs": runs})
            run = self.server.runs.get(url.path.removeprefix("/runs/"))
        return self._send(200, run) if run else self._send(404, {"error": "no such run"})

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - quiet
        return


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8765)
    service = JobsService(parser.parse_args().port)
    print(f"jobs service at {service.url}", flush=True)
    service.serve_forever()


if __name__ == "__main__":
    main()
