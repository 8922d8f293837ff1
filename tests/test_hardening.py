"""A bad config row can never harm the lakehouse, the loop survives any tick, migrated configs load,
and following another product's sensor table works by table name, asset and sensor id."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from harness import HEADER, CliLakehouse, live_descendants, marker_jobs_file, still_running, stop_loop, wait_for
from harness import config_row as row

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.core.names import sql_string
from heartbeat_runner.core.records import JobStatus, SensorStatus
from heartbeat_runner.interfaces.operations import explain
from heartbeat_runner.lakehouse.store import SENSOR_STATE, Cond
from heartbeat_runner.sensing.config import load_config

DROP_EVENTS = "DROP TABLE heartbeat.heartbeat_events"
DUPLICATE_EVENTS = "INSERT INTO heartbeat.heartbeat_events SELECT * FROM heartbeat.heartbeat_events"
READS_EVENTS = "SELECT * FROM heartbeat.heartbeat_events WHERE event_type = 'NEW_DATA'"


def write_config(path: Path, *rows: str) -> Path:
    path.write_text("\n".join([HEADER, *rows]) + "\n")
    return path


def config_problems(tmp_path: Path, *rows: str) -> list[str]:
    with pytest.raises(ConfigError) as raised:
        load_config(write_config(tmp_path / "config.csv", *rows))
    return raised.value.problems


# -- 1. preprocess_query: a single read-only SELECT over sensor_new_data ------------------------------

@pytest.mark.parametrize("query, reason", [
    (DROP_EVENTS, "read-only SELECT; found DROP"),
    (DUPLICATE_EVENTS, "read-only SELECT; found INSERT"),
    (READS_EVENTS, "may read only sensor_new_data (and its own CTEs); it reads heartbeat.heartbeat_events"),
    ("SELECT * FROM sensor_new_data; DROP TABLE x", "single SELECT statement; found 2"),
    ("SELECT * FROM sensor_new_data UNION ALL SELECT * FROM heartbeat.heartbeat_runs", "it reads heartbeat.heartbeat_runs"),
    ("WITH sensor_new_data AS (SELECT * FROM heartbeat.heartbeat_events) SELECT * FROM sensor_new_data",
     "it reads heartbeat.heartbeat_events"),
    ("SELECT * FROM delta.`/tmp/other`", "may read only sensor_new_data"),
    ("SELECT * FROM read_files('/tmp/x')", "table function"),
    ("SELECT reflect('java.lang.System', 'exit', 0) FROM sensor_new_data", "may not call reflect()"),
    ("SELECT 1", "does not read sensor_new_data"),
    ("SELEC * FROM sensor_new_data", "is not valid Spark SQL"),
])
def test_validate_refuses_any_query_but_a_select_over_the_new_rows(tmp_path, query, reason):
    problems = config_problems(tmp_path, row("delta_table", "shop.orders", "J1"),
                               row("delta_table", "shop.returns", "J2", query=query))
    assert len(problems) == 1
    assert problems[0].startswith(f"{tmp_path / 'config.csv'}: line 3, column preprocess_query: ")
    assert reason in problems[0]


@pytest.mark.parametrize("query", [
    "SELECT * FROM sensor_new_data WHERE amount >= 1000",
    "WITH big AS (SELECT * FROM sensor_new_data WHERE amount > 1) SELECT b.* FROM big b JOIN sensor_new_data s "
    "ON b.id = s.id",
    "SELECT * FROM sensor_new_data WHERE id IN (SELECT id FROM sensor_new_data WHERE ?upstream_key > 0)",
    "select count(*) from Sensor_New_Data group by region having count(*) > 2",
])
def test_validate_accepts_filters_ctes_and_subqueries(tmp_path, query):
    config = load_config(write_config(tmp_path / "config.csv",
                                      row("delta_table", "shop.orders", "J1", key="id", query=query)))
    assert config.rows[0].preprocess_query == query


def test_a_query_edited_into_the_table_behind_the_csv_is_refused_at_sensing(hb):
    """The seed table is changed directly: sensing refuses the query, records an error for that source
    only, the other job triggers, and Heartbeat's own tables are untouched."""
    hb.create_table("shop.orders", "id bigint")
    hb.create_table("shop.returns", "id bigint")
    hb.jobs(J1=0, J2=0)
    hb.seed(row("delta_table", "shop.orders", "J1"),
            row("delta_table", "shop.returns", "J2", query="SELECT * FROM sensor_new_data WHERE id > 0"))
    hb.spark.sql(f"UPDATE heartbeat.heartbeat_sensor_config SET preprocess_query = {sql_string(DROP_EVENTS)} "
                 "WHERE sensor_id = 'shop.returns'")
    hb.heartbeat.refresh_models(force=True)
    assert hb.tick().sensor_errors == []  # baselines: no new rows, the query does not run yet
    hb.insert("shop.orders", "(1)")
    hb.insert("shop.returns", "(1)")
    events_before = len(hb.events())

    result = hb.tick()

    errors = {s.target.sensor_id: s.error for s in result.sensor_errors}
    assert list(errors) == ["shop.returns"] and "preprocess_query refused" in errors["shop.returns"]
    assert "found DROP" in errors["shop.returns"]
    assert result.triggered_job_ids == ["J1"] and result.exit_code == 2
    assert hb.app.store.exists("heartbeat_events") and len(hb.events()) > events_before
    report = hb.app.store.read("heartbeat_run_report", Cond("run_id", result.run_id), Cond("sensor_id", "shop.returns"))
    assert report[0]["outcome"] == "ERROR" and "found DROP" in report[0]["error"]
    assert hb.tick().sensor_errors[0].target.sensor_id == "shop.returns"  # and the next tick goes on


