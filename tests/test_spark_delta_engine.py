"""Apache Spark 4 + Delta Lake 4 (the JVM inside PySpark), in both shapes production uses.

``classic``: a py4j SparkSession in this process (a Databricks job cluster's driver);
``connect``: a Spark Connect server JVM reached through ``sc://`` (serverless / shared clusters).
Each shape is the test session's shared JVM (tests/conftest.py orders the tests: Connect, then classic).
"""

from __future__ import annotations

import itertools
import logging
import os
import shutil
import stat
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from heartbeat_runner.engines.engine_errors import CommitConflictError, kind_of
from heartbeat_runner.engines.spark_jars import (
    FILE_SYSTEM_SOURCE,
    SparkJarsError,
    _artifact,
    delta_connect_available,
    local_file_system_jar,
    pyspark_jar_artifacts,
    spark_jars,
)
from heartbeat_runner.engines.spark_local import CHECKPOINT_INTERVAL, file_system_confs, local_spark

pytestmark = [
    pytest.mark.spark,
    pytest.mark.skipif(not (shutil.which("java") and shutil.which("mvn")), reason="needs Java 17 and Maven"),
    pytest.mark.timeout(600),
]
delta_tables = pytest.importorskip("delta.tables", reason="needs delta-spark: pip install 'heartbeat-runner[spark]'")

_names = itertools.count()


@dataclass
class DeltaSpark:
    """One running shape: its session, and whether delta-spark's DeltaTable API is served."""

    mode: str
    spark: object
    delta_table_api: bool
    url: str | None = None

    def new_table(self, columns: str = "id bigint, v string", properties: str = "") -> str:
        """A fresh Delta table ``s.t<n>`` (identifiers generated here, never from input)."""
        name = f"s.t{next(_names)}"
        tblproperties = f" TBLPROPERTIES ({properties})" if properties else ""
        self.spark.sql(f"CREATE TABLE {name} ({columns}) USING delta{tblproperties}")
        return name


@pytest.fixture(scope="module", params=["spark-classic", "spark-connect"])
def engine(request, spark_dir):
    """The session's shared local Spark of this shape (see conftest.py), with a scratch schema ``s``."""
    running = local_spark(spark_dir / request.param, request.param.removeprefix("spark-"))
    running.spark.sql("CREATE SCHEMA IF NOT EXISTS s")
    try:
        yield DeltaSpark(running.mode, running.spark, delta_table_api=running.delta_table_api, url=running.url)
    finally:
        running.spark.sql("DROP SCHEMA IF EXISTS s CASCADE")


def _rows(spark, sql: str) -> list[tuple]:
    return [tuple(r) for r in spark.sql(sql).collect()]


def test_jars_are_cached_and_do_not_shadow_pyspark():
    started = time.monotonic()
    jars = spark_jars()
    assert time.monotonic() - started < 5, "a cached jar set is listed, not resolved again"
    names = {_artifact(j.name) for j in jars}
    assert "delta-spark_2.13" in names and "delta-storage" in names and "postgresql" in names
    assert not names & pyspark_jar_artifacts()


def test_missing_maven_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HEARTBEAT_SPARK_JARS_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn, no java
    monkeypatch.delenv("JAVA_HOME", raising=False)
    with pytest.raises(SparkJarsError, match=r"Maven \(mvn\) and Java 17 \(java\) not found"):
        spark_jars()


def test_delta_connect_availability_is_remembered():
    first = delta_connect_available()
    started = time.monotonic()
    assert delta_connect_available() == first
    assert time.monotonic() - started < 1, "the second answer comes from the cache, not from Maven"


