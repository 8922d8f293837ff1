"""A local Apache Spark 4 with Delta Lake 4: the JVM inside the PySpark distribution.

Two shapes, the two ways production runs the runner:

* :func:`open_classic_session` - a classic SparkSession in this process (py4j + a JVM child),
  like the driver of a Databricks job cluster;
* :class:`SparkConnectProcess` - a Spark Connect server in its own JVM, reached through
  ``sc://127.0.0.1:PORT`` (``SPARK_REMOTE``), like serverless and shared clusters.

Both start their JVM with the same settings (:func:`session_confs`), with the driver heap the caller
gives (HEARTBEAT_SPARK_DRIVER_MEMORY, default chosen from the machine by core.settings): Delta's (:func:`delta_confs`),
the Delta SQL extension and catalog, a Hive (Derby) metastore and the warehouse under one
lakehouse folder, so the catalog outlives the JVM (unlike Sail's in-memory one); and the local
file system's (:func:`file_system_confs`). Derby's embedded metastore admits
one JVM at a time: a classic session and a Connect server must not share a lakehouse at once.

Invariants: every JVM started here is stopped by the matching close/stop (and at interpreter
exit), so no JVM outlives its owner; Spark binds only to 127.0.0.1.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import socket
import subprocess
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, cast

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.engines import engine_errors, spark_share
from heartbeat_runner.engines.spark_jars import (
    FILE_SYSTEM_CLASS,
    delta_connect_available,
    local_file_system_jar,
    spark_jars,
)

if TYPE_CHECKING:  # pragma: no cover
    from pyspark.sql import SparkSession
    from pyspark.sql.connect.session import SparkSession as ConnectSession

log = logging.getLogger(__name__)

#: Delta's Spark Connect plugins (io.delta:delta-connect-server); they serve delta-spark's DeltaTable API
DELTA_RELATION_PLUGIN = "org.apache.spark.sql.connect.delta.DeltaRelationPlugin"
DELTA_COMMAND_PLUGIN = "org.apache.spark.sql.connect.delta.DeltaCommandPlugin"
CONNECT_SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
#: Spark's driver plugin that serves Spark Connect from a classic session's JVM (spark-connect ships in PySpark)
CONNECT_PLUGIN = "org.apache.spark.sql.connect.SparkConnectPlugin"
#: seconds a Connect server may take to accept connections (measured: ~10-20 s on 2 cores)
CONNECT_START_TIMEOUT_S = 180.0
#: seconds a stopping JVM gets before it is killed
STOP_GRACE_S = 20.0
#: the JVM's garbage collector. Java's default (G1) collects concurrently with the program: on a local
#: engine it took 26 s of CPU in six busy ticks, competing for the machine's cores with the tick itself.
#: The parallel collector stops the program for short young collections instead: 7 s of CPU. Measured,
#: 100 sensors, classic, one process of each in turn, busy ticks with triggers: 10.21, 10.84, 9.73,
#: 10.37 s with G1, 8.20, 8.36, 7.84, 7.76 s with the parallel collector (the serial one: 8.0-12.2 s);
#: a second round 9.45-10.33 s against 8.97-9.78 s (docs/engines.md)
GARBAGE_COLLECTOR = "-XX:+UseParallelGC"
#: a JVM whose heap runs out stops at once, with exit code 3 (and "Terminating due to
#: java.lang.OutOfMemoryError" on its stderr), wherever the error was thrown: not a half-alive driver,
#: nor Spark's own exit (52) after its threads have failed in turn. Cheap: it writes nothing. A heap
#: dump (-XX:+HeapDumpOnOutOfMemoryError) would write the whole heap, up to 8g, and a class histogram
#: cannot be asked of an exited JVM; the exit code lets out_of_memory_death tell the user which
#: setting to raise (engine_errors.DriverOutOfMemoryError)
EXIT_ON_OUT_OF_MEMORY = "-XX:+ExitOnOutOfMemoryError"
#: the exit codes of a JVM that ran out of heap: HotSpot's with ExitOnOutOfMemoryError, Spark's own (SparkExitCode.OOM)
OUT_OF_MEMORY_EXIT_CODES = (3, 52)
#: seconds to wait for a JVM to be seen exited after a call to it lost its connection: its sockets close a
#: moment before the process is reapable, and a caller that fails in between must still learn the exit code
EXIT_WAIT_S = 10.0
#: commits between two Delta checkpoints of the tables a local session creates (Delta's default: 10)
CHECKPOINT_INTERVAL = 100


class SparkStartError(HeartbeatError):
    """A local Spark JVM did not come up; the message carries the end of its log."""


#: the JVM's logging: Spark's console default at WARN, without the warnings it repeats at every statement
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


#: the driver heap when the caller names none (the settings choose one from the machine)
DEFAULT_DRIVER_MEMORY = "1g"


def delta_confs(lakehouse_dir: Path, *, cores: int = 2, driver_memory: str = DEFAULT_DRIVER_MEMORY) -> dict[str, str]:
    """Spark settings for Delta on a local lakehouse; the same for both shapes.

    Tables created without LOCATION land in ``<lakehouse>/warehouse/<schema>.db/<table>``;
    the metastore is ``<lakehouse>/metastore_db`` (Derby, created on first use).
    """
    lakehouse = Path(lakehouse_dir).resolve()
    metastore = lakehouse / "metastore_db"
    java_options = (f"-Dderby.system.home={lakehouse} -Duser.timezone=UTC -Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
                    f" {GARBAGE_COLLECTOR} {EXIT_ON_OUT_OF_MEMORY}")
    return {
        "spark.master": f"local[{cores}]",
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.catalogImplementation": "hive",
        # as on Databricks: CREATE TABLE / saveAsTable without a format make Delta tables, not parquet
        "spark.sql.sources.default": "delta",
        "spark.sql.warehouse.dir": str(lakehouse / "warehouse"),
        "spark.hadoop.javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={metastore};create=true",
        "spark.driver.extraJavaOptions": java_options,
        "spark.sql.session.timeZone": "UTC",
        # Heartbeat's tables are small: one shuffle partition and no adaptive re-planning make the
        # control model's build ~2x faster here (measured: 6.5 s -> 2.5 s for its SELECT)
        "spark.sql.shuffle.partitions": "1",
        "spark.sql.adaptive.enabled": "false",
        "spark.default.parallelism": str(cores),
        "spark.databricks.delta.snapshotPartitions": "1",
        # ...and a few hundred rows per query: compiling generated Java for every operator and expression
        # costs more than it saves, so evaluate them interpreted (Spark's own tests run every expression
        # both ways). Measured, 100 sensors, classic, one process alternating: a busy tick 23-25 s -> 15-17 s
        # (the control build 5.9-7.3 s -> 4.1-5.2 s)
        "spark.sql.codegen.wholeStage": "false",
        "spark.sql.codegen.factoryMode": "NO_CODEGEN",
        # Heartbeat's tables are small and compacted: per-column statistics (min/max for skipping files
        # in reads) would skip little, and collecting them cost ~0.1 s of every write (an append of 10
        # rows 0.66 -> 0.54 s, one process alternating). The tables this session creates collect the row
        # count only, which MERGE checks its work against (without any statistics it warns at every MERGE)
        "spark.databricks.delta.properties.defaults.dataSkippingNumIndexedCols": "0",
        # ...and joins of small relations: a broadcast is a Spark job of its own (collect, then send), where
        # a sort-merge join over one shuffle partition is a stage of the query's job. Measured, 100 sensors,
        # classic, one process alternating 6x: the control build 2.37 -> 2.00 s, the ready rows 0.79 -> 0.70 s,
        # the sensor plan 0.55 -> 0.40 s (medians)
        "spark.sql.autoBroadcastJoinThreshold": "-1",
        # MERGE sources here are deterministic reads of Delta tables: no need to copy them first
        "spark.databricks.delta.merge.materializeSource": "none",
        # A commit whose version is a multiple of a table's checkpoint interval writes a checkpoint before it
        # returns: 1-1.5 s, and ~0.6 s more on the next read (Delta's default interval is 10). A busy tick
        # makes eight commits, so with the default about every other busy tick paid for one. The tables
        # this session creates checkpoint every 100th commit. Measured, 100 sensors, classic, two runs of
        # each in turn, 4 busy ticks with triggers each: 11.70 s -> 9.92 s (means of 8)
        "spark.databricks.delta.properties.defaults.checkpointInterval": str(CHECKPOINT_INTERVAL),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.driver.memory": driver_memory,
        # maintenance's retention (hours, HEARTBEAT_VACUUM_RETENTION_HOURS) applies as on the embedded engine
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
    }


def file_system_confs(jar: Path | None) -> dict[str, str]:
    """Hadoop's local file system for Spark: Heartbeat's from ``jar`` (no child process per file created
    or renamed, see spark/src/main/java), else Hadoop's raw one. Either way no checksum side files
    (``.name.crc``, a second file and its own child processes per file): Delta checks its log itself.
    Measured, 100 sensors, classic, two processes of each alternating: a busy tick that triggers
    11.95 -> 10.07 s (mean of 4), the Spark JVM's child processes ~250 -> 0 per tick."""
    if jar is None:
        return {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
                "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs"}
    return {"spark.driver.extraClassPath": str(jar),  # Hadoop loads file systems with the JVM's class path
            "spark.hadoop.fs.file.impl": FILE_SYSTEM_CLASS,
            "spark.hadoop.fs.AbstractFileSystem.file.impl": f"{FILE_SYSTEM_CLASS}$Context"}