# -- 2. the loop survives any failing tick; it stops only when the lakehouse is unusable -----------

def seeded_lakehouse(root: Path) -> CliLakehouse:
    config = write_config(root / "config.csv", row("trigger_file", "drop", "J1"))
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=marker_jobs_file(root / "jobs.yml", "J1"))
    lake.cli("seed")
    lake.cli("run")  # baseline
    return lake


@pytest.fixture
def lake(tmp_path, template) -> CliLakehouse:
    """J1 reads the trigger folder ``drop``; seeded, at its baseline (a copy of the module's template)."""
    return template.copy(tmp_path)




@pytest.mark.slow
def test_loop_survives_engine_exceptions_and_logs_each_error_once(lake):
    loop = lake.loop_through_failures(3)
    out, err = loop.stdout, loop.stderr
    assert loop.returncode == 0, err
    assert err.count("tick failed: InjectedFault: injected failure at after_sensing") == 1
    assert err.count("Traceback (most recent call last)") == 1  # the traceback once, not per tick
    assert "tick failed again (3 in a row)" in err
    assert "stopped after" in out


def _loop_until_it_stops(lake, interval: str, ticks: int, damage) -> tuple[int | None, str]:
    """A ``run --loop`` that ticks ``ticks`` times, then ``damage()`` runs under it; its exit code and stderr once
    it stopped (killed, and so failing the caller's check, if it did not within 120 s)."""
    loop = lake.start("run", "--loop", "--interval", interval)
    err: list[str] = []
    reader = threading.Thread(target=lambda: err.extend(loop.stderr), daemon=True)
    reader.start()
    try:
        wait_for(lambda: sum(line.startswith("tick ") for line in err) >= ticks or loop.poll() is not None, 180,
                 f"{ticks} ticks of the loop")
        damage()
        loop.wait(timeout=120)
    finally:
        if loop.poll() is None:
            loop.kill()
    reader.join(timeout=10)
    return loop.returncode, "".join(err)


@pytest.mark.slow
def test_loop_stops_with_its_own_exit_code_when_the_lakehouse_is_unusable(lake):
    """The events table is deleted under a loop that is idling (its idle ticks read no table): the next
    tick notices, and the loop stops with exit code 3 naming the table."""
    code, err = _loop_until_it_stops(
        lake, "0.2", 3, lambda: shutil.rmtree(lake.home / "warehouse" / "heartbeat" / "heartbeat_events"))
    assert code == 3, err[-3000:]
    assert "stopping: the lakehouse is unusable (table heartbeat.heartbeat_events" in err


@pytest.mark.slow
def test_the_loop_stops_with_exit_3_once_a_dbt_built_table_of_heartbeat_is_gone(lake, tmp_path):
    """The sensor state table (built by dbt, read and merged by every tick that records something) is moved
    away under a running loop and new data arrives: the next tick fails, and the loop stops with exit code 3
    naming the table, as the README says. Before, the check looked at the runner's own tables only: the loop
    went on failing with back-off for ever."""
    def damage() -> None:
        shutil.move(str(lake.home / "warehouse" / "heartbeat" / "heartbeat_sensor_state"), str(tmp_path / "moved"))
        lake.drop_trigger_file("drop", "a.done")

    code, err = _loop_until_it_stops(lake, "0.5", 2, damage)
    assert code == 3, err[-3000:]
    assert "stopping: the lakehouse is unusable (table heartbeat.heartbeat_sensor_state" in err


