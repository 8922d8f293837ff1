"""The local Spark engine's driver heap: HEARTBEAT_SPARK_DRIVER_MEMORY, a default chosen from the machine,
refused with a one-line error when it is not a usable size, and given to the JVM of both shapes."""

from __future__ import annotations

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