def session_confs(lakehouse_dir: Path, driver_memory: str = DEFAULT_DRIVER_MEMORY) -> dict[str, str]:
    """Everything a local Spark JVM starts with here, in both shapes: Delta's and the file system's."""
    return {**delta_confs(lakehouse_dir, driver_memory=driver_memory), **file_system_confs(local_file_system_jar())}


# -- classic session ----------------------------------------------------------------------------


def open_classic_session(lakehouse_dir: Path, *, jars: Iterable[Path] | None = None,
                         app_name: str = "heartbeat", connect_port: int | None = None,
                         driver_memory: str = DEFAULT_DRIVER_MEMORY) -> SparkSession:
    """A classic (py4j) SparkSession with Delta on ``lakehouse_dir``, in a fresh JVM.

    ``driver_memory``: the JVM's heap (``spark.driver.memory``, e.g. ``2g``).
    ``connect_port``: the JVM also serves Spark Connect on ``127.0.0.1:<port>`` (Spark's own
    ``SparkConnectPlugin``), so other processes can use this engine instead of starting theirs.
    Raises when this process already has a SparkContext (its JVM settings could not apply)
    or when ``SPARK_REMOTE`` is set (PySpark would build a Connect session instead).
    Close it with :func:`stop_classic_session`.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if os.environ.get("SPARK_REMOTE") or os.environ.get("SPARK_CONNECT_MODE_ENABLED"):
        raise SparkStartError("a classic session cannot start while SPARK_REMOTE is set (it would be a Connect one)")
    if SparkContext._active_spark_context is not None:
        raise SparkStartError("this process already runs a SparkContext: stop it first (stop_classic_session)")
    Path(lakehouse_dir).mkdir(parents=True, exist_ok=True)
    builder = SparkSession.builder.appName(app_name)
    for key, value in session_confs(lakehouse_dir, driver_memory).items():
        builder = builder.config(key, value)
    jar_list = list(spark_jars() if jars is None else jars)
    builder = builder.config("spark.jars", ",".join(str(j) for j in jar_list))
    if connect_port is not None:
        for key, value in {"spark.plugins": CONNECT_PLUGIN, **connect_binding(connect_port)}.items():
            builder = builder.config(key, value)
    with _keeping_sigint_handler():
        spark = builder.enableHiveSupport().getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    atexit.register(stop_classic_session, spark)
    return spark


@contextlib.contextmanager
def _keeping_sigint_handler() -> Iterator[None]:
    """Put the main thread's SIGINT handler back after PySpark's SparkContext replaced it with its own (which
    cancels every Spark job and raises KeyboardInterrupt wherever the runner is): Ctrl-C on ``run --loop`` must
    reach the loop's handler (core/stopping.py: finish the tick, exit 0). The JVM itself ignores SIGINT
    (PySpark starts it so), so the engine outlives a Ctrl-C to the whole process group."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.getsignal(signal.SIGINT)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)