#: (signal, to the whole process group, mid-tick): every pair of the three choices is covered by one of four
#: runner processes (a full product would start eight, at ~6 s each)
STOPS = [(signal.SIGINT, True, False), (signal.SIGTERM, True, True), (signal.SIGINT, False, True),
         (signal.SIGTERM, False, False)]


@pytest.mark.slow
def test_a_stop_signal_to_the_loop_or_its_whole_process_group_stops_it_cleanly_after_the_running_tick(lake, tmp_path):
    """Ctrl-C in a terminal, ``timeout`` and systemd signal the whole process group; ``kill`` signals the runner.
    Either way, between ticks or mid-tick (paused after sensing, then let go), on the embedded engine: the loop
    finishes the running tick, exits 0 ("stopped after"), the shutdown watchdog never fires, and no engine
    process is left behind. Before, a signal to the group killed the engine child at once and the shutdown
    waited on it for the whole 30 s grace: "Timeout (0:00:30)!", every stack, exit 1."""
    for sig, to_group, mid_tick in STOPS:
        what = f"{signal.Signals(sig).name} to the {'group' if to_group else 'runner'}, {'mid' if mid_tick else 'between'} tick"
        stopped = stop_loop(lake, sig, to_group=to_group, mid_tick=mid_tick, marker=tmp_path / f"paused-{sig}-{to_group}")
        assert stopped.returncode == 0, f"{what}: exit {stopped.returncode}\n{stopped.stderr[-4000:]}"
        assert "Timeout (" not in stopped.stderr and "Traceback" not in stopped.stderr, what
        assert "stopped after 1 tick(s)" in stopped.stdout, (what, stopped.stdout)
        assert stopped.engine_children and not stopped.left_behind, (what, stopped)


@pytest.mark.slow
def test_a_stop_signal_at_any_moment_of_a_loops_start_ends_it_without_a_traceback(lake):
    """Ctrl-C (SIGINT) or SIGTERM to the process group of ``run --loop`` while it starts (loading, opening the
    engine, taking the lease, its first tick) ends it: with 0 ("stopped after"), 130 after Ctrl-C, or by the
    signal; never a traceback, no child left behind. So does the ``heartbeat`` console script (pip's wrapper).
    A signal that comes while the interpreter itself still starts (importing ``site``) is CPython's: it prints
    "Fatal Python error: init_import_site" and exits 1 before any of the program exists. A loop that does not
    end is reported with what held it (its stacks, or the processes that keep its output open).
    Before, a Ctrl-C in its first second or so (loading, before any command could handle it) printed Python's
    KeyboardInterrupt traceback, and one that a library swallowed while being imported left the loop running
    (CI: still ticking 120 s after the Ctrl-C)."""
    ends = {signal.SIGINT: (0, 130, -signal.SIGINT), signal.SIGTERM: (0, -signal.SIGTERM)}
    module = lake.command("run", "--loop", "--interval", "0.5")
    script = [str(Path(sys.executable).with_name("heartbeat")), *module[3:]]
    # points spread over a start (when each lands varies with the machine's load), most of them in the loading
    for command, sig, delay in [(module, signal.SIGINT, d) for d in (0.1, 0.2, 0.3, 0.45, 0.6, 0.8, 1.2, 2.5, 4.0)] + \
                               [(module, signal.SIGTERM, d) for d in (0.3, 0.8)] + \
                               [(script, signal.SIGINT, 0.4), (script, signal.SIGTERM, 0.4)]:
        loop = subprocess.Popen(command, env=lake.env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                cwd=lake.home.parent, start_new_session=True)
        try:
            time.sleep(delay)
            children = live_descendants(loop.pid) if loop.poll() is None else {}
            os.killpg(loop.pid, sig)
            what = f"{sig.name} at {delay} s to {Path(command[0]).name}"
            out, err = _output_or_what_held_it(loop, what)
        finally:
            if loop.poll() is None:
                os.killpg(loop.pid, signal.SIGKILL)
                loop.wait()
        if loop.returncode == 1 and err.startswith(_BEFORE_THE_PROGRAM):
            continue  # the interpreter itself was still starting: no code of ours had run yet
        assert loop.returncode in ends[sig], (what, loop.returncode, err[-3000:])
        assert "Traceback" not in err and "KeyboardInterrupt" not in err, (what, err[-3000:])
        wait_for(lambda started=children: not still_running(started), 10, f"the children of a loop stopped: {what}")


