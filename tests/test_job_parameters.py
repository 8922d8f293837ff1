"""Structured job parameters: each run gets its windows as versioned JSON (``heartbeat_params``) next to
the text (``heartbeat_windows``), and the example job plans its reads from the JSON alone."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

from harness import Harness
from harness import config_row as row
from test_catch_up import recorded, recorder_jobs

EXAMPLE_JOB = Path(__file__).resolve().parents[1] / "examples" / "databricks" / "orders_etl.py"


def example_job():
    spec = importlib.util.spec_from_file_location("orders_etl", EXAMPLE_JOB)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_run_gets_its_windows_as_json_and_the_example_job_reads_them(tmp_path):
    out = tmp_path / "out"
    with Harness(tmp_path) as hb:
        hb.create_table("up.orders", "order_id INT")
        hb.seed(row("delta_table", "up.orders", "J"), row("trigger_file", "drops", "J", hard="FALSE"),
                row("delta_table", "up.orders", "K", key="order_id"))
        recorder_jobs(hb.jobs_path, out, "J", "K")
        hb.tick()  # baselines
        hb.insert("up.orders", "(1), (2)")
        hb.insert("up.orders", "(3)")
        hb.drop_trigger_file("drops", "a.csv")
        hb.tick()
        hb.wait_for_jobs()

        (j_run,), (k_run,) = recorded(out, "J"), recorded(out, "K")
        params = json.loads(j_run["heartbeat_params"])
        assert params["version"] == 1 and params["run_id"] == j_run["heartbeat_run_id"]
        assert params["window"] is None and params["catch_up"] is None
        by_source = {s["sensor_source"]: s for s in params["sources"]}
        delta, drop = by_source["delta_table"], by_source["trigger_file"]
        assert (delta["kind"], delta["from"], delta["until"]) == ("delta_version", 0, 2)  # versions 1 and 2
        assert (delta["from_text"], delta["until_text"]) == ("version 1", "version 2")  # the same as the text
        assert drop["kind"] == "cursor" and drop["until"]["name"] == "a.csv" and drop["rows"] == 1
        (keyed,) = json.loads(k_run["heartbeat_params"])["sources"]
        assert (keyed["kind"], keyed["from"], keyed["until"], keyed["rows"]) == ("key", None, "3", 3)

        job = example_job()
        assert job.plan_reads(job.parse_params(j_run["heartbeat_params"]), []) == [job.Read("up.orders", 1, 2)]
        assert job.plan_reads(job.parse_params(""), ["up.orders"]) == [job.Read("up.orders")]  # a manual run