def stop_classic_session(spark: SparkSession) -> None:
    """Stop the session and the py4j JVM behind it (idempotent); the next session starts a new JVM.

    PySpark keeps its gateway JVM alive after ``spark.stop()``; the JVM exits when its stdin
    closes, so that is closed and the process awaited (killed after STOP_GRACE_S). A JVM that has
    exited already (out of heap) is only forgotten: PySpark's stop would fail talking to it.
    """
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    if getattr(spark, "_heartbeat_stopped", False):
        return
    setattr(spark, "_heartbeat_stopped", True)  # noqa: B010 - a marker on a foreign object
    if classic_jvm_exit_code() is None:
        try:
            spark.stop()
        except Exception:
            if classic_jvm_exit_code(wait=True) is None:
                raise
    if classic_jvm_exit_code() is not None:  # PySpark's stop could not reach it: forget it here
        SparkContext._active_spark_context = None
        SparkSession._instantiatedSession = None
        SparkSession._activeSession = None
    gateway = SparkContext._gateway
    if gateway is None:
        return
    proc = getattr(gateway, "proc", None)
    try:
        gateway.shutdown()
    except Exception:  # noqa: BLE001 - the JVM may be gone already
        pass
    if proc is not None:
        _close_quietly(proc.stdin)
        _wait_or_kill(proc, process_group=False)
    SparkContext._gateway = None
    SparkContext._jvm = None