def test_a_ctrl_c_swallowed_before_the_loop_handles_signals_still_stops_the_loop(restore_signals, monkeypatch):
    """Python's Ctrl-C raises KeyboardInterrupt wherever the main thread is; inside a finalizer the interpreter
    swallows it ("Exception ignored in ..."), and a loop Ctrl-C'd at its start ran on (CI: still ticking two
    minutes later). After loading, the program notes a Ctrl-C before raising it (core/early_stop.py), and a
    loop's stop handling, once installed, takes a noted one as received: the loop stops. Taken once."""
    from heartbeat_runner.core import early_stop
    from heartbeat_runner.core.stopping import StopRequest

    swallowed: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda unraisable: swallowed.append(unraisable.exc_value))

    class Finalized:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler here, inside the finalizer
            time.sleep(0.5)

    signal.signal(signal.SIGINT, early_stop.note_then_interrupt)  # as interfaces/entry.py leaves it after loading
    Finalized()  # collected at once: its finalizer runs, and the KeyboardInterrupt raised in it is swallowed
    assert len(swallowed) == 1 and isinstance(swallowed[0], KeyboardInterrupt)
    stop = StopRequest(grace_s=60).install()  # the loop's, later in its start
    assert stop.is_set(), "the Ctrl-C swallowed before the loop handled signals was lost"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # a second Ctrl-C ends it at once
    assert not StopRequest(grace_s=60).install().is_set()  # adopted once
    # the program's own hook leaves such a KeyboardInterrupt unprinted (it was noted), and reports anything else
    printed: list[object] = []
    monkeypatch.setattr(sys, "__unraisablehook__", printed.append)
    for exc in (KeyboardInterrupt(), ValueError("a finalizer's own failure")):
        early_stop.unraisable(SimpleNamespace(exc_value=exc))
    assert [u.exc_value for u in printed] == [exc]


#: what CPython prints (exit 1) when a signal stops its own start, while it imports ``site``: before any code of
#: the program can run, so before any handler of ours can exist (seen under load with Ctrl-C at 0.1 s)
_BEFORE_THE_PROGRAM = "Fatal Python error: init_import_site"


def _output_or_what_held_it(loop: subprocess.Popen, what: str, timeout_s: float = 120) -> tuple[str, str]:
    """The stopped loop's stdout and stderr; past ``timeout_s`` a failure that says what held them: the loop
    itself still running (with its threads' stacks, asked with SIGUSR1), or processes of its group that
    outlived it and keep its output open."""
    try:
        return loop.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        import psutil

        if loop.poll() is None:
            held = "the loop still runs (its stacks, if it could write them, are in its stderr below)"
            os.kill(loop.pid, signal.SIGUSR1)
            time.sleep(3)
        else:
            group = {p.pid: " ".join(p.cmdline()) for p in psutil.process_iter() if _group_of(p.pid) == loop.pid}
            held = f"the loop ended with {loop.returncode}, but its group's processes keep its output open: {group}"
        os.killpg(loop.pid, signal.SIGKILL)
        _, err = loop.communicate()
        shown = err if len(err) <= 9000 else f"{err[:3000]}\n[...]\n{err[-6000:]}"  # its start, and its end
        pytest.fail(f"{what}: not ended after {timeout_s:.0f} s: {held}\nstderr:\n{shown}")


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except OSError:
        return None


