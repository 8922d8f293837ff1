"""Extension points: a source type and a jobs backend from a separate, installed package.

The example package (examples/plugins) is installed with pip into a folder of its own and put on
the runner processes' PYTHONPATH: Heartbeat finds it through its entry points only. The jobs
service it talks to is its own process; the test reads what that service received.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from harness import HEADER, CliLakehouse, config_row

from heartbeat_runner.core.errors import JobNotFoundError
from heartbeat_runner.core.records import SensingTarget
from heartbeat_runner.core.windows import SourceWindow, WindowLimit
from heartbeat_runner.jobs.base import RunOutcome, TriggerRequest
from heartbeat_runner.sensing.sources.base import SenseContext

PLUGIN_PACKAGE = Path(__file__).resolve().parents[1] / "examples" / "plugins"


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory) -> Path:
    """The example plugins, installed by pip as a user would (``pip install --target``)."""
    target = tmp_path_factory.mktemp("plugins")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(target),
                    str(PLUGIN_PACKAGE)], check=True, capture_output=True, timeout=300)
    return target


def with_path(*folders: Path) -> dict[str, str]:
    """The environment's PYTHONPATH with ``folders`` in front (entry points are found from their dist-info)."""
    return {"PYTHONPATH": os.pathsep.join([*(str(f) for f in folders), os.environ.get("PYTHONPATH", "")])}


@pytest.fixture
def jobs_service(plugin_path):
    """The example's HTTP jobs service, a process of its own on a free loopback port."""
    proc = subprocess.Popen([sys.executable, "-m", "heartbeat_example_plugins.http_service", "--port", "0"],
                            env={**os.environ, **with_path(plugin_path)}, stdout=subprocess.PIPE, text=True)
    try:
        url = proc.stdout.readline().split(" at ")[-1].strip()
        assert url.startswith("http://127.0.0.1:"), url
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def service_runs(url: str) -> list[dict]:
    with urllib.request.urlopen(f"{url}/runs", timeout=10) as response:
        return json.loads(response.read())["runs"]


def wait_for_runs(url: str, count: int, loop: subprocess.Popen, timeout_s: float = 180.0) -> None:
    """Until the jobs service has ``count`` runs (the runner ticks on its own)."""
    deadline = time.monotonic() + timeout_s
    while len(service_runs(url)) < count:
        assert loop.poll() is None and time.monotonic() < deadline, f"no run {count}: {loop.stderr.read()}"
        time.sleep(0.3)


def put_object(bucket: Path, key: str, mtime_s: int) -> None:
    path = bucket / key
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(key)
    os.utime(path, (mtime_s, mtime_s))


def test_plugin_source_and_backend_from_an_installed_package(tmp_path, plugin_path, jobs_service):
    buckets = tmp_path / "buckets"
    put_object(buckets / "landing", "orders/2026-11-01.csv", 1_700_000_000)
    put_object(buckets / "landing", "orders/2026-11-02.csv", 1_700_000_100)
    put_object(buckets / "landing", "returns/2026-11-02.csv", 1_700_000_200)  # another prefix: never consumed
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, config_row("local_prefix", "landing/orders/", "etl_orders")]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=tmp_path / "unused_jobs.yml",
                        env={"HEARTBEAT_BUCKETS_DIR": str(buckets), "HEARTBEAT_JOBS_BACKEND": "http_post",
                             "HEARTBEAT_HTTP_JOBS_URL": jobs_service})

    # without the package the value is unknown, and validate says which values there are
    missing = lake.cli("validate", check=False)
    assert missing.returncode == 1
    assert "unknown source 'local_prefix'" in missing.stderr and "no plugin is installed" in missing.stderr
    assert "Traceback" not in missing.stderr

    plugged = with_path(plugin_path)
    assert "valid" in lake.cli("validate", env=plugged).stdout
    lake.cli("seed", env=plugged)
    # one runner process ticking: a new sensor replays the prefix (both objects: run 1); once the
    # backend says run 1 succeeded, the object that arrived meanwhile is run 2
    loop = lake.start("run", "--loop", "--interval", "0.5", "--replay-new-sensors", env=plugged)
    try:
        wait_for_runs(jobs_service, 1, loop)
        put_object(buckets / "landing", "orders/2026-11-03.csv", 1_700_000_300)
        wait_for_runs(jobs_service, 2, loop)
    finally:
        loop.terminate()
        assert loop.wait(60) == 0, loop.stderr.read()

    runs = service_runs(jobs_service)
    assert [r["job_id"] for r in runs] == ["etl_orders", "etl_orders"]
    windows = [json.loads(r["parameters"]["heartbeat_windows"]) for r in runs]
    assert [(w[0]["from"], w[0]["to"]) for w in windows] == [
        ("orders/2026-11-01.csv", "orders/2026-11-02.csv"), ("orders/2026-11-03.csv", "orders/2026-11-03.csv")]
    status = json.loads(lake.cli("status", "--json", env=plugged).stdout)
    # run 2 started only because the backend's run_status said run 1 succeeded (a job in flight waits)
    assert [(r["sensor_source"], r["job_run_id"]) for r in status] == [("local_prefix", "2")]