def test_the_local_file_system_is_compiled_once_or_left_to_hadoop(tmp_path, monkeypatch, caplog):
    """With a JDK, Heartbeat's file system is compiled once into the cache; without javac, or when it does
    not compile, Spark runs on Hadoop's raw local file system (no error) and a failure is not retried."""
    if not shutil.which("javac"):
        pytest.skip("needs a JDK (javac)")
    monkeypatch.setenv("HEARTBEAT_SPARK_JARS_DIR", str(tmp_path / "cache"))
    jar = local_file_system_jar()
    assert jar is not None and jar.is_file()
    assert file_system_confs(jar)["spark.hadoop.fs.file.impl"] == "heartbeat.spark.LocalFileSystem"
    started = time.monotonic()
    assert local_file_system_jar() == jar
    assert time.monotonic() - started < 0.5, "a compiled jar is reused, not compiled again"

    broken = tmp_path / "LocalFileSystem.java"
    broken.write_text(FILE_SYSTEM_SOURCE.read_text().replace("extends RawLocalFileSystem", "extends NoSuchClass"))
    with caplog.at_level(logging.WARNING):
        assert local_file_system_jar(broken) is None
    assert "javac could not compile LocalFileSystem.java" in caplog.text
    assert [p.name for p in (tmp_path / "cache").glob("*.unavailable")], "the failure is remembered"

    monkeypatch.setenv("PATH", str(tmp_path))  # no javac
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("HEARTBEAT_SPARK_JARS_DIR", str(tmp_path / "other-cache"))
    assert local_file_system_jar() is None
    assert file_system_confs(None)["spark.hadoop.fs.file.impl"] == "org.apache.hadoop.fs.RawLocalFileSystem"


def _table_dir(engine, table: str) -> Path:
    location = engine.spark.sql(f"DESCRIBE DETAIL {table}").collect()[0]["location"]
    return Path(location.removeprefix("file:"))


def test_files_get_the_permissions_hadoop_gives_and_no_checksum_side_files(engine):
    """Data and log files get the mode Hadoop's own chmod gave them (0666 less the umask Hadoop applies,
    022), and no ``.name.crc`` side file doubles each file (Delta's own
    ``_delta_log/<version>.crc`` stays)."""
    spark = engine.spark
    t = engine.new_table()
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a')")
    spark.sql(f"MERGE INTO {t} AS tgt USING (SELECT 1 AS id, 'b' AS v) AS src ON tgt.id = src.id "
              f"WHEN MATCHED THEN UPDATE SET v = src.v")
    folder = _table_dir(engine, t)
    files = [p for p in folder.rglob("*") if p.is_file()]
    data = [p for p in files if p.suffix == ".parquet"]
    commits = sorted(p.name for p in (folder / "_delta_log").glob("*.json"))
    assert len(data) >= 2 and commits[-1] == "00000000000000000002.json"
    assert {oct(stat.S_IMODE(p.stat().st_mode)) for p in files} == {"0o644"}
    assert [p.name for p in files if p.name.startswith(".") and p.name.endswith(".crc")] == []
    assert (folder / "_delta_log" / "00000000000000000002.crc").is_file(), "Delta's own checksum is written"


def test_a_tenth_commit_does_not_stop_to_write_a_checkpoint(engine):
    """Delta writes a checkpoint at every tenth commit by default, in the committing statement (1-1.5 s
    here, about every other busy tick); tables of a local session do so every CHECKPOINT_INTERVAL commits."""
    spark = engine.spark
    t = engine.new_table()
    for i in range(12):
        spark.sql(f"INSERT INTO {t} VALUES ({i}, 'v')")
    log_dir = _table_dir(engine, t) / "_delta_log"
    assert (log_dir / "00000000000000000012.json").is_file()
    assert sorted(p.name for p in log_dir.glob("*.checkpoint*")) == []
    assert _rows(spark, f"SELECT count(*) FROM {t}") == [(12,)]
    properties = dict(_rows(spark, f"SHOW TBLPROPERTIES {t}"))
    assert properties["delta.checkpointInterval"] == str(CHECKPOINT_INTERVAL)


def test_the_jvm_collects_garbage_with_the_parallel_collector(engine):
    """G1, Java's default, collects concurrently and took ~1 core of a busy tick on 2 cores; local Spark
    runs the parallel collector (spark_local.GARBAGE_COLLECTOR)."""
    if engine.mode != "classic":
        pytest.skip("reads the JVM's collectors through py4j")
    beans = engine.spark._jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    assert {beans.get(i).getName() for i in range(beans.size())} == {"PS Scavenge", "PS MarkSweep"}


