"""The status page (``python -m heartbeat_runner ui``): overview, graph, job pages, ticks.

``data`` reads what the page shows, ``actions`` checks and performs operator actions,
``server`` serves both with the page's files (``static/``). ``run_ui`` wires them to
an open app and blocks until interrupted.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping

from heartbeat_runner.core.settings import Settings
from heartbeat_runner.core.stopping import StopRequest

#: Where a Databricks App must listen (set by Databricks Apps); the page then binds to every interface.
APP_PORT_VARIABLE = "DATABRICKS_APP_PORT"
DEFAULT_PORT = 8080


def listen_address(host: str | None, port: int | None, env: Mapping[str, str] | None = None) -> tuple[str, int]:
    """127.0.0.1:8080 unless told otherwise; inside a Databricks App, 0.0.0.0 on the port it names."""
    env = os.environ if env is None else env
    app_port = env.get(APP_PORT_VARIABLE)
    default_host, default_port = ("0.0.0.0", int(app_port)) if app_port else ("127.0.0.1", DEFAULT_PORT)
    return host or default_host, default_port if port is None else port


def run_ui(settings: Settings, *, host: str | None, port: int | None, allow_actions: bool, refresh_s: float,
           stop: threading.Event | None = None, ready: threading.Event | None = None) -> None:
    """Open the lakehouse and serve the page until ``stop`` is set, SIGINT or SIGTERM."""
    from heartbeat_runner.interfaces.ui.actions import ActionPolicy
    from heartbeat_runner.interfaces.ui.server import StatusPage, make_server
    from heartbeat_runner.jobs.databricks_workspace import WorkspaceGroups
    from heartbeat_runner.runner.app import open_app

    bind_host, bind_port = listen_address(host, port)
    stopped = StopRequest(stop).install()
    with open_app(settings) as app:
        app.require_config()
        app.ensure_views()
        page = StatusPage(app, ActionPolicy.from_environment(allow_actions, os.environ, groups_of=WorkspaceGroups()),
                          refresh_s=refresh_s)
        server = make_server(page, bind_host, bind_port)
        worker = threading.Thread(target=server.serve_forever, name="heartbeat-ui", daemon=True)
        worker.start()
        actions = "operator actions ON" if allow_actions else "read-only"
        print(f"Heartbeat status page on http://{bind_host}:{server.server_address[1]}/ ({actions}); Ctrl-C to stop",
              flush=True)
        if ready is not None:
            ready.set()
        try:
            stopped.wait()
            stopped.shutting_down()
        finally:
            server.shutdown()
            server.server_close()
