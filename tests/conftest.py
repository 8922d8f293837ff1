import os
import shutil
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("DBT_SEND_ANONYMOUS_USAGE_STATS", "false")

from harness import ENGINES, Harness  # noqa: E402

#: Apache Spark + Delta can run here: Java, Maven (first jar resolution) and the spark extra
SPARK_AVAILABLE = bool(shutil.which("java") and shutil.which("mvn") and find_spec("delta") is not None)
#: The switch for the whole engine matrix (README "Tests"): ``HEARTBEAT_TEST_MATRIX=full`` (.ci/run sets it) runs
#: every behavioural test on Sail, Spark classic and Spark Connect, and the Spark-only tests. Without it, ``pytest``
#: is the fast loop for people working on the code: the embedded engine only.
FULL_MATRIX = os.environ.get("HEARTBEAT_TEST_MATRIX", "").strip().lower() == "full"


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


def pytest_collection_modifyitems(items):
    """Sail first (every test that is not parametrised), then the Spark tests, classic last. A module
    that uses a Spark shape without the ``engine_kind`` parameter names it in ``ENGINE_KIND`` (or is
    parametrised by an ``engine`` fixture whose values are engine kinds)."""
    def rank(item) -> int:
        params = getattr(item, "callspec", None).params if hasattr(item, "callspec") else {}
        kind = params.get("engine_kind") or params.get("engine")
        return _ENGINE_ORDER.get(kind or getattr(item.module, "ENGINE_KIND", "sail"), 0)

    items.sort(key=rank)
    if not FULL_MATRIX:
        skip = pytest.mark.skip(reason="a Spark test: the whole engine matrix runs with HEARTBEAT_TEST_MATRIX=full")
        for item in items:
            if item.get_closest_marker("spark") or rank(item) > 0:
                item.add_marker(skip)


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