def _child_processes_during(pid: int, work, tmp_path: Path) -> list[str]:
    """The commands the JVM ``pid`` started while ``work`` ran (Java Flight Recorder's ProcessStart)."""
    settings = tmp_path / "process-starts.jfc"
    settings.write_text('<?xml version="1.0" encoding="UTF-8"?><configuration version="2.0">'
                        '<event name="jdk.ProcessStart"><setting name="enabled">true</setting>'
                        '<setting name="stackTrace">false</setting></event></configuration>')
    recording = tmp_path / "recording.jfr"
    subprocess.run(["jcmd", str(pid), "JFR.start", "name=heartbeat-test", f"settings={settings}"],
                   check=True, capture_output=True)
    try:
        work()
    finally:
        subprocess.run(["jcmd", str(pid), "JFR.stop", "name=heartbeat-test", f"filename={recording}"],
                       check=True, capture_output=True)
    events = subprocess.run(["jfr", "print", "--events", "jdk.ProcessStart", str(recording)],
                            check=True, capture_output=True, text=True).stdout
    return [line.split("=", 1)[1].strip() for line in events.splitlines() if line.strip().startswith("command =")]


def test_delta_commits_start_no_child_process(engine, tmp_path):
    """Hadoop without its native library runs chmod and readlink for every file and rename (about 250
    processes of the JVM per busy tick); the local file system Heartbeat compiles does neither."""
    if engine.mode != "classic" or not (shutil.which("jcmd") and shutil.which("jfr")):
        pytest.skip("counts the classic JVM's child processes with the JDK's jcmd and jfr")
    if local_file_system_jar() is None:
        pytest.skip("needs a JDK (javac) to compile Heartbeat's local file system")
    spark = engine.spark
    pid = int(spark._jvm.java.lang.ProcessHandle.current().pid())

    def commits(t: str) -> None:  # an insert, an append, a MERGE, a parquet folder written
        spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
        spark.table(t).where("id = 1").selectExpr("3 AS id", "'c' AS v").write.mode("append").insertInto(t)
        spark.sql(f"MERGE INTO {t} AS tgt USING (SELECT 2 AS id, 'B' AS v) AS src ON tgt.id = src.id "
                  f"WHEN MATCHED THEN UPDATE SET v = src.v")
        spark.sql(f"INSERT OVERWRITE DIRECTORY '{tmp_path / 'staged'}' USING parquet SELECT * FROM {t}")

    commits(engine.new_table())  # first: the JVM's one-time setups (its page size: getconf) may start one
    t = engine.new_table()
    assert _child_processes_during(pid, lambda: commits(t), tmp_path) == []
    assert _rows(spark, f"SELECT * FROM {t} ORDER BY id") == [(1, "a"), (2, "B"), (3, "c")]
    assert os.listdir(tmp_path / "staged")


def test_append_merge_time_travel_history(engine):
    spark = engine.spark
    t = engine.new_table()
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    spark.createDataFrame([(3, "c")], "id bigint, v string").write.mode("append").insertInto(t)
    spark.sql(f"""MERGE INTO {t} AS tgt
                  USING (SELECT * FROM VALUES (2, 'B'), (4, 'd') AS src(id, v)) AS src ON tgt.id = src.id
                  WHEN MATCHED THEN UPDATE SET v = src.v
                  WHEN NOT MATCHED THEN INSERT *""")
    assert _rows(spark, f"SELECT * FROM {t} ORDER BY id") == [(1, "a"), (2, "B"), (3, "c"), (4, "d")]
    assert _rows(spark, f"SELECT * FROM {t} VERSION AS OF 1 ORDER BY id") == [(1, "a"), (2, "b")]
    # DESCRIBE HISTORY is a command, not a query: it cannot be a subquery
    history = [tuple(r) for r in spark.sql(f"DESCRIBE HISTORY {t}").select("version", "operation")
               .orderBy("version").collect()]
    assert history == [(0, "CREATE TABLE"), (1, "WRITE"), (2, "WRITE"), (3, "MERGE")]


def test_change_data_feed(engine):
    spark = engine.spark
    t = engine.new_table(properties="'delta.enableChangeDataFeed' = 'true'")
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")  # version 1
    spark.sql(f"UPDATE {t} SET v = 'B' WHERE id = 2")          # version 2
    spark.sql(f"DELETE FROM {t} WHERE id = 1")                 # version 3
    changes = (spark.read.format("delta").option("readChangeFeed", "true")
               .option("startingVersion", 2).option("endingVersion", 3).table(t))
    got = sorted((r["id"], r["v"], r["_change_type"], r["_commit_version"]) for r in changes.collect())
    assert got == [(1, "a", "delete", 3), (2, "B", "update_postimage", 2), (2, "b", "update_preimage", 2)]
    via_sql = _rows(spark, f"SELECT count(*) FROM table_changes('{t}', 1, 3)")
    assert via_sql == [(5,)]