@pytest.mark.spark
@pytest.mark.timeout(1800)
def test_ctrl_c_to_the_process_group_of_a_loop_on_spark_classic_stops_it_cleanly(tmp_path):
    """Row 1 on the production engine: a loop on local Spark classic owns its JVM (a child in its process group,
    as a terminal starts it). Ctrl-C reaches the whole group mid-tick: the loop finishes the tick, exits 0
    ("stopped after"), its shutdown watchdog never fires and no JVM is left behind."""
    config = write_config(tmp_path / "config.csv", row("trigger_file", "drop", "J1"))
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", "J1"),
                        env={"HEARTBEAT_TARGET": "spark-local", "HEARTBEAT_SPARK_MODE": "classic",
                             "HEARTBEAT_SPARK_DIR": str(tmp_path / "spark")})
    lake.cli("seed")  # a process of its own (a Spark target), its JVM gone with it
    stopped = stop_loop(lake, signal.SIGINT, to_group=True, mid_tick=True, marker=tmp_path / "paused",
                        interval="5", start_timeout=900)
    assert stopped.returncode == 0, stopped.stderr[-4000:]
    assert "Timeout (" not in stopped.stderr and "Traceback" not in stopped.stderr, stopped.stderr[-4000:]
    assert "stopped after 1 tick(s)" in stopped.stdout, stopped.stdout
    assert any("java" in command for command in stopped.engine_children), stopped.engine_children
    assert not stopped.left_behind, stopped


def _lines_of(process: subprocess.Popen) -> list[str]:
    """stderr of ``process`` as it comes (read by a thread)."""
    lines: list[str] = []
    threading.Thread(target=lambda: lines.extend(process.stderr or ()), daemon=True).start()
    return lines


def _says_it_waits(lines: list[str], holder: subprocess.Popen) -> bool:
    """A line of ``lines`` says the runner waits up to 600 s for the lease that the process ``holder`` holds."""
    return any("waiting up to 600 s" in line and f":{holder.pid}:" in line for line in list(lines))


