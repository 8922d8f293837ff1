"""The engine's error table (engines/engine_errors.py): the one place that reads engine error texts.
A write that lost a Delta commit race is repeated; any other failure is raised at once, with its cause."""

from __future__ import annotations

import time
from pathlib import Path

import connect_sessions
import pytest

from heartbeat_runner.engines.engine_errors import (
    ChangeFeedRangeMissingError,
    CommitConflictError,
    EngineUnavailableError,
    NoCatalogLookError,
    kind_of,
)
from heartbeat_runner.lakehouse.store import WRITE_ATTEMPTS, retry_lost_commits


class _Flaky:
    """A write that fails with ``error`` ``times`` times, then succeeds; counts its calls."""

    def __init__(self, error: Exception, times: int):
        self.error, self.times, self.calls = error, times, 0

    def __call__(self) -> None:
        self.calls += 1
        if self.calls <= self.times:
            raise self.error


@pytest.mark.parametrize(("text", "kind"), [
    # texts as the engines print them (Sail 0.7, Delta 4.0 on Spark, Spark Connect through dbt)
    ("Failed to commit transaction: 0", CommitConflictError),
    ("Missing commit file: expected version 0, found 7", CommitConflictError),
    ("[DELTA_CONCURRENT_APPEND] Files were added to the root of the table by a concurrent update.", CommitConflictError),
    ("[DELTA_MISSING_CHANGE_DATA] Error getting change data for range [0 , 3]", ChangeFeedRangeMissingError),
    ("<_MultiThreadedRendezvous of RPC that terminated with: status = StatusCode.UNAVAILABLE", EngineUnavailableError),
    ("[TABLE_OR_VIEW_NOT_FOUND] The table or view `x` cannot be found.", None),
    # a catalog without an information_schema: the catalog look backs off longest (engine.catalog_look)
    ("[TABLE_OR_VIEW_NOT_FOUND] The table or view `hive_metastore`.`information_schema`.`tables` cannot be "
     "found. Verify the spelling", NoCatalogLookError),
    ("[SCHEMA_NOT_FOUND] The schema `spark_catalog`.`information_schema` cannot be found.", NoCatalogLookError),
])
def test_each_engine_text_has_one_kind(text, kind):
    assert kind_of(RuntimeError(text)) is kind


def test_the_kind_is_found_through_the_cause_chain():
    try:
        try:
            raise RuntimeError("Failed to commit transaction: 3")
        except RuntimeError as exc:
            raise ValueError("dbt run failed") from exc
    except ValueError as wrapped:
        assert kind_of(wrapped) is CommitConflictError


def test_a_lost_commit_race_is_written_again_until_it_lands():
    write = _Flaky(RuntimeError("Failed to commit transaction: 0"), times=2)
    retry_lost_commits(write, "append")
    assert write.calls == 3


def test_another_failure_is_raised_at_once_and_a_race_lost_every_time_in_the_end():
    other = _Flaky(RuntimeError("[TABLE_OR_VIEW_NOT_FOUND] no such table"), times=9)
    with pytest.raises(RuntimeError, match="TABLE_OR_VIEW_NOT_FOUND"):
        retry_lost_commits(other, "append")
    assert other.calls == 1

    dropped = _Flaky(RuntimeError("StatusCode.UNAVAILABLE"), times=1)
    with pytest.raises(RuntimeError):
        retry_lost_commits(dropped, "append")  # a dropped channel is repeated only where the caller allows it
    retry_lost_commits(_Flaky(RuntimeError("StatusCode.UNAVAILABLE"), times=1), "dbt run", also=(EngineUnavailableError,))

    always = _Flaky(RuntimeError("Failed to commit transaction: 0"), times=99)
    with pytest.raises(RuntimeError):
        retry_lost_commits(always, "append")
    assert always.calls == WRITE_ATTEMPTS


