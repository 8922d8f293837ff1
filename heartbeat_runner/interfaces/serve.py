"""``serve``: keep the embedded engine running so plain ``dbt`` commands work locally.

Sail's catalog lives in memory, per Spark Connect session. ``serve`` starts Sail on a
fixed port, registers the lakehouse's tables in one session with a stable id, and
prints the environment that points dbt-spark's ``session`` method at that session.
Analysts can then run ``dbt seed``, ``dbt build`` or ``dbt show`` as usual.

Sail runs in a child process on that port. Every RECYCLE_CHECK_S seconds ``serve`` looks at that
process's memory and, once it holds more than HEARTBEAT_ENGINE_MAX_RSS_MB, replaces it on the same
port with the same session id and registers the tables and views again (a client query running at
that moment fails; run it again). Tick counts do not apply here: there are no ticks.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import replace

from heartbeat_runner.core.settings import Settings
from heartbeat_runner.core.stopping import StopRequest
from heartbeat_runner.lakehouse.dbt_invoke import merge_stage_dir
from heartbeat_runner.runner.app import App
from heartbeat_runner.runner.memory import EngineRecycler

#: seconds between two looks at the served engine's memory
RECYCLE_CHECK_S = 5.0


def session_id_for(settings: Settings) -> str:
    """A stable session id per lakehouse, so clients can reconnect after a restart of `serve`."""
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"heartbeat:{settings.lakehouse_dir}"))


def client_environment(settings: Settings, port: int) -> dict[str, str]:
    """What a dbt client needs in its environment to use the served engine."""
    return {
        "SPARK_REMOTE": f"sc://127.0.0.1:{port}/;session_id={session_id_for(settings)}",
        "HEARTBEAT_LOCATION_ROOT": str(settings.warehouse_dir / settings.schema),
        "HEARTBEAT_MERGE_STAGE_ROOT": str(merge_stage_dir(settings)),
        "HEARTBEAT_SCHEMA": settings.schema,
        "DBT_PROFILES_DIR": str(settings.lakehouse_dir / "dbt" / "profiles"),
    }


def serve(app: App, port: int, stop: threading.Event | None = None) -> None:
    """Block until ``stop`` is set or SIGINT/SIGTERM, with the engine registered and views restored."""
    if app.store.exists("heartbeat_control"):
        app.ensure_views()
    app.dbt.write_profiles()
    stopped = StopRequest(stop).install()
    print("Serving the embedded lakehouse. In another shell:", flush=True)
    for key, value in client_environment(app.settings, port).items():
        print(f"  export {key}='{value}'", flush=True)
    print(f"  cd {app.settings.project_dir} && dbt seed && dbt build", flush=True)
    print("Ctrl-C to stop.", flush=True)
    # never parked: clients hold connections to this engine
    recycler = EngineRecycler(app, replace(app.settings.memory, engine_recycle_ticks=0, engine_park_after_s=0))
    while not stopped.wait(RECYCLE_CHECK_S):
        reason = recycler.due()
        if reason is not None:
            print(f"recycling the engine ({reason}) in {app.recycle_engine():.1f} s", flush=True)
    stopped.shutting_down()

