"""Observability (issue 42): a real Prometheus scrapes a real `run --loop`; the status page answers /metrics;
log lines as JSON carry the tick's run id and never a secret; the dashboard, the rules and the docs' table
name only metrics the registry has; bad settings are refused in one line."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, marker_jobs_file, serving_page, wait_for
from harness import config_row as row
from prometheus_client.parser import text_string_to_metric_families

from heartbeat_runner.core.logs import TICK_RUN_ID, JsonFormatter, in_context
from heartbeat_runner.core.metrics import CONTENT_TYPE, TABLE_END, TABLE_START, Metrics, metrics_table, use_metrics
from heartbeat_runner.core.records import SensingTarget, utcnow
from heartbeat_runner.runner.observability import count_tick
from heartbeat_runner.runner.tick_result import TickResult
from heartbeat_runner.sensing.parallel import SensingOutcome
from heartbeat_runner.sensing.sources.base import SenseResult

ROOT = Path(__file__).resolve().parents[1]
MONITORING = ROOT / "examples" / "monitoring"
PROMETHEUS = shutil.which("prometheus")
PROMTOOL = shutil.which("promtool")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> CliLakehouse:
    root = tmp_path_factory.mktemp("observability")
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "a", "J1"), row("trigger_file", "b", "J2")]) + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=marker_jobs_file(root / "jobs.yml", "J1", "J2"))
    lake.cli("seed")
    lake.cli("run")  # baseline: a new sensor starts at its source's current end
    return lake


# -- a real Prometheus over a real loop ----------------------------------------------------------------

class Prometheus:
    """A Prometheus server scraping ``target`` every second, with its own storage in ``home``."""

    def __init__(self, home: Path, target: str):
        self.port = free_port()
        config = home / "prometheus.yml"
        config.write_text(f"global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: heartbeat\n"
                          f"    static_configs:\n      - targets: ['{target}']\n")
        assert PROMETHEUS is not None
        self.process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={home / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def query(self, expression: str) -> float | None:
        """The single value of an instant query, or None when it has no result yet."""
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
        try:
            answer = json.loads(urllib.request.urlopen(url, timeout=10).read())
        except OSError:
            return None
        result = answer["data"]["result"]
        return float(result[0]["value"][1]) if result else None

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


@contextlib.contextmanager
def looping(lake: CliLakehouse, metrics_port: int) -> Iterator[subprocess.Popen]:
    """`run --loop` of ``lake`` serving its metrics on ``metrics_port``; stopped with SIGTERM after."""
    loop = lake.start("run", "--loop", "--interval", "1", "--metrics-port", str(metrics_port))
    try:
        yield loop
    finally:
        loop.send_signal(signal.SIGTERM)
        loop.communicate(timeout=60)


@pytest.mark.skipif(PROMETHEUS is None, reason="the prometheus binary is not installed (Debian: apt-get install "
                                                "prometheus); .ci/run installs it")
def test_prometheus_scrapes_a_running_loop(lake, tmp_path):
    port = free_port()
    with looping(lake, port) as loop:
        prometheus = Prometheus(tmp_path, f"127.0.0.1:{port}")
        try:
            wait_for(lambda: prometheus.query('up{job="heartbeat"}') == 1.0 or loop.poll() is not None, 60,
                     "Prometheus to scrape the loop")
            assert loop.poll() is None, loop.communicate()
            ticks = 'sum(heartbeat_ticks_total{job="heartbeat"})'
            wait_for(lambda: (prometheus.query(ticks) or 0) >= 1, 60, "a tick in Prometheus")
            first = prometheus.query(ticks) or 0
            lake.drop_trigger_file("a", "x.done")
            lake.drop_trigger_file("b", "y.done")
            wait_for(lambda: lake.executions() == {"J1": 1, "J2": 1}, 60, "both jobs to run")
            started = sum(lake.executions().values())
            triggered = 'sum(heartbeat_jobs_triggered_total{job="heartbeat",backend="local"})'
            wait_for(lambda: prometheus.query(triggered) == started, 30, "the triggered count to be scraped")
            wait_for(lambda: (prometheus.query(ticks) or 0) > first, 30, "the tick counter to rise")
            age = prometheus.query('time() - heartbeat_last_successful_tick_timestamp_seconds{job="heartbeat"}')
            assert age is not None and age < 30, age
            assert prometheus.query('heartbeat_lease_held{job="heartbeat"}') == 1.0
            assert (prometheus.query('sum(heartbeat_sources_sensed_total{kind="trigger_file"})') or 0) >= 2
        finally:
            prometheus.close()


def test_the_status_page_answers_metrics_in_the_exposition_format(lake):
    with serving_page(lake) as base:
        answer = urllib.request.urlopen(base + "/metrics", timeout=30)
        body = answer.read().decode()
    assert answer.headers["Content-Type"] == CONTENT_TYPE and CONTENT_TYPE.startswith("text/plain; version=")
    names = {family.name for family in text_string_to_metric_families(body)}
    assert {"heartbeat_engine_recycles", "heartbeat_lease_held", "process_resident_memory_bytes"} <= names


# -- bad input -----------------------------------------------------------------------------------------

def test_bad_metrics_port_and_log_format_are_refused_in_one_line(lake, tmp_path):
    flag = lake.cli("run", "--loop", "--metrics-port", "http", check=False)
    assert flag.returncode == 2 and "argument --metrics-port: 'http' is not a TCP port" in flag.stderr

    fresh = tmp_path / "never-made"
    bad = lake.cli("run", check=False, env={"HEARTBEAT_LOG_FORMAT": "xml", "HEARTBEAT_HOME": str(fresh)})
    assert bad.returncode != 0 and "HEARTBEAT_LOG_FORMAT='xml'" in bad.stderr and "`text` or `json`" in bad.stderr
    assert "Traceback" not in bad.stderr and not fresh.exists()

    port = lake.cli("run", check=False, env={"HEARTBEAT_METRICS_PORT": "99999"})
    assert port.returncode != 0 and "HEARTBEAT_METRICS_PORT='99999'" in port.stderr and "Traceback" not in port.stderr

    once = lake.cli("run", "--metrics-port", "9", check=False)
    assert once.returncode != 0 and once.stderr.strip() == (
        "error: --metrics-port needs --loop (a single tick ends before Prometheus could scrape it)")

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = lake.cli("run", "--loop", "--metrics-port", str(busy.getsockname()[1]), check=False)
        assert taken.returncode != 0 and "Traceback" not in taken.stderr
        assert f"cannot serve metrics on 127.0.0.1:{busy.getsockname()[1]}" in taken.stderr


# -- JSON logs -----------------------------------------------------------------------------------------

def test_json_log_lines_carry_the_ticks_run_id(lake):
    lake.drop_trigger_file("a", "json.done")
    tick = lake.cli("run", "--json", "--log-format", "json", "-v")
    run_id = json.loads(tick.stdout)["run_id"]
    lines = [json.loads(line) for line in tick.stderr.splitlines() if line.strip()]
    assert lines, tick.stderr
    assert all({"time", "level", "logger", "message"} <= set(line) for line in lines)
    assert all(line["time"].endswith("+00:00") for line in lines)
    in_tick = [line for line in lines if line.get("run_id") == run_id]
    assert in_tick and any("stage" in line for line in in_tick), lines


def test_a_secret_in_a_log_line_is_redacted_in_every_field():
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter(secrets=("dapi-s3cr3t",)))
    logger = logging.getLogger("test_observability.redaction")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        with in_context(TICK_RUN_ID, "run-1"):
            logger.warning("token dapi-s3cr3t refused by https://user:pw@host.example/hook?key=abc",
                           extra={"job": "job dapi-s3cr3t", "source": "https://h.example/path?sig=xyz"})
    finally:
        logger.removeHandler(handler)
    line = json.loads(out.getvalue())
    text = json.dumps(line)
    assert "dapi-s3cr3t" not in text and "pw@" not in text and "key=abc" not in text and "sig=xyz" not in text
    assert line["run_id"] == "run-1" and "host.example" in line["message"] and line["level"] == "WARNING"


# -- bounded labels ------------------------------------------------------------------------------------

def sensed(sources: int) -> TickResult:
    """A tick's result that sensed ``sources`` sources of three kinds, one in ten with new data, one in a
    hundred failing."""
    kinds = ("delta_table", "trigger_file", "jdbc")
    result = TickResult(run_id="r", snapshot_ts=utcnow(), stage_timings={"sensing": 0.5, "dbt": 0.2})
    for n in range(sources):
        kind = kinds[n % 3]
        target = SensingTarget(f"{kind}|s{n}", kind, f"s{n}", None, None, "batch", None)
        failing = n % 100 == 0
        result.sensed.append(SensingOutcome(target, f"J{n}", None if failing else SenseResult(new_data=n % 10 == 0),
                                            "boom" if failing else None, 0.01))
    return result


def test_the_exposition_does_not_grow_with_the_number_of_sources():
    lines = []
    try:
        for sources in (300, 30_000):  # every kind has new data and a failure in both
            fresh = use_metrics()
            count_tick(sensed(sources), "local")
            lines.append(len(fresh.exposition().splitlines()))
            assert 'heartbeat_sources_failing{kind="delta_table"}' in fresh.exposition().decode()
    finally:
        use_metrics()
    assert lines[0] == lines[1], lines


# -- the examples and the docs name real metrics ---------------------------------------------------------

METRIC_NAME = re.compile(r"\b(?:heartbeat|process)_[a-z_]+\b")


def test_the_dashboard_and_the_rules_use_only_metrics_the_registry_has():
    known = Metrics().names()
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    rules = (MONITORING / "alert-rules.yml").read_text()
    used = set(METRIC_NAME.findall(" ".join(expressions))) | set(METRIC_NAME.findall(rules))
    assert len(expressions) >= 8 and used, expressions
    assert used <= known, sorted(used - known)


@pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian: apt-get install prometheus)")
def test_promtool_accepts_the_rules_and_the_scrape_config():
    assert PROMTOOL is not None
    rules = subprocess.run([PROMTOOL, "check", "rules", str(MONITORING / "alert-rules.yml")], capture_output=True,
                           text=True, timeout=60)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    assert "4 rules found" in rules.stdout or "rules found" in rules.stdout
    config = subprocess.run([PROMTOOL, "check", "config", "--syntax-only", str(MONITORING / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60, cwd=MONITORING)
    assert config.returncode == 0, config.stdout + config.stderr


def test_the_docs_metrics_table_is_the_registrys():
    doc = (ROOT / "docs" / "observability.md").read_text()
    start, end = doc.index(TABLE_START) + len(TABLE_START), doc.index(TABLE_END)
    assert doc[start:end].strip() == metrics_table(), (
        "docs/observability.md's metrics table differs from heartbeat_runner/core/metrics.py; regenerate it: "
        "python -c 'from pathlib import Path; from heartbeat_runner.core.metrics import with_metrics_table as w; "
        "p = Path(\"docs/observability.md\"); p.write_text(w(p.read_text()))'")


# -- the jobs API's answers, the SDK's own retries included ------------------------------------------------

def test_jobs_api_calls_429s_and_retries_are_counted_by_endpoint():
    from databricks_jobs_server import THROTTLED, JobsApiServer

    from heartbeat_runner.jobs.base import TriggerRequest
    from heartbeat_runner.jobs.databricks import DatabricksJobsBackend

    fresh = use_metrics()
    try:
        with JobsApiServer() as server:
            backend = DatabricksJobsBackend(server.client())
            job = server.add_job()
            server.inject("run-now", THROTTLED, times=2)
            run_id = backend.trigger(TriggerRequest(str(job), "etl", "tok-metrics", {}))
            backend.run_status(str(job), run_id)
        samples = {(s.name, s.labels.get("endpoint")): s.value
                   for family in text_string_to_metric_families(fresh.exposition().decode()) for s in family.samples}
    finally:
        use_metrics()
    assert samples[("heartbeat_jobs_api_calls_total", "run-now")] == server.calls("run-now") == 3
    assert samples[("heartbeat_jobs_api_throttled_total", "run-now")] == 2
    assert samples[("heartbeat_jobs_api_retries_total", "run-now")] == 2
    assert samples[("heartbeat_jobs_api_calls_total", "runs/get")] == 1
    assert ("heartbeat_jobs_api_throttled_total", "runs/get") not in samples or \
        samples[("heartbeat_jobs_api_throttled_total", "runs/get")] == 0