@pytest.mark.slow
def test_a_loop_waiting_for_the_lease_stops_at_once_on_a_stop_signal(lake, tmp_path):
    """``--wait-lease 600`` waits for another runner's tick, not for a stop: a loop that waits for the lease,
    between its ticks (it held the lease before) or before its first, says whom it waits for (the holder's
    host and pid) and exits 0 within seconds of SIGTERM to its process group while the holder's tick goes on
    (paused mid-tick). Before, it waited out the holder's tick: in CI, more than 120 s on Spark classic.
    (SIGTERM is sent once the line is out: before its handler is installed, a starting process ends as
    any Python program does, by the signal.)"""
    def loop(*extra: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        return subprocess.Popen(lake.command("run", "--loop", "--interval", "0.3", "--wait-lease", "600", *extra),
                                env={**lake.env, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, cwd=lake.home.parent, start_new_session=True)

    marker = tmp_path / "holder-paused"
    ticking = loop()
    ticking_err = _lines_of(ticking)
    holder = waiting = None
    try:
        wait_for(lambda: any(line.startswith("tick 1 ") for line in ticking_err) or ticking.poll() is not None, 120,
                 "the first loop's first tick")
        holder = loop(env={"HEARTBEAT_PAUSE_AT": f"after_sensing:{marker}"})  # asks for the lease, then keeps it
        wait_for(lambda: marker.exists() or holder.poll() is not None, 120, "the second loop to hold the lease")
        waiting = loop()  # waits from its start
        waiting_err = _lines_of(waiting)
        for process, err in ((ticking, ticking_err), (waiting, waiting_err)):
            # each says whom it waits for, and for how long (the holder is paused while the marker exists)
            wait_for(lambda lines=err, runner=process: _says_it_waits(lines, holder) or runner.poll() is not None,
                     120, "a loop to wait")
        assert ticking.poll() is None and waiting.poll() is None, ("".join(ticking_err), "".join(waiting_err))
        began = time.monotonic()
        for process in (ticking, waiting):
            os.killpg(process.pid, signal.SIGTERM)
        codes = [process.wait(timeout=60) for process in (ticking, waiting)]
        print(f"stopped {time.monotonic() - began:.1f} s after SIGTERM")
        assert codes == [0, 0], ("".join(ticking_err)[-3000:], "".join(waiting_err)[-3000:])
        assert marker.exists() and holder.poll() is None  # the holder's tick still paused: they did not wait for it
    finally:
        marker.unlink(missing_ok=True)
        for process in (ticking, holder, waiting):
            if process is not None and process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
                process.wait(timeout=120)


@pytest.mark.slow
def test_a_stuck_loop_tells_where_it_is_and_a_second_signal_ends_it(lake):
    """SIGTERM lets the running tick finish; when it never does, SIGUSR1 shows the stack and a second
    SIGTERM ends the process."""
    loop = lake.start("run", "--loop", "--interval", "0.2", env={"HEARTBEAT_HANG_AT": "after_sensing"})
    err: list[str] = []
    reading = threading.Thread(target=lambda: err.extend(loop.stderr), daemon=True)
    reading.start()
    try:
        wait_for(lambda: err or loop.poll() is not None, 120, "the first tick to start")  # handlers are installed
        assert loop.poll() is None, "".join(err)

        def stuck_in_the_tick() -> bool:
            loop.send_signal(signal.SIGUSR1)
            time.sleep(0.5)
            return any("in fail_point" in line for line in err)
        wait_for(stuck_in_the_tick, 120, "a stack dump inside the hanging tick")
        assert loop.poll() is None and any("in tick" in line for line in err)

        loop.send_signal(signal.SIGTERM)
        time.sleep(2)
        assert loop.poll() is None, "the first signal waits for the running tick"
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=30)
    finally:
        if loop.poll() is None:
            loop.kill()
    assert loop.returncode == -signal.SIGTERM


@pytest.mark.slow
def test_a_shutdown_that_hangs_ends_after_the_grace_period_with_the_stacks(lake):
    loop = lake.start("run", "--loop", "--interval", "0.2",
                      env={"HEARTBEAT_HANG_AT": "closing", "HEARTBEAT_SHUTDOWN_GRACE_S": "3"})
    err: list[str] = []
    reading = threading.Thread(target=lambda: err.extend(loop.stderr), daemon=True)
    reading.start()
    try:
        wait_for(lambda: any(line.startswith("tick 1 ") for line in err) or loop.poll() is not None, 120, "a tick")
        loop.send_signal(signal.SIGTERM)
        loop.wait(timeout=60)
    finally:
        if loop.poll() is None:
            loop.kill()
    reading.join(timeout=10)
    assert "stopped after" in loop.stdout.read()
    assert loop.returncode == 1 and "Timeout (0:00:03)!" in "".join(err)
    assert any("in close" in line for line in err), "".join(err)


#: a process with a live Spark Connect (Sail) session forks the way PySpark starts a classic JVM
FORK_WITH_GRPC = """
import subprocess, sys
if sys.argv[1] == "heartbeat":
    import heartbeat_runner
from pysail.spark import SparkConnectServer
from pyspark.sql import SparkSession
server = SparkConnectServer("127.0.0.1", 0)
server.start(background=True)
spark = SparkSession.builder.remote("sc://127.0.0.1:%d" % server.listening_address[1]).create()
spark.sql("SELECT 1").collect()
subprocess.run(["true"], preexec_fn=lambda: None, check=True)
spark.sql("SELECT 2").collect()
print("forked")
"""


@pytest.mark.parametrize("process, handlers_run", [("heartbeat", False), ("plain", True)])
def test_a_fork_beside_a_live_grpc_session_runs_no_grpc_fork_handlers(process, handlers_run):
    """gRPC's fork handlers pause and restart its threads around fork(); a JVM forked meanwhile can die
    before it execs (CI: "Java gateway process exited"). Importing Heartbeat turns them off unless the
    environment asks for them; a plain PySpark process shows the trace would tell (and may itself die
    of the hazard: its fork child is sometimes aborted, so only Heartbeat's process must finish)."""
    env = {k: v for k, v in os.environ.items() if k != "GRPC_ENABLE_FORK_SUPPORT"}
    env.update(GRPC_TRACE="fork,event_engine", GRPC_VERBOSITY="debug")
    done = subprocess.run([sys.executable, "-c", FORK_WITH_GRPC, process], env=env, capture_output=True,
                          text=True, timeout=120)
    assert ("PrepareFork" in done.stderr) is handlers_run, done.stderr[-3000:]
    if not handlers_run:
        assert done.returncode == 0 and "forked" in done.stdout, done.stderr[-3000:]


# -- 3. configs of the reference implementation: bare table names ---------------------------------

def test_bare_table_names_validate_and_other_names_are_still_refused(tmp_path):
    config = load_config(write_config(tmp_path / "config.csv", row("delta_table", "dummy_delta_table", "J1")))
    assert config.rows[0].sensor_id == "dummy_delta_table"
    problems = config_problems(tmp_path, row("delta_table", "dummy-table", "J1"), row("delta_table", "a.b.c.d", "J2"),
                               row("lmu_delta_table", "orders;drop", "J3"))
    assert [p.split(": ")[1] for p in problems] == ["line 2, column sensor_id", "line 3, column sensor_id",
                                                    "line 4, column sensor_id"]
    assert all("neither a table name" in p for p in problems)


@pytest.mark.parametrize("env, schema", [({}, "default"), ({"HEARTBEAT_UPSTREAM_SCHEMA": "shop"}, "shop")])
def test_a_bare_table_name_is_sensed_in_the_default_upstream_schema(tmp_path, env, schema):
    from harness import Harness

    with Harness(tmp_path, **env) as hb:
        hb.create_table(f"{schema}.dummy_delta_table", "id bigint")
        hb.jobs(J1=0)
        hb.seed(row("delta_table", "dummy_delta_table", "J1"))
        assert hb.tick().sensor_errors == []
        hb.insert(f"{schema}.dummy_delta_table", "(1)")
        assert hb.tick().triggered_job_ids == ["J1"]


# -- 4. following another product's sensor state table --------------------------------------------

def test_follow_a_product_by_table_name_asset_and_sensor_id_and_warn_on_a_key_that_matches_nothing(hb):
    """The README's worked example, against a sensor state table built by the real tick path."""
    state = hb.home / "warehouse" / "heartbeat" / "heartbeat_sensor_state"
    follows = {"BY_TABLE": "sales.orders", "BY_ASSET": "Big orders", "BY_ID": "delta_table:sales.orders",
               "TYPO": "sales.ordrs"}
    hb.create_table("sales.orders", "id bigint")
    hb.jobs(UPSTREAM=0, **{job: 0 for job in follows})
    orders = row("delta_table", "sales.orders", "UPSTREAM").replace("sales.orders data", "Big orders")
    hb.seed(orders, *(row("delta_upstream_sensor_table", f"{state}#{key}", job) for job, key in follows.items()))
    hb.tick()
    hb.insert("sales.orders", "(1)")
    assert hb.tick().triggered_job_ids == ["UPSTREAM"]
    hb.wait_for_jobs()
    assets = hb.spark.read.format("delta").load(str(state)).collect()[0]["assets"]
    assert assets == ["Big orders", "sales.orders"]  # the table as well as its description

    result = hb.tick()

    assert sorted(result.triggered_job_ids) == ["BY_ASSET", "BY_ID", "BY_TABLE"]
    typo = next(s for s in result.sensed if s.target.sensor_id.endswith("#sales.ordrs"))
    assert typo.error is None and "follow key 'sales.ordrs' matches no row" in typo.note
    report = hb.app.store.read("heartbeat_run_report", Cond("run_id", result.run_id),
                               Cond("trigger_job_ids", "TYPO"))
    assert report[0]["outcome"] == "NO_NEW_DATA" and "matches no row" in report[0]["error"]
    verdict = explain(hb.app.store, "TYPO")
    assert "warning: follow key 'sales.ordrs' matches no row" in verdict.verdict
    assert hb.job_status("TYPO") == {None} and hb.job_status("BY_TABLE") == {JobStatus.IN_PROGRESS.value}



# -- found on the way ------------------------------------------------------------------------------

def test_the_loaded_seed_stays_the_config_and_reseeding_it_is_a_no_op(lake):
    """dbt wrote its seed SQL over the loaded CSV (absolute seed path), so every `seed` reloaded."""
    seed_csv = lake.home / "dbt" / "seed" / "heartbeat_sensor_config.csv"
    assert seed_csv.read_text().startswith("sensor_source,sensor_id,")
    again = lake.cli("seed")
    assert "unchanged" in again.stdout


def test_the_models_can_be_built_twice_in_one_process(hb):
    """The dependency rule was an ephemeral model whose CTE a reused dbt manifest lost on the second build."""
    hb.jobs(J1=0)
    hb.seed(row("trigger_file", "drop", "J1"))
    hb.app.dbt.build_all()
    hb.app.dbt.build_all()
    assert explain(hb.app.store, "J1").verdict.startswith("waiting for new data")


def test_a_tick_that_triggers_adds_one_version_to_the_sensor_state_table(hb):
    """Followers read heartbeat_sensor_state by version: a tick that records new data and triggers on it
    adds one version (the tick's final state), not one per build inside the tick."""
    from datetime import datetime

    from deltalake import DeltaTable

    state = str(hb.home / "warehouse" / "heartbeat" / "heartbeat_sensor_state")
    hb.create_table("sales.orders", "id bigint")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "sales.orders", "J1"))
    hb.tick()
    before = DeltaTable(state).version()
    hb.insert("sales.orders", "(1)")

    assert hb.tick().triggered_job_ids == ["J1"]

    table = DeltaTable(state)
    assert table.version() == before + 1
    (orders,) = table.to_pyarrow_table().to_pylist()
    assert orders["status"] == SensorStatus.ACQUIRED_NEW_DATA
    (control,) = hb.rows("J1")
    # the trigger moved the row to IN_PROGRESS: the version shows when (a string in the session's UTC)
    shown = datetime.fromisoformat(orders["status_change_timestamp"])
    assert shown == control["status_change_timestamp"].replace(tzinfo=None)