def test_delta_table_api(engine):
    """delta-spark's DeltaTable: native in the classic shape; over Spark Connect it needs Delta's
    Connect plugin on the server (io.delta:delta-connect-server), else the server rejects the plan."""
    from delta.tables import DeltaTable

    spark = engine.spark
    t = engine.new_table()
    spark.sql(f"INSERT INTO {t} VALUES (1, 'a'), (2, 'b')")
    if not engine.delta_table_api:
        with pytest.raises(Exception, match="No handler found for extension"):
            DeltaTable.forName(spark, t).history().collect()
        pytest.xfail("Delta Connect plugin (io.delta:delta-connect-server_2.13) not resolvable from Maven here")
    table = DeltaTable.forName(spark, t)
    source = spark.createDataFrame([(2, "B"), (3, "c")], "id bigint, v string")
    (table.alias("tgt").merge(source.alias("src"), "tgt.id = src.id")
     .whenMatchedUpdate(set={"v": "src.v"}).whenNotMatchedInsertAll().execute())
    assert sorted(tuple(r) for r in table.toDF().collect()) == [(1, "a"), (2, "B"), (3, "c")]
    assert [r["operation"] for r in table.history().orderBy("version").collect()] == ["CREATE TABLE", "WRITE", "MERGE"]
    detail = table.detail().collect()[0]
    assert detail["format"] == "delta" and detail["name"].endswith(t.split(".")[1])


def test_version_as_of_after_1000_row_merge(engine):
    spark = engine.spark
    t = engine.new_table("id bigint, v bigint")
    spark.sql(f"INSERT INTO {t} SELECT id, 0 FROM range(1000)")
    spark.sql(f"""MERGE INTO {t} AS tgt USING (SELECT id, 1 AS v FROM range(500, 1500)) AS src ON tgt.id = src.id
                  WHEN MATCHED THEN UPDATE SET v = src.v WHEN NOT MATCHED THEN INSERT *""")
    assert _rows(spark, f"SELECT count(*), sum(v) FROM {t}") == [(1500, 1000)]
    assert _rows(spark, f"SELECT count(*), sum(v) FROM {t} VERSION AS OF 1") == [(1000, 0)]


def test_commit_conflict_error_text(engine):
    """Two MERGEs of one table at once: the loser's error names the Delta conflict (the texts the
    runner's retry must recognise: engine_errors maps it to a commit conflict). Races are not forced, so bounded tries."""
    t = engine.new_table("id bigint, v bigint")
    engine.spark.sql(f"INSERT INTO {t} SELECT id, 0 FROM range(100)")
    merge = (f"MERGE INTO {t} AS tgt USING (SELECT id, 1 AS v FROM range(100)) AS src ON tgt.id = src.id "
             "WHEN MATCHED THEN UPDATE SET v = tgt.v + src.v")
    for _ in range(5):
        errors = _race(engine, merge)
        if errors:
            break
    else:
        pytest.skip("no commit conflict happened in 5 rounds of two concurrent MERGEs")
    text = errors[0].lower()
    assert "delta_concurrent_append" in text and "concurrent update" in text
    assert kind_of(RuntimeError(errors[0])) is CommitConflictError


def _race(engine: DeltaSpark, sql: str) -> list[str]:
    """Run ``sql`` in two threads at once (a session each on Connect); the errors' texts."""
    from pyspark.sql import SparkSession

    errors: list[str] = []
    barrier = threading.Barrier(2)

    def run(session) -> None:
        barrier.wait()
        try:
            session.sql(sql)
        except Exception as exc:  # noqa: BLE001 - the text is what is checked
            errors.append(str(exc))

    other = SparkSession.builder.remote(engine.url).create() if engine.url else engine.spark
    threads = [threading.Thread(target=run, args=(s,)) for s in (engine.spark, other)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if other is not engine.spark:
        other.stop()
    return errors