def test_a_dropped_spark_connect_session_leaves_the_other_clients_working(hb):
    """PySpark 4.0's Connect clients share one release pool, and closing any client (also from a dropped
    session's ``__del__``, on whatever thread the garbage collector runs) shut it down for all: the next
    queries failed with "cannot schedule new futures after shutdown", or the tick hung. The engine keeps
    the pool: a session to another Sail server is opened and closed mid-run, and ticks go on."""
    from harness import config_row as row
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as Iterator

    from heartbeat_runner.engines.sail_process import SailProcess

    hb.create_table("up.t", "id int")
    hb.seed(row("delta_table", "up.t", "J1"))
    hb.jobs(J1=0)
    hb.tick()
    in_use = Iterator._get_or_create_release_thread_pool()  # what the runner's queries hand releases to
    other = SailProcess.start()
    try:
        session = SparkSession.builder.remote(other.url).create()
        assert session.sql("SELECT 1 AS one").collect()[0]["one"] == 1
        session.stop()  # what a recycle, a test or the status page does to its old session
        del session
    finally:
        other.stop()
    # a query between taking the pool and submitting to it would have failed, or waited on it forever
    assert not in_use._shutdown and Iterator._release_thread_pool_instance is in_use
    hb.insert("up.t", "(1)")
    assert hb.tick().triggered_job_ids == ["J1"]
    hb.wait_for_jobs()
    assert hb.job_status("J1") == {"COMPLETED"}


def _child_environment(pid: int) -> dict[str, str]:
    """The environment a running process was started with (Linux ``/proc``)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def test_the_engines_session_outlives_sails_idle_timeout_unless_the_user_sets_one(monkeypatch):
    """Sail drops a Spark Connect session after 15 idle minutes by default. A status page nobody visited
    for 15 minutes, or a worker whose shared engine sat idle that long (CI), then failed every query with
    "session ... is not running". The engine's child keeps its session a year; a timeout the user sets
    still wins, and Sail then does drop the idle session."""
    from pyspark.sql import SparkSession

    from heartbeat_runner.engines.sail_process import SESSION_TIMEOUT_S, SailProcess

    monkeypatch.delenv("SAIL_SPARK__SESSION_TIMEOUT_SECS", raising=False)
    ours = SailProcess.start()
    try:
        assert int(_child_environment(ours.pid)["SAIL_SPARK__SESSION_TIMEOUT_SECS"]) == SESSION_TIMEOUT_S >= 86_400
    finally:
        ours.stop()

    monkeypatch.setenv("SAIL_SPARK__SESSION_TIMEOUT_SECS", "1")
    theirs = SailProcess.start()
    # the session is the process's current one only inside: its server ends below, and a session left current
    # after that makes later tests of this worker wait (tests/connect_sessions.py)
    with connect_sessions.set_aside():
        try:
            session = SparkSession.builder.remote(theirs.url).create()
            assert session.sql("SELECT 1 AS one").collect()[0]["one"] == 1
            time.sleep(4)
            with pytest.raises(Exception, match="is not running"):
                session.sql("SELECT 2 AS two").collect()
        finally:
            theirs.stop()


def test_grpcs_lines_for_a_response_cut_short_show_only_at_debug(caplog):
    """gRPC logs a response it could not read (a release still in flight when a server stops) at ERROR with a
    traceback. The everyday output leaves those lines out (a caller whose own call failed gets the error
    raised), and a debug log level shows them, at DEBUG, so the cause of a failed read can be found."""
    import logging

    from heartbeat_runner.engines.spark_local import DemoteToDebug, keep_connect_release_pool

    keep_connect_release_pool()
    keep_connect_release_pool()  # idempotent: one filter
    grpc_log = logging.getLogger("grpc._common")
    assert sum(isinstance(f, DemoteToDebug) for f in grpc_log.filters) == 1
    with caplog.at_level(logging.WARNING):
        grpc_log.error("Exception deserializing response!")
    assert caplog.records == []
    with caplog.at_level(logging.DEBUG):
        grpc_log.error("Exception deserializing response!")
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [("DEBUG", "Exception deserializing response!")]