def _sensor_states(hb, *objects: str) -> dict[str, tuple[str, str]]:
    """(status, status_change_timestamp) of the sensor state row of each upstream object, by its name."""
    return {name: (r["status"], r["status_change_timestamp"])
            for r in hb.app.store.read(SENSOR_STATE) for name in objects if name in r["assets"]}


def test_a_sources_status_change_timestamp_moves_only_when_its_status_changes(hb):
    """heartbeat_sensor_state's status_change_timestamp is when the row's status last changed (the
    spec); it followed the latest change of any control row, so a job triggering on data its source
    already showed as ACQUIRED_NEW_DATA moved it, and a follower sensing by it saw a change that was not."""
    def orders() -> tuple[str, str]:
        return _sensor_states(hb, "sales.orders")["sales.orders"]

    hb.create_table("sales.orders", "id bigint")
    hb.jobs(J1=0)
    # J1 needs new orders and a trigger file: orders alone leave it waiting
    hb.seed(row("delta_table", "sales.orders", "J1"), row("trigger_file", "go", "J1"))
    hb.tick()
    hb.insert("sales.orders", "(1)")
    assert hb.tick().triggered_job_ids == []
    acquired_status, acquired_at = orders()
    assert acquired_status == SensorStatus.ACQUIRED_NEW_DATA

    hb.drop_trigger_file("go", "ready")
    assert hb.tick().triggered_job_ids == ["J1"]
    assert hb.job_status("J1") == {JobStatus.IN_PROGRESS.value}
    assert orders() == (acquired_status, acquired_at)

    hb.wait_for_jobs()
    hb.tick()
    processed_status, processed_at = orders()
    assert processed_status == SensorStatus.PROCESSED_NEW_DATA
    assert processed_at > acquired_at
    hb.tick()
    assert orders() == (processed_status, processed_at)


