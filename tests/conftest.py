import json
import os
import shutil
import sys
from datetime import datetime, timezone
from importlib.util import find_spec
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")
# pytest-xdist's workers get COLUMNS=80 and LINES=24: the CLI run by a test would then fit its output to 80
# columns, as it does for a user who sets COLUMNS. The tests that mean it set COLUMNS themselves.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)
# dbt's saved parse of the project is kept for every new lakehouse of this run (lakehouse/dbt_invoke.py): a new
# lakehouse's first dbt call then parses in ~0.1 s rather than ~1.5 s. Set once by the first process of the run
# (pytest-xdist's workers inherit it); tests/test_dbt_parse_cache.py checks what it changes and what it must not.
if "HEARTBEAT_DBT_PARSE_CACHE" not in os.environ:
    import tempfile

    os.environ["HEARTBEAT_DBT_PARSE_CACHE"] = tempfile.mkdtemp(prefix="heartbeat-dbt-parse-")

from harness import ENGINES, Harness  # noqa: E402

#: Apache Spark + Delta can run here: Java, Maven (first jar resolution) and the spark extra
SPARK_AVAILABLE = bool(shutil.which("java") and shutil.which("mvn") and find_spec("delta") is not None)
#: The switch for the test matrix (README "Development"). Unset, ``pytest`` is the fast loop for people working
#: on the code: the embedded engine only, without the tests marked ``slow`` (crash matrices, soaks, runs of
#: several processes, and scenarios of more than about 13 CPU-s: tests/README.md, "How to add a test"). ``HEARTBEAT_TEST_MATRIX=sail`` runs every test on the embedded engine, the slow ones
#: too; ``=spark`` runs only the Spark legs (every behavioural test on Spark classic and Spark Connect, and the
#: Spark-only tests); ``=full`` runs all of it in one process. ``.ci/run`` runs ``sail``, then ``spark`` in a
#: process of its own (one process cannot hold a classic Spark session and later a Connect one, so the
#: Spark legs stay out of the loop's workers).
MATRIX = os.environ.get("HEARTBEAT_TEST_MATRIX", "").strip().lower()
if MATRIX not in ("", "sail", "full", "spark", "databricks"):
    raise pytest.UsageError(f"HEARTBEAT_TEST_MATRIX={MATRIX!r}: expected sail, spark, databricks or full "
                            "(or unset: the fast loop on the embedded engine)")
FULL_MATRIX = MATRIX in ("full", "spark", "databricks")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """The Spark legs run in one process, in engine order (see _ENGINE_ORDER): with the matrix switched
    on, the workers of ``-n auto`` (addopts) are switched off."""
    if FULL_MATRIX and getattr(config.option, "dist", "no") != "no":
        config.option.dist, config.option.numprocesses = "no", 0


#: workers of ``-n auto`` per core: a test spends about a quarter of its time waiting on the processes it
#: starts (the engine's child, jobs, runners) and on its pauses, so one worker per core left ~27% of two cores
#: idle (user+sys 8.6 of 11.7 core-minutes); three workers on two cores ran the same 100 tests in 388 s, not
#: 440 s (tests/README.md, "Where the time goes")
EXTRA_WORKERS = 1


def pytest_xdist_auto_num_workers(config):
    """``-n auto``: one worker per core and :data:`EXTRA_WORKERS` more (``-n N`` still names any number)."""
    return (os.cpu_count() or 1) + EXTRA_WORKERS


def pytest_generate_tests(metafunc):
    """Tests marked ``engines`` that use ``hb`` run once per engine: embedded Sail, then Apache Spark +
    Delta classic and Spark Connect when the spark extra is installed (``engines("sail", "spark-classic")``
    names a subset; HEARTBEAT_TEST_ENGINES=sail,spark-classic narrows a run). The engine is a session-scoped
    parameter, so pytest groups the tests by engine and each Spark JVM starts once per session."""
    marker = metafunc.definition.get_closest_marker("engines")
    if "engine_kind" in metafunc.fixturenames and marker:
        wanted = marker.args or ENGINES
        kinds = [kind for kind in ENGINES if kind in wanted and (kind == "sail" or (SPARK_AVAILABLE and FULL_MATRIX))]
        if os.environ.get("HEARTBEAT_TEST_ENGINES"):
            kinds = [k for k in kinds if k in os.environ["HEARTBEAT_TEST_ENGINES"].split(",")]
        metafunc.parametrize("engine_kind", kinds, indirect=True, scope="session")


