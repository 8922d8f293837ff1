"""The local Spark engine's driver heap: HEARTBEAT_SPARK_DRIVER_MEMORY, a default chosen from the machine,
refused with a one-line error when it is not a usable size, and given to the JVM of both shapes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from heartbeat_runner.core import settings as settings_module
from heartbeat_runner.core.settings import SettingsError, Target, default_driver_memory, load_settings
from heartbeat_runner.engines import spark_local

ROOT = Path(__file__).resolve().parents[1]


# -- the setting (no JVM) -----------------------------------------------------------------------

@pytest.mark.parametrize(("physical_mb", "heap"), [
    (16 * 1024, "4g"),   # a quarter
    (6000, "1500m"),     # a quarter, in whole MiB
    (2 * 1024, "1g"),    # a small machine still gets 1g
    (256 * 1024, "8g"),  # a big one at most 8g
])
def test_the_default_heap_is_a_quarter_of_the_machine_within_1g_and_8g(physical_mb, heap):
    assert default_driver_memory(physical_mb) == heap


def test_the_default_heap_is_1g_where_the_memory_cannot_be_read(monkeypatch):
    monkeypatch.setattr(settings_module, "physical_memory_mb", lambda: None)
    assert default_driver_memory() == "1g"
    assert load_settings(lakehouse_dir="/tmp/lh", env={}).spark_driver_memory == "1g"


def test_unset_the_setting_follows_this_machine_and_set_it_wins():
    assert load_settings(lakehouse_dir="/tmp/lh", env={}).spark_driver_memory == default_driver_memory()
    chosen = load_settings(lakehouse_dir="/tmp/lh", env={"HEARTBEAT_SPARK_DRIVER_MEMORY": " 3G "})
    assert chosen.spark_driver_memory == "3g"
    assert chosen.with_(target=Target.SPARK_LOCAL).lakehouse_env()["HEARTBEAT_SPARK_DRIVER_MEMORY"] == "3g"


@pytest.mark.parametrize(("value", "why"), [
    ("lots", "not a memory size"),
    ("0", "not a memory size"),
    ("0g", "too small"),
    ("256m", "too small"),
    ("-1g", "not a memory size"),
])
def test_a_bad_heap_is_refused_naming_the_variable(value, why):
    with pytest.raises(SettingsError) as caught:
        load_settings(lakehouse_dir="/tmp/lh", env={"HEARTBEAT_SPARK_DRIVER_MEMORY": value})
    (problem,) = caught.value.problems
    assert problem.startswith(f"HEARTBEAT_SPARK_DRIVER_MEMORY={value!r}: {why}")
    assert "a JVM memory size" in problem and "\n" not in problem


def test_the_cli_refuses_a_bad_heap_in_one_line_without_a_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "heartbeat_runner", "status"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120,
                          env={**{k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")},
                               "HEARTBEAT_HOME": str(tmp_path / "lh"), "HEARTBEAT_TARGET": "spark-local",
                               "HEARTBEAT_SPARK_DRIVER_MEMORY": "lots"})
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "HEARTBEAT_SPARK_DRIVER_MEMORY='lots': not a memory size" in proc.stderr


def test_both_shapes_start_their_jvm_with_the_heap(tmp_path, monkeypatch):
    """The classic session and the Connect server get ``spark.driver.memory`` from the setting (JVMs faked)."""
    started: dict[str, str] = {}

    class Session:
        def stop(self) -> None:
            pass

    def classic(spark_dir, *, connect_port, driver_memory):
        started["classic"] = spark_local.session_confs(spark_dir, driver_memory)["spark.driver.memory"]
        return Session()

    def connect_start(self):
        started["connect"] = spark_local.session_confs(self.lakehouse_dir, self.driver_memory)["spark.driver.memory"]
        self.port = 1
        return self.url

    monkeypatch.setattr(spark_local, "open_classic_session", classic)
    monkeypatch.setattr(spark_local, "stop_classic_session", lambda spark: None)
    monkeypatch.setattr(spark_local.SparkConnectProcess, "start", connect_start)
    monkeypatch.setattr(spark_local.SparkConnectProcess, "stop", lambda self: None)
    monkeypatch.setattr(spark_local, "_connect_session", lambda url: Session())
    monkeypatch.setattr(spark_local, "local_file_system_jar", lambda: None)
    try:
        for mode in spark_local.SPARK_MODES:
            running = spark_local.local_spark(tmp_path / mode, mode, "3g")
            assert running.driver_memory == "3g"
    finally:
        spark_local.stop_local_spark()
        monkeypatch.delenv("SPARK_REMOTE", raising=False)
    assert started == {"classic": "3g", "connect": "3g"}


# -- a driver that runs out of heap ---------------------------------------------------------------

def test_a_failure_after_the_engine_died_becomes_the_reason_it_died(monkeypatch):
    """engine_failures: a failure (py4j's "Connection refused") after a probe names the death is raised as
    that death's error, from the original; without a death the original passes unchanged (no JVM)."""
    from heartbeat_runner.core.errors import TerminalError
    from heartbeat_runner.engines import engine_errors
    from heartbeat_runner.engines.engine_errors import DriverOutOfMemoryError, engine_failures

    died: list[str] = []
    monkeypatch.setattr(engine_errors, "_death_probes",
                        [lambda lost: DriverOutOfMemoryError(died[0]) if died else None])
    refused = ConnectionRefusedError(111, "Connection refused")
    with pytest.raises(ConnectionRefusedError), engine_failures():
        raise refused
    died.append("1g")
    with pytest.raises(DriverOutOfMemoryError) as caught, engine_failures():
        raise refused
    assert isinstance(caught.value, TerminalError) and caught.value.__cause__ is refused
    assert "HEARTBEAT_SPARK_DRIVER_MEMORY=1g" in str(caught.value)


#: a process that opens the local Spark engine (classic) with a small heap, runs a query that fits, then one
#: that needs an 800 MB array, and says what it met; it must also end cleanly (stopping a dead JVM)
_SMALL_HEAP_SCRIPT = """
import json, sys
from pathlib import Path
from heartbeat_runner.engines.engine_errors import engine_failures
from heartbeat_runner.engines.spark_local import classic_jvm_exit_code, local_spark, stop_local_spark

running = local_spark(Path(sys.argv[1]), "classic", sys.argv[2])
fits = running.spark.range(1000).count()
try:
    with engine_failures():
        running.spark.sql("SELECT size(sequence(1L, 100000000L))").collect()
    outcome = {"raised": None}
except Exception as exc:
    outcome = {"raised": type(exc).__name__, "message": str(exc), "cause": type(exc.__cause__).__name__,
               "terminal": type(exc).__mro__[1].__name__}
outcome["exit_code"] = classic_jvm_exit_code()
stop_local_spark()
print(json.dumps({"fits": fits, **outcome}))
"""


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_a_driver_out_of_heap_stops_with_an_error_naming_the_setting(tmp_path):
    """512m (the smallest heap Spark starts with) and a query that needs more: the JVM exits at once, and
    the next call fails with DriverOutOfMemoryError naming HEARTBEAT_SPARK_DRIVER_MEMORY and its value,
    not py4j's "Connection refused"; the process then ends cleanly. One JVM start."""
    proc = subprocess.run([sys.executable, "-c", _SMALL_HEAP_SCRIPT, str(tmp_path / "spark"), "512m"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "PYSPARK_SUBMIT_ARGS")})
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:{proc.stdout}\nstderr:{proc.stderr[-4000:]}"
    outcome = json.loads(proc.stdout.strip().splitlines()[-1])
    assert outcome["fits"] == 1000, "the engine ran with the small heap before the query that needs more"
    assert outcome["raised"] == "DriverOutOfMemoryError", proc.stderr[-4000:]
    assert outcome["terminal"] == "TerminalError"
    assert "HEARTBEAT_SPARK_DRIVER_MEMORY=512m" in outcome["message"]
    assert outcome["cause"] != "NoneType", "the py4j error is kept as the cause"
    assert outcome["exit_code"] in spark_local.OUT_OF_MEMORY_EXIT_CODES, outcome
    assert "Terminating due to java.lang.OutOfMemoryError" in proc.stdout  # the JVM's last word, on its stdout