def plugin_module(name: str):
    """A module of the example package, loaded from its file (its folder stays off sys.path, so this
    process's registries never see the package's entry points)."""
    spec = importlib.util.spec_from_file_location(f"example_{name}", PLUGIN_PACKAGE / "heartbeat_example_plugins"
                                                  / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_the_example_source_cuts_a_backlog_and_reports_event_times(tmp_path, monkeypatch):
    prefix = plugin_module("prefix_source")
    monkeypatch.setenv(prefix.BUCKETS_DIR, str(tmp_path))
    for i in range(5):
        put_object(tmp_path / "landing", f"orders/{i}.csv", 1_700_000_000 + 3600 * i)
    source = prefix.LocalPrefixSource()
    target = SensingTarget("k", "local_prefix", "landing/orders/", None, None, "batch", None)
    context = SenseContext(engine=None, trigger_dir=tmp_path, replay_new_sensors=True, event_time_grains={"k": 3600})
    found = source.sense(target, context)
    assert (found.new_data, found.rows, found.window_from, found.window_to) == (True, 5, "orders/0.csv", "orders/4.csv")
    assert found.event_times.buckets == {1_700_000_000 - 1_700_000_000 % 3600 + 3600 * i: 1 for i in range(5)}
    backlog = SourceWindow("local_prefix", "landing/orders/", None, found.cursor_to, found.window_from,
                           found.window_to, found.cut_points)
    pieces = source.split(backlog, WindowLimit(count=2), None)
    assert [(p.window_from, p.window_to) for p in pieces] == [
        ("beginning", "orders/1.csv"), ("orders/1.csv", "orders/3.csv"), ("orders/3.csv", "orders/4.csv")]
    assert source.bounds(pieces[1].cursor_from, pieces[1].cursor_to).upper["key"] == "orders/3.csv"
    assert source.check_config("../etc/x", None) is not None


def test_the_example_backend_starts_one_run_per_token():
    backend_module, service_module = plugin_module("http_backend"), plugin_module("http_service")
    service = service_module.JobsService()
    threading.Thread(target=service.serve_forever, daemon=True).start()
    try:
        backend = backend_module.HttpPostJobsBackend(service.url)
        request = TriggerRequest("etl", None, "token-1", {"heartbeat_run_id": "r1"})
        before = datetime.now(timezone.utc) - timedelta(seconds=1)
        run_id = backend.trigger(request)
        assert backend.trigger(request) == run_id and len(service.runs) == 1  # the same token: the same run
        assert backend.run_status("etl", run_id).outcome is RunOutcome.SUCCESS
        assert backend.successful_run_after("etl", before).run_id == run_id
        with pytest.raises(JobNotFoundError):
            backend.run_status("etl", "999")
    finally:
        service.shutdown()


def fake_distribution(root: Path, name: str, entry_points: str) -> Path:
    """An installed distribution as pip leaves it: a dist-info folder with its metadata and entry points."""
    info = root / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(textwrap.dedent(entry_points))
    return root


def test_a_plugin_cannot_take_a_built_in_name_and_a_broken_one_is_named(tmp_path):
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, config_row("trigger_file", "drops", "J1"),
                                 config_row("broken_source", "x", "J2")]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=tmp_path / "jobs.yml")
    clash = fake_distribution(tmp_path / "clash", "my-heartbeat-files", """
        [heartbeat.sources]
        trigger_file = my_files:Source
    """)
    out = lake.cli("validate", check=False, env=with_path(clash))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert ("heartbeat.sources 'trigger_file' (my_files:Source, from the package my-heartbeat-files 1.0) clashes "
            "with heartbeat.sources 'trigger_file'") in out.stderr

    broken = fake_distribution(tmp_path / "broken", "broken-heartbeat-source", """
        [heartbeat.sources]
        broken_source = no_such_module:Source
    """)
    out = lake.cli("validate", check=False, env=with_path(broken))
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "line 3, column sensor_source: heartbeat.sources 'broken_source'" in out.stderr
    assert "broken-heartbeat-source 1.0) cannot be loaded: ModuleNotFoundError" in out.stderr