def test_a_job_running_again_on_other_data_leaves_its_soft_source_processed(hb):
    """A trigger moves every row of its job to IN_PROGRESS, the row of a soft dependency with nothing
    new too; the sensor state read that as ACQUIRED_NEW_DATA, then PROCESSED_NEW_DATA with a new
    timestamp when the job ended, and a product following that source saw new data that never came."""
    def states() -> dict[str, tuple[str, str]]:
        return _sensor_states(hb, "sales.orders", "sales.prices")

    hb.create_table("sales.orders", "id bigint")
    hb.create_table("sales.prices", "id bigint")
    hb.jobs(J1=0)
    hb.seed(row("delta_table", "sales.orders", "J1"), row("delta_table", "sales.prices", "J1", hard="FALSE"))
    hb.tick()
    hb.insert("sales.orders", "(1)")
    hb.insert("sales.prices", "(1)")
    assert hb.tick().triggered_job_ids == ["J1"]
    hb.wait_for_jobs()
    hb.tick()
    processed = states()
    assert {status for status, _ in processed.values()} == {SensorStatus.PROCESSED_NEW_DATA}

    hb.insert("sales.orders", "(2)")  # only the hard source moves: J1 runs again, prices unchanged
    assert hb.tick().triggered_job_ids == ["J1"]
    assert hb.job_status("J1") == {JobStatus.IN_PROGRESS.value}
    running = states()
    assert running["sales.orders"][0] == SensorStatus.ACQUIRED_NEW_DATA
    assert running["sales.prices"] == processed["sales.prices"]
    hb.wait_for_jobs()
    hb.tick()
    assert states()["sales.prices"] == processed["sales.prices"]

    hb.insert("sales.orders", "(3)")
    assert hb.tick().triggered_job_ids == ["J1"]
    hb.insert("sales.prices", "(2)")  # new prices while J1 runs: sensed once it ended, then waiting for a run
    hb.wait_for_jobs()
    hb.tick()
    assert states()["sales.prices"][0] == SensorStatus.ACQUIRED_NEW_DATA
    assert states()["sales.prices"][1] > processed["sales.prices"][1]