#: the order engines run in: a process can open Spark Connect sessions (Sail's, a Connect server's)
#: and later a classic session, but not a Connect session while a classic one runs
_ENGINE_ORDER = {"sail": 0, "spark-connect": 1, "spark-classic": 2}


#: each module's worker-seconds in the last measured embedded leg (.ci/module_seconds.py writes it)
_MODULE_SECONDS: dict[str, int] = json.loads((Path(__file__).parent / "module_seconds.json").read_text())
#: what a module not measured yet counts as: the heaviest, so it starts early
_UNMEASURED_SECONDS = max(_MODULE_SECONDS.values(), default=0)


def pytest_collection_modifyitems(config, items):
    """Sail first (every test that is not parametrised), then the Spark tests, classic last. A module
    that uses a Spark shape without the ``engine_kind`` parameter names it in ``ENGINE_KIND`` (or is
    parametrised by an ``engine`` fixture whose values are engine kinds).

    Within an engine the heaviest modules come first (``module_seconds.json``; a new module counts as heavy
    until measured): the workers take whole modules in this order (``--dist loadfile``), so the leg ends on
    short modules, not with two workers idle beside one long module that started last. A module's tests
    keep their order and stay together."""
    def rank(item) -> int:
        params = getattr(item, "callspec", None).params if hasattr(item, "callspec") else {}
        kind = params.get("engine_kind") or params.get("engine")
        return _ENGINE_ORDER.get(kind or getattr(item.module, "ENGINE_KIND", "sail"), 0)

    def heaviest_first(item) -> tuple[int, int, str]:
        name = item.path.name
        return rank(item), -_MODULE_SECONDS.get(name, _UNMEASURED_SECONDS), name

    items.sort(key=heaviest_first)
    if MATRIX == "full":
        return

    def leg(item) -> str:
        if item.get_closest_marker("databricks_runtime"):
            return "databricks"
        return "spark" if bool(item.get_closest_marker("spark")) or rank(item) > 0 else "sail"

    wanted = MATRIX or "sail"
    reason = {"sail": "a Spark test: the Spark legs run with HEARTBEAT_TEST_MATRIX=spark (or full), the "
                      "Databricks-shaped leg with HEARTBEAT_TEST_MATRIX=databricks",
              "spark": "not a Spark leg: HEARTBEAT_TEST_MATRIX=spark runs only those",
              "databricks": "not the Databricks-shaped leg"}[wanted]
    kept, dropped = [], []
    for item in items:
        (kept if leg(item) == wanted else dropped).append(item)
    if wanted != "sail":  # the other legs' tests are left out, not listed as hundreds of skips
        items[:] = kept
        config.hook.pytest_deselected(items=dropped)
        return
    for item in dropped:
        item.add_marker(pytest.mark.skip(reason=reason))
    if MATRIX == "":  # the fast loop
        slow = "slow: HEARTBEAT_TEST_MATRIX=sail runs it (CI does)"
        for item in kept:
            if item.get_closest_marker("slow"):
                item.add_marker(pytest.mark.skip(reason=slow))


@pytest.fixture(scope="module")
def template(request, tmp_path_factory):
    """The module's lakehouse, built once by its ``seeded_lakehouse(root)`` on first use and copied into each test
    that asks (``template.copy(tmp_path)``; harness.LakehouseTemplate)."""
    from harness import LakehouseTemplate

    return LakehouseTemplate(tmp_path_factory.mktemp("template"), request.module.seeded_lakehouse)


@pytest.fixture(autouse=True)
def _fresh_hybrid_clock():
    """Each test starts with this process's hybrid clock (core/records.py ``CLOCK``) as a new process has it: it
    has seen no event. A test that commits events minutes ahead (another writer's clock) pushes the clock past
    them, and a later test of the same worker would otherwise stamp, and call "now", minutes in the future."""
    from heartbeat_runner.core.records import CLOCK

    CLOCK._last = datetime.min.replace(tzinfo=timezone.utc)
    yield