def classic_jvm_exit_code(wait: bool = False) -> int | None:
    """The exit code of this process's py4j JVM when it has exited, None while it runs (or there is none).
    ``wait``: a call to it has just lost its connection, so give it EXIT_WAIT_S to be seen exited."""
    from pyspark import SparkContext

    proc = getattr(SparkContext._gateway, "proc", None)
    return None if proc is None else exit_code_of(proc, wait=wait)


def exit_code_of(proc: subprocess.Popen, *, wait: bool = False) -> int | None:
    """``proc``'s exit code once it has exited; None while it runs. ``wait``: the caller's connection to it
    broke, so it is exiting or gone: awaited up to EXIT_WAIT_S, since a process's sockets close a moment
    before its exit code can be read (a process that lives on costs that wait, once)."""
    code = proc.poll()
    if code is not None or not wait:
        return code
    try:
        return proc.wait(timeout=EXIT_WAIT_S)
    except subprocess.TimeoutExpired:
        return None


def _close_quietly(stream) -> None:
    try:
        if stream is not None:
            stream.close()
    except OSError:
        pass


# -- Spark Connect server ------------------------------------------------------------------------


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@dataclass
class SparkConnectProcess:
    """A Spark Connect server with Delta in a child JVM (``spark-submit`` from the PySpark distribution).

    ``delta_connect``: add Delta's Connect plugins (True: required, None: when Maven has them).
    Use as a context manager, or call :meth:`start` / :meth:`stop`. Its log is
    ``<lakehouse>/spark-connect/server.log``. ``driver_memory``: the server JVM's heap.
    """

    lakehouse_dir: Path
    port: int = 0
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    delta_connect: bool | None = None
    extra_confs: dict[str, str] = field(default_factory=dict)
    _proc: subprocess.Popen | None = field(default=None, repr=False)
    plugins_loaded: bool = False
    #: the server JVM's exit code once it exited by itself (None while it runs, or after stop)
    exit_code: int | None = None

    @property
    def url(self) -> str:
        return f"sc://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return Path(self.lakehouse_dir) / "spark-connect" / "server.log"

    def start(self, timeout_s: float = CONNECT_START_TIMEOUT_S) -> str:
        """Start the JVM and wait until it accepts connections; return the ``sc://`` URL."""
        if self._proc is not None:
            return self.url
        self.port = self.port or free_port()
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        command = self._command()
        with open(self.log_path, "ab") as log_file:
            self._proc = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, start_new_session=True,
                                          env=_server_env())
        atexit.register(self.stop)
        try:
            self._wait_ready(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self) -> None:
        """Stop the server JVM (SIGTERM to its process group, SIGKILL after STOP_GRACE_S); idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            _wait_or_kill(proc, process_group=True)

    def exited(self, wait: bool = False) -> int | None:
        """The server's exit code when its JVM has exited while running (not stopped here); else None.
        ``wait``: a call to it has just lost its connection (see exit_code_of)."""
        if self._proc is not None and self.exit_code is None:
            self.exit_code = exit_code_of(self._proc, wait=wait)
        return self.exit_code

    def __enter__(self) -> SparkConnectProcess:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _command(self) -> list[str]:
        import pyspark

        spark_home = Path(pyspark.__file__).parent
        want_plugin = self.delta_connect if self.delta_connect is not None else delta_connect_available()
        jars = spark_jars(delta_connect=bool(want_plugin))
        self.plugins_loaded = bool(want_plugin)
        confs = {**session_confs(self.lakehouse_dir, self.driver_memory), **self._connect_confs(), **self.extra_confs}
        command = [str(spark_home / "bin" / "spark-submit"), "--class", CONNECT_SERVER_CLASS,
                   "--name", "heartbeat-spark-connect", "--jars", ",".join(str(j) for j in jars)]
        for key, value in confs.items():
            command += ["--conf", f"{key}={value}"]
        return command + ["spark-internal"]

    def _connect_confs(self) -> dict[str, str]:
        confs = {"spark.log.level": "WARN", **connect_binding(self.port)}
        if self.plugins_loaded:
            confs["spark.connect.extensions.relation.classes"] = DELTA_RELATION_PLUGIN
            confs["spark.connect.extensions.command.classes"] = DELTA_COMMAND_PLUGIN
        return confs

    def _wait_ready(self, timeout_s: float) -> None:
        proc = self._proc
        if proc is None:
            raise SparkStartError("the Spark Connect server was not started")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise SparkStartError(f"Spark Connect server exited with {proc.returncode}:\n{self._log_tail()}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1):
                    return
            except OSError:
                time.sleep(0.25)
        raise SparkStartError(f"Spark Connect server not listening after {timeout_s:.0f}s:\n{self._log_tail()}")

    def _log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def connect_binding(port: int) -> dict[str, str]:
    """Spark Connect listens on loopback only."""
    return {"spark.connect.grpc.binding.address": "127.0.0.1", "spark.connect.grpc.binding.port": str(port)}


def _server_env() -> dict[str, str]:
    """The server's environment: ours, minus what would make spark-submit act as a client."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED",
                                                           "PYSPARK_SUBMIT_ARGS")}
    env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def _wait_or_kill(proc: subprocess.Popen, *, process_group: bool) -> None:
    """Ask ``proc`` (and its group) to end, then wait; kill what is left after STOP_GRACE_S."""
    def send(sig: int) -> None:
        try:
            if process_group:
                os.killpg(proc.pid, sig)
            elif sig != signal.SIGTERM:
                proc.send_signal(sig)
        except ProcessLookupError:
            pass

    send(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        log.warning("Spark JVM %s did not stop in %.0fs; killing it", proc.pid, STOP_GRACE_S)
        send(signal.SIGKILL)
        proc.wait(timeout=STOP_GRACE_S)


# -- one local Spark per lakehouse (the spark-local target) ---------------------------------------

#: the two shapes of the ``spark-local`` target (HEARTBEAT_SPARK_MODE)
SPARK_MODES = ("classic", "connect")
#: seconds a process waits for the engine another process is starting (its JVM start, then the address)
JOIN_TIMEOUT_S = CONNECT_START_TIMEOUT_S + 60.0


@dataclass
class LocalSpark:
    """A running local Spark + Delta: its session, and whether delta-spark's DeltaTable API works.

    ``shared``: this process joined the engine another process holds (a Spark Connect session
    to it); otherwise this process holds the engine and serves it to others at ``url``.
    """

    mode: str
    spark_dir: Path
    spark: SparkSession
    delta_table_api: bool
    url: str | None = None
    shared: bool = False
    #: the heap this process's JVM started with (a joined engine runs with its holder's)
    driver_memory: str = DEFAULT_DRIVER_MEMORY
    #: the exit code of the JVM this process holds once it has exited, None while it runs (joined: always None);
    #: its argument: wait a moment for a JVM whose connection just broke (exit_code_of)
    jvm_exit_code: Callable[[bool], int | None] = field(default=lambda wait: None, repr=False)
    _stop: Callable[[], None] | None = field(default=None, repr=False)

    @property
    def is_connect_session(self) -> bool:
        return self.shared or self.mode == "connect"

    def stop(self) -> None:
        stop, self._stop = self._stop, None
        if stop is not None:
            stop()


_running: LocalSpark | None = None


def local_spark(spark_dir: Path, mode: str, driver_memory: str = DEFAULT_DRIVER_MEMORY) -> LocalSpark:
    """The local Spark for ``spark_dir`` in ``mode``: this process's, or the one another process holds.

    A JVM takes 10-40 s to start and holds the Derby metastore of ``spark_dir``, so one JVM serves a
    lakehouse (spark_share): the first process to open it starts it, serves Spark Connect from it and
    keeps it until it exits; a process that finds it held connects to it (whatever its mode). Within
    a process every engine on the same ``spark_dir`` and mode shares it; asking for another one stops
    the running one first. ``driver_memory`` is the heap of a JVM started here (a running or joined one
    keeps the heap it has). A classic session drops ``SPARK_REMOTE`` from this process's environment
    (dbt-spark must find the classic session); a Connect session points it at the server.
    """
    global _running
    if mode not in SPARK_MODES:
        raise ValueError(f"HEARTBEAT_SPARK_MODE {mode!r} is not one of {', '.join(SPARK_MODES)}")
    spark_dir = Path(spark_dir).resolve()
    if _running is not None and (_running.spark_dir, _running.mode) == (spark_dir, mode):
        if _running.is_connect_session and _running.url:
            os.environ["SPARK_REMOTE"] = _running.url
            make_default_connect_session(_running.spark)
        else:
            _leave_connect_mode()
        return _running
    stop_local_spark()
    _running = _hold_or_join(spark_dir, mode, driver_memory)
    atexit.register(stop_local_spark)
    return _running


def _hold_or_join(spark_dir: Path, mode: str, driver_memory: str) -> LocalSpark:
    """Start and hold ``spark_dir``'s engine, or join the process that holds it (waiting while it starts)."""
    deadline = time.monotonic() + JOIN_TIMEOUT_S
    announced = False
    with contextlib.ExitStack() as waiting:
        while True:
            handle = spark_share.try_hold(spark_dir)
            if handle is not None:
                return _hold(spark_dir, mode, handle, driver_memory)
            address = spark_share.holder_address(spark_dir)
            if address is not None:
                return _join(spark_dir, mode, address)
            if not announced:  # the holder is still starting its JVM
                announced = True
                waiting.enter_context(spark_share.notice(
                    f"Waiting for the Spark engine another process is starting on {spark_dir}"))
            if time.monotonic() > deadline:
                raise SparkStartError(f"another process holds {spark_dir / spark_share.LOCK_FILE} but serves no "
                                      f"Spark Connect address after {JOIN_TIMEOUT_S:.0f} s")
            time.sleep(0.5)


def _hold(spark_dir: Path, mode: str, handle: IO[str], driver_memory: str) -> LocalSpark:
    """Start the JVM for ``spark_dir`` and publish its Spark Connect address; let the lock go if it fails."""
    try:
        with spark_share.notice(f"Starting Apache Spark + Delta ({mode}, driver heap {driver_memory}) for "
                                f"{spark_dir}; a JVM start takes 10-40 s"):
            running = (_start_classic(spark_dir, driver_memory) if mode == "classic"
                       else _start_connect(spark_dir, driver_memory))
    except BaseException:
        handle.close()
        raise
    spark_share.publish(spark_dir, spark_share.EngineAddress(pid=os.getpid(), url=str(running.url), mode=mode))
    stop_engine = running._stop

    def stop() -> None:
        """Withdraw the address, stop the JVM, and only then let the lock go: the next holder's JVM
        must not meet this one's Derby lock."""
        try:
            spark_share.withdraw(spark_dir)
            if stop_engine is not None:
                stop_engine()
        finally:
            handle.close()

    running._stop = stop
    return running


def _join(spark_dir: Path, mode: str, address: spark_share.EngineAddress) -> LocalSpark:
    """A Spark Connect session on the engine another process holds: no JVM of our own."""
    spark = _connect_session(address.url)
    log.info("joined the Spark engine of process %d at %s", address.pid, address.url)
    return LocalSpark(mode, spark_dir, spark, delta_table_api=False, url=address.url, shared=True,
                      _stop=spark.stop)


def _connect_session(url: str) -> SparkSession:
    """A Spark Connect session to ``url``, the one dbt-spark's ``session`` method will find.

    dbt-spark asks for ``enableHiveSupport()`` at every statement; over Spark Connect that sets the
    static ``spark.sql.catalogImplementation`` on a running session, which the server refuses with a
    CANNOT_MODIFY_CONFIG warning per statement although the value is already ``hive``: not shown.

    Executions are not reattachable. A reattachable one ends with the client releasing it (an
    asynchronous ReleaseExecute) as soon as the last result arrives, without waiting for the end of
    the stream; when that release reaches the server before its sender has closed the stream, the
    server logs ``ERROR ErrorUtils: Spark Connect RPC error during: async-grpc-response-sender``
    (INVALID_CURSOR.DISCONNECTED): a harmless race in Spark that reads as a failure in the log, seen
    about once in twenty short-lived clients here. Reattaching serves long streams over flaky
    networks; this server is on loopback, and a plain execution is read to its end.
    """
    from pyspark.sql import SparkSession

    warnings.filterwarnings("ignore", message=r"(?s).*CANNOT_MODIFY_CONFIG.*spark\.sql\.catalogImplementation",
                            category=UserWarning)
    os.environ["SPARK_REMOTE"] = url
    spark = SparkSession.builder.remote(url).create()
    cast("ConnectSession", spark).client.disable_reattachable_execute()
    make_default_connect_session(spark)
    return spark


def out_of_memory_death(connection_lost: bool = False) -> engine_errors.DriverOutOfMemoryError | None:
    """The error of this process's local Spark JVM when it exited for want of heap (its exit code, see
    EXIT_ON_OUT_OF_MEMORY), naming the heap it had; None while it runs or when none is held here.
    A probe of engine_errors: a failure after that death becomes this error. ``connection_lost``: the
    failure broke the connection to the JVM, so it may still be exiting: wait for it (exit_code_of)."""
    running = _running
    if running is None or running.shared:
        return None
    code = running.jvm_exit_code(connection_lost)
    if code not in OUT_OF_MEMORY_EXIT_CODES:
        return None
    return engine_errors.DriverOutOfMemoryError(running.driver_memory)


engine_errors.register_death_probe(out_of_memory_death)


def stop_local_spark() -> None:
    """Stop the process's local Spark, if one runs (idempotent)."""
    global _running
    running, _running = _running, None
    if running is not None:
        running.stop()


def make_default_connect_session(spark: SparkSession) -> None:
    """Make ``spark`` (a Spark Connect session) the one ``SparkSession.builder.getOrCreate()`` returns,
    as dbt-spark's ``session`` method calls it. ``builder.remote(url).create()`` becomes the default
    only when none is set yet, so two engines in one process would otherwise share the first one.
    Also keeps the clients of the process from breaking each other (keep_connect_release_pool)."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    keep_connect_release_pool()

    # builder.remote(url).create() returns a Spark Connect session that pyspark types (by its own cast) as classic.
    session = cast(ConnectSession, spark)
    with ConnectSession._lock:
        ConnectSession._default_session = session
    ConnectSession._active_session.session = session


def _leave_connect_mode() -> None:
    """PySpark decides classic vs Connect from the environment: a Connect session (the embedded
    engine's) leaves SPARK_REMOTE and SPARK_CONNECT_MODE_ENABLED behind."""
    os.environ.pop("SPARK_REMOTE", None)
    os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)


def _start_classic(spark_dir: Path, driver_memory: str) -> LocalSpark:
    _leave_connect_mode()
    port = free_port()
    spark = open_classic_session(spark_dir, connect_port=port, driver_memory=driver_memory)
    return LocalSpark("classic", spark_dir, spark, delta_table_api=True, url=f"sc://127.0.0.1:{port}",
                      driver_memory=driver_memory, jvm_exit_code=classic_jvm_exit_code,
                      _stop=lambda: stop_classic_session(spark))


def _start_connect(spark_dir: Path, driver_memory: str) -> LocalSpark:
    server = SparkConnectProcess(spark_dir, driver_memory=driver_memory)
    url = server.start()
    spark = _connect_session(url)

    def stop() -> None:
        try:
            spark.stop()
        finally:
            server.stop()

    return LocalSpark("connect", spark_dir, spark, delta_table_api=server.plugins_loaded, url=url,
                      driver_memory=driver_memory, jvm_exit_code=server.exited, _stop=stop)


def keep_connect_release_pool() -> None:
    """Stop closing one Spark Connect client from breaking every other client of the process (PySpark 4.0).

    All Connect clients of a process share one class-level thread pool that releases finished
    operations (``ExecutePlanResponseReattachableIterator``), and ``SparkConnectClient.close`` shuts
    it down for all of them, also when it runs from ``SparkSession.__del__``: a session dropped by an
    engine recycle, a test or the status page is closed by the garbage collector at any moment, on
    any thread. Seen here: another client's next query fails with "cannot schedule new futures after
    shutdown" (dbt builds then fail in a row), and a collection that ran inside gRPC's channel lock
    waited for the pool's threads, which waited for that lock: the tick hung for good.

    After this the shared pool is never shut down: a release for a closed channel fails in its pool
    thread and is logged by PySpark at WARN; the pool's few threads live as long as the process.
    A release still in flight when the engine's server stops gets a response cut short, which gRPC's
    deserializer logs at ERROR with a traceback on stderr (seen on ``explain --json | head -1``, whose
    command ends at once). That logger's (``grpc._common``) records are demoted to DEBUG: a call whose
    response cannot be read still raises to its caller, so the everyday output loses only the lines of
    fire-and-forget releases, and ``--log-level debug`` (or a test run at the DEBUG log level) shows why a
    response could not be read. Idempotent; without a Connect client installed, nothing to do."""
    try:
        from pyspark.sql.connect.client.reattach import ExecutePlanResponseReattachableIterator as Iterator
    except ImportError:
        return
    Iterator.shutdown = classmethod(_keep_pool)  # type: ignore[method-assign,assignment]
    grpc_log = logging.getLogger("grpc._common")
    if not any(isinstance(f, DemoteToDebug) for f in grpc_log.filters):
        grpc_log.addFilter(DemoteToDebug())


class DemoteToDebug(logging.Filter):
    """A logger's records at DEBUG, whatever level they were made at, and only where its logger is enabled for
    DEBUG (a handler checks its own level only: the root's usually has none). See keep_connect_release_pool."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.levelno, record.levelname = logging.DEBUG, logging.getLevelName(logging.DEBUG)
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


def _keep_pool(cls: type) -> None:
    """The shared release pool stays up (see keep_connect_release_pool)."""