def test_a_jvm_whose_connection_broke_is_awaited_and_named_when_it_exited_out_of_heap(tmp_path, monkeypatch):
    """A failure that broke the connection (py4j's "Connection refused") may arrive a moment before the JVM
    can be reaped: the probe waits for its exit code, and exit 3 (ExitOnOutOfMemoryError) is a
    DriverOutOfMemoryError with the heap it had. Any other failure does not wait, and a JVM still running
    is no death at all. Python children stand in for the JVMs."""
    from heartbeat_runner.engines.engine_errors import DriverOutOfMemoryError, engine_failures

    dying = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1); sys.exit(3)"])
    server = spark_local.SparkConnectProcess(tmp_path, port=1, driver_memory="2g", _proc=dying)
    running = spark_local.LocalSpark("connect", tmp_path, spark=None, delta_table_api=False,  # type: ignore[arg-type]
                                     driver_memory="2g", jvm_exit_code=server.exited)
    monkeypatch.setattr(spark_local, "_running", running)
    with pytest.raises(ValueError), engine_failures():
        raise ValueError("a query's own error")  # the JVM still runs: nothing to wait for
    with pytest.raises(DriverOutOfMemoryError) as caught, engine_failures():
        raise ConnectionRefusedError(111, "Connection refused")
    assert "HEARTBEAT_SPARK_DRIVER_MEMORY=2g" in str(caught.value)
    assert isinstance(caught.value.__cause__, ConnectionRefusedError)

    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        monkeypatch.setattr(spark_local, "EXIT_WAIT_S", 0.5)
        server = spark_local.SparkConnectProcess(tmp_path, port=1, _proc=alive)
        monkeypatch.setattr(running, "jvm_exit_code", server.exited)
        assert spark_local.out_of_memory_death(connection_lost=True) is None
    finally:
        alive.kill()
        alive.wait()


def test_stopping_a_classic_session_whose_jvm_died_forgets_it_without_calling_it(monkeypatch):
    """PySpark's stop would fail talking to a JVM that exited (out of heap): the session is forgotten
    instead, so the process ends cleanly and a next session can start (a Python child stands in)."""
    pyspark = pytest.importorskip("pyspark")

    class Gateway:
        proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"], stdin=subprocess.PIPE)

        def shutdown(self) -> None:
            raise ConnectionRefusedError(111, "Connection refused")

    class DeadSession:
        def stop(self) -> None:
            raise AssertionError("PySpark's stop was called on a dead JVM")

    Gateway.proc.wait()
    monkeypatch.setattr(pyspark.SparkContext, "_gateway", Gateway())
    monkeypatch.setattr(pyspark.SparkContext, "_jvm", None)
    monkeypatch.setattr(pyspark.SparkContext, "_active_spark_context", object())
    spark_local.stop_classic_session(DeadSession())  # type: ignore[arg-type]
    assert pyspark.SparkContext._gateway is None and pyspark.SparkContext._active_spark_context is None
