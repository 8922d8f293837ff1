"""``python -m heartbeat_runner demo``: the whole loop on the embedded lakehouse.

Creates sample upstream Delta tables, a trigger folder and local jobs, loads a
config shaped like the spec's example, then ticks through the real path: baseline,
new data, dependency waits (scenarios A and B), triggers, job completion.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.records import JobStatus
from heartbeat_runner.core.settings import JobsBackendKind, Settings
from heartbeat_runner.interfaces.output import STATUS_COLUMNS, Steps, emit
from heartbeat_runner.runner.app import App, open_app
from heartbeat_runner.sensing.config import load_config

MARKER = ".heartbeat-demo"
#: The numbered steps of the story (a progress bar over them on a terminal).
STEPS = 6
#: seconds the demo waits for its jobs to finish: ticks take ~1 s on the embedded engine, and
#: 5-60 s on a local Spark JVM (more on a loaded machine), where job 102's own `complete` also
#: has to reach the demo's engine
JOBS_WAIT_S = 60
JOBS_WAIT_SPARK_S = 900

CONFIG = """\
sensor_source,sensor_id,sensor_read_type,asset_description,upstream_key,preprocess_query,trigger_job_id,trigger_job_name,job_state,dependency_flag
delta_table,demo_sales.orders,streaming,Orders from the shop,,,101,daily_sales_report,UNPAUSED,TRUE
lmu_delta_table,demo_uploads.sales_targets,batch,Sales targets (manual upload),,,101,daily_sales_report,UNPAUSED,FALSE
delta_table,demo_sales.orders,streaming,Orders from the shop,,,102,inventory_sync,UNPAUSED,TRUE
trigger_file,inventory_drop,streaming,Warehouse inventory drop,,,102,inventory_sync,UNPAUSED,TRUE
delta_table,demo_sales.orders,batch,Big orders,order_id,SELECT * FROM sensor_new_data WHERE amount >= 1000,103,big_orders_alert,UNPAUSED,TRUE
"""

JOB = "import json, os; w = json.loads(json.loads(os.environ['HEARTBEAT_PARAMETERS'])['heartbeat_windows']); print(os.environ['HEARTBEAT_JOB_ID'], 'processing', w)"

JOBS = f"""\
jobs:
  "101":
    command: ["{sys.executable}", "-c", "{JOB}"]
  "102":
    # ends with the spec's final task: update the heartbeat status itself
    command: "{sys.executable} -c \\"{JOB}\\" && {sys.executable} -m heartbeat_runner complete --job-id 102"
  "103":
    command: ["{sys.executable}", "-c", "{JOB}"]
"""


def _prepare(settings: Settings, keep: bool) -> Settings:
    home = settings.lakehouse_dir
    if home.exists() and any(home.iterdir()) and not (home / MARKER).exists():
        raise HeartbeatError(f"{home} holds a lakehouse that is not a demo; pass --lakehouse-dir with an empty folder")
    if home.exists() and not keep:
        shutil.rmtree(home)
    home.mkdir(parents=True, exist_ok=True)
    (home / MARKER).touch()
    demo = home / "demo"
    demo.mkdir(exist_ok=True)
    (demo / "heartbeat_sensor_config.csv").write_text(CONFIG)
    (demo / "heartbeat_jobs.yml").write_text(JOBS)
    return settings.with_(config_csv=demo / "heartbeat_sensor_config.csv", jobs_file=demo / "heartbeat_jobs.yml",
                          jobs_backend=JobsBackendKind.LOCAL.value)


def _create_upstreams(app: App) -> None:
    spark = app.engine.spark
    for schema, table, columns in (("demo_sales", "orders", "order_id bigint, amount double, customer string"),
                                   ("demo_uploads", "sales_targets", "region string, target double")):
        app.engine.create_delta_table(f"{schema}.{table}", columns)
    spark.sql("INSERT INTO demo_sales.orders VALUES (1, 120.0, 'acme'), (2, 80.0, 'globex')")
    spark.sql("INSERT INTO demo_uploads.sales_targets VALUES ('emea', 1000.0)")


def _job_statuses(app: App) -> dict[str, set[str]]:
    """Each job's row statuses in the control table."""
    statuses: dict[str, set[str]] = {}
    for row in app.store.control_rows():
        statuses.setdefault(row["trigger_job_id"], set()).add(row["status"])
    return statuses