@pytest.fixture(autouse=True)
def _no_dead_connect_session_left_current():
    """A test leaves no Spark Connect session current whose server is gone (tests/connect_sessions.py: a later
    test's first column function would retry against it for minutes). One that does fails here, naming it, and
    the session is taken out of its slot so the worker's next tests do not hang on it."""
    import connect_sessions

    yield
    dead = connect_sessions.dead_current()
    if dead:
        connect_sessions.forget(dead)
        pytest.fail("the test left a Spark Connect session current whose server is gone ("
                    f"{', '.join(map(connect_sessions.describe, dead))}): stop the session before its server, or "
                    "make it inside connect_sessions.set_aside()", pytrace=False)


@pytest.fixture(autouse=True)
def _no_delivery_thread_left_running():
    """A test leaves no alert or lineage delivery thread running: one left retrying a refused destination logs
    into the output of the worker's later tests (an in-process command's stderr among them). The harness stops
    the threads of the runners it made; a test that builds a runner itself closes it."""
    import threading

    from heartbeat_runner.runner.alert_delivery import ALERT_THREAD, LINEAGE_THREAD

    yield
    left = [t.name for t in threading.enumerate() if t.name in (ALERT_THREAD, LINEAGE_THREAD) and t.is_alive()]
    if left:
        pytest.fail(f"the test left delivery threads running ({', '.join(left)}): close the runner "
                    "(Heartbeat.close) or its outbox", pytrace=False)


@pytest.fixture(autouse=True)
def _cli_processes(request):
    """A test marked ``cli_processes`` runs every CLI command as a real process (tests/cli_runner.py)."""
    import cli_runner

    cli_runner.force_processes(bool(request.node.get_closest_marker("cli_processes")))
    yield
    cli_runner.force_processes(False)


@pytest.fixture(scope="session")
def engine_kind(request):
    """Which engine ``hb`` runs on (``sail`` unless the test is marked ``engines``)."""
    return getattr(request, "param", "sail")


@pytest.fixture(scope="session")
def spark_dir(tmp_path_factory):
    """One metastore and warehouse per test session for the local Spark JVMs (a JVM start is 10-20 s)."""
    return tmp_path_factory.mktemp("spark")


@pytest.fixture
def hb(tmp_path, engine_kind, spark_dir):
    """A Heartbeat on a fresh temporary lakehouse (real engine, dbt and local jobs)."""
    with Harness(tmp_path, engine=engine_kind, spark_dir=spark_dir / engine_kind) as harness:
        yield harness


@pytest.hookimpl(trylast=True)
def pytest_runtest_logreport(report):
    """With HEARTBEAT_TEST_INSTAFAIL=1 (``.ci/run`` sets it) a failure's traceback is printed when it happens,
    not in the summary at the end, so a run cut short by a time limit still shows what failed and why.
    Printed once: by the main process (under pytest-xdist the workers' reports reach it too)."""
    if not (report.failed and os.environ.get("HEARTBEAT_TEST_INSTAFAIL")) or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    shown, skipping = [], False
    for line in report.longreprtext.splitlines():  # leave out the frames of pytest and other packages
        if line.startswith("  File "):
            skipping = "/site-packages/" in line
        elif not line.startswith("    "):
            skipping = False
        if not skipping:
            shown.append(line)
    shown = shown[-60:]
    sys.stderr.write(f"\n\n==== FAILED {report.nodeid} ({report.when}, {report.duration:.1f} s)\n" + "\n".join(shown) + "\n")
    for section, text in report.sections:
        if text.strip():
            sys.stderr.write(f"---- {section}\n{text[-3000:]}\n")
    sys.stderr.flush()


@pytest.fixture
def restore_signals():
    """``run_loop`` installs SIGINT/SIGTERM handlers and, stopped by a signal, arms the shutdown watchdog:
    put pytest's handlers back and disarm it."""
    import faulthandler
    import signal

    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    faulthandler.cancel_dump_traceback_later()
    for sig, handler in saved.items():
        signal.signal(sig, handler)