def completed_during(before: dict[str, set[str]], after: dict[str, set[str]], reconciled: list[str]) -> list[str]:
    """The jobs a tick saw complete: those it reconciled itself, then those running before it and COMPLETED
    after it whose end another process recorded (a job's own ``complete``, as job 102's last task), so the
    story never says "completed: none" of a tick that saw a job end."""
    done = JobStatus.COMPLETED.value
    recorded = [job for job in sorted(after) if after[job] == {done} and JobStatus.IN_PROGRESS.value in
                before.get(job, set()) and job not in reconciled]
    return [*reconciled, *(f"{job} (its own `complete`)" for job in recorded)]


def run_demo(settings: Settings, *, keep: bool = False, as_json: bool = False) -> int:
    """Run the demo; print the story and the final control table."""
    if settings.lakehouse_dir == Path(".heartbeat").resolve():
        settings = settings.with_(lakehouse_dir=Path(".heartbeat-demo").resolve())
    settings = _prepare(settings, keep)
    story = sys.stderr if as_json else sys.stdout
    print(f"Demo lakehouse: {settings.lakehouse_dir}", file=story, flush=True)
    config = load_config(settings.effective_config_csv)
    # the story is the plain report; on a terminal a bar over its steps runs beneath it (on stderr)
    with Steps(STEPS, quiet=True) as steps, open_app(settings) as app:
        def say(text: str, step: str | None = None) -> None:
            print(text, file=story, flush=True)
            if step:
                steps(step)

        say("1. Creating upstream Delta tables demo_sales.orders and demo_uploads.sales_targets", "upstream tables")
        _create_upstreams(app)
        say(f"2. Loading the sensor config ({len(config.rows)} rows, 3 jobs)", "dbt seed and build")
        app.load_config(config)
        heartbeat = app.heartbeat()

        def tick(label: str) -> None:
            before = _job_statuses(app)
            result = heartbeat.tick()
            triggered = ", ".join(result.triggered_job_ids) or "none"
            completed = completed_during(before, _job_statuses(app), result.completed)
            say(f"   tick: sensed {len(result.sensed)} source(s), {result.sources_with_new_data} with new data; "
                f"triggered: {triggered}"
                f"; completed: {', '.join(completed) or 'none'} ({result.duration_s:.1f}s) - {label}")

        say("3. First tick: new sensors record where their sources are (no history replayed)", "baseline tick")
        tick("baseline")
        say("4. New orders arrive (one of them >= 1000) and a new sales target is uploaded", "new data, tick")
        app.engine.spark.sql("INSERT INTO demo_sales.orders VALUES (3, 2500.0, 'initech'), (4, 40.0, 'acme')")
        app.engine.spark.sql("INSERT INTO demo_uploads.sales_targets VALUES ('apac', 800.0)")
        tick("101 (scenario B: hard orders + soft targets) and 103 (filtered big orders) trigger; "
             "102 waits for its second hard dependency (scenario A)")
        say("5. The warehouse drops its inventory trigger file", "trigger file, tick")
        folder = settings.effective_trigger_dir / "inventory_drop"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "inventory_2024-01-01.done").write_text("ok\n")
        tick("102 now has both hard dependencies")
        say("6. Waiting for the jobs to finish, then reconciling", "waiting for the jobs")
        deadline = time.monotonic() + (JOBS_WAIT_S if app.engine.is_local else JOBS_WAIT_SPARK_S)
        while time.monotonic() < deadline:
            time.sleep(1.0)
            tick("reconcile")
            statuses = {r["status"] for r in app.store.control_rows()}
            if statuses <= {JobStatus.COMPLETED.value}:
                break
        rows = app.store.control_rows()
    emit(rows, STATUS_COLUMNS, as_json=as_json, title="\nControl table")
    if not as_json:
        print(f"\nJob output: {settings.lakehouse_dir / 'jobs' / 'runs'}/*/output.log")
        print(f"Explore: python -m heartbeat_runner status --lakehouse-dir {settings.lakehouse_dir}")
        print(f"See it:  python -m heartbeat_runner ui --lakehouse-dir {settings.lakehouse_dir}   (http://127.0.0.1:8080/)")
    return 0 if {r["status"] for r in rows} <= {JobStatus.COMPLETED.value} else 1
