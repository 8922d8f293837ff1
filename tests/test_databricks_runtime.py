"""The Databricks-shaped leg: the runner task run the way a job cluster runs a ``python_wheel_task``.

The closest thing to a workspace this machine has:

- the task environment is built as the cluster builds it: a fresh virtual environment with the runtime's
  PySpark and delta-spark, the wheel ``pip wheel`` makes of this repository (what the bundle's artifact
  build uploads), and exactly the libraries the job YAML declares; nothing else of the test environment
  (no Sail, no dbt-databricks);
- ``tests/databricks_runtime.py`` is the driver: it sets the job cluster's ``spark_env_vars``, starts a
  Spark session with Delta (local Apache Spark, a Hive metastore standing in for Unity Catalog, three-part
  names through ``spark_catalog``) and calls the wheel's entry point with the YAML's own ``parameters``;
- the workspace is the Jobs API stand-in (``databricks_jobs_server``), and the runner reaches it through
  the databricks-sdk auth chain as a cluster's job identity would (host and token in the environment, where
  a real cluster's runtime provides them).

The code paths are the ``databricks`` target's: no ``_delta_log`` listing (sensing reads the table history),
no Sail, dbt-spark on the cluster's own session.

Each test of a task environment runs on two runtimes (``RUNTIMES``): the PySpark 4.0 and Delta 4.0 this
repository develops on, and Databricks Runtime 16.4 LTS's Apache Spark 3.5 with Delta 3.3. Spark 3.5 refused the
array parameters every tick bound (tests/test_sql_parameters.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest
from bundle_rules import workspace_files
from conftest import SPARK_AVAILABLE
from databricks_jobs_server import TOKEN, JobsApiServer
from harness import HEADER
from harness import config_row as row
from test_databricks_bundle import REPO, resolved_jobs

pytestmark = [pytest.mark.databricks_runtime, pytest.mark.timeout(900),
              pytest.mark.skipif(not SPARK_AVAILABLE, reason="needs Java 17, Maven and the spark extra")]

#: where task environments are kept between runs, one per runtime (the newest wheel's dependencies)
VENVS = Path(os.environ.get("HEARTBEAT_TEST_CACHE", Path.home() / ".cache" / "heartbeat")) / "task-venvs"


@dataclass(frozen=True)
class Runtime:
    """What a job cluster's runtime provides: its PySpark and Delta (pip requirements) and Delta's jars."""

    name: str
    packages: tuple[str, ...]
    #: the Maven project whose dependencies are the Delta jars (engines/spark_jars.py resolves and caches them)
    pom: Path


#: the runtimes the leg runs on: the Spark this repository develops on, and Databricks Runtime 16.4 LTS's
#: Apache Spark 3.5 with open-source Delta 3.3 (Scala 2.12), what a team deploying today gets
RUNTIMES = (
    Runtime("spark-4.0", (f"pyspark=={version('pyspark')}", f"delta-spark=={version('delta-spark')}"),
            REPO / "spark" / "pom.xml"),
    Runtime("dbr-16.4-spark-3.5", ("pyspark==3.5.5", "delta-spark==3.3.2"),
            REPO / "tests" / "fixtures" / "runtime-spark35" / "pom.xml"),
)
#: the bundle's sync excludes these from the workspace files (databricks.yml `sync.exclude`)
#: the catalog the test workspace has: a local Spark's one catalog, named as Unity Catalog names are
CATALOG = "spark_catalog"


def build_wheel(out: Path) -> Path:
    """The wheel of this repository, built as the bundle's artifact build does (``pip wheel --no-deps``), from
    a copy of the checkout: a build in place leaves ``build/`` behind, whose stale files a later wheel takes."""
    source = out / "source"
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info",
                                                                "__pycache__", ".heartbeat*", "target", "logs"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--wheel-dir", str(out), str(source)],
                   check=True, capture_output=True)
    (wheel,) = out.glob("heartbeat_runner-*.whl")
    return wheel


def task_libraries(task: dict) -> list[str]:
    """The task's ``libraries`` other than the wheel (pypi packages, the lines of a requirements file given
    relative to resources/ as the bundle does), as pip requirements."""
    out = []
    for library in task.get("libraries", []):
        if "pypi" in library:
            out.append(library["pypi"]["package"])
        elif "requirements" in library:
            lines = (REPO / "resources" / library["requirements"]).read_text().splitlines()
            out.extend(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))
        elif "whl" not in library:
            raise AssertionError(f"library kind the leg does not install: {library}")
    return out


def task_environment(runtime: Runtime, wheel: Path, libraries: list[str]) -> Path:
    """A venv holding the runtime's packages, the wheel's dependencies and the task's libraries, kept while
    those stay the same (one per runtime); the wheel itself is installed again every time (``--no-deps``), so
    the code under test is always this checkout's."""
    import zipfile

    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = sorted(line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist"))
    key = hashlib.sha256(json.dumps([runtime.packages, libraries, requires]).encode()).hexdigest()[:16]
    home = VENVS / runtime.name / key
    python = home / "bin" / "python"
    if not (home / ".complete").exists():
        shutil.rmtree(home, ignore_errors=True)
        venv.EnvBuilder(with_pip=True).create(home)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *runtime.packages, str(wheel), *libraries],
                       check=True, capture_output=True, text=True)
        (home / ".complete").write_text(key)
        for stale in home.parent.iterdir():  # one environment per runtime at a time is enough
            if stale != home:
                shutil.rmtree(stale, ignore_errors=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--force-reinstall", str(wheel)],
                   check=True, capture_output=True, text=True)
    return python


class Workspace:
    """One test workspace: the stand-in Jobs API, the metastore and warehouse, the synced files."""

    def __init__(self, root: Path, api: JobsApiServer, python: Path, jars: list[str]):
        self.root, self.api, self.python, self.jars = root, api, python, jars
        self.files = workspace_files(REPO, root / "workspace_files")
        self.metastore = root / "cluster"
        self.metastore.mkdir()
        self.calls = 0

    def substitute(self, value: str) -> str:
        """``${workspace.*}`` as the CLI fills it at deploy."""
        for name, text in {"file_path": str(self.files), "host": self.api.host}.items():
            value = value.replace("${workspace." + name + "}", text)
        return value

    def job(self, name: str, target: str = "prod") -> dict:
        jobs = resolved_jobs(target, variables={"catalog": CATALOG})
        return jobs[name]

    def cluster_env(self, job: dict) -> dict[str, str]:
        """The job cluster's spark_env_vars, with the workspace's values and its secrets resolved; the
        cluster's local disk (``/local_disk0``) is a folder of the test's, new for every cluster."""
        (cluster,) = job["job_clusters"]
        env = {k: self.substitute(str(v)).replace("/local_disk0", str(self.root / f"local_disk0-{self.calls}"))
               for k, v in cluster["new_cluster"].get("spark_env_vars", {}).items()}
        assert not any("{{secrets/" in v for v in env.values()), "secret references need the secrets stand-in"
        return env

    def run(self, job_name: str, steps: list[dict], *, target: str = "prod") -> list[dict]:
        """One job cluster's life: start, run ``steps`` (tasks of ``job_name`` by task_key, or SQL), stop."""
        self.calls += 1
        job = self.job(job_name, target)
        tasks = {t["task_key"]: t for t in job["tasks"]}
        plan_steps = []
        for step in steps:
            if "task_key" in step:
                wheel_task = tasks[step["task_key"]]["python_wheel_task"]
                plan_steps.append({"task": {**wheel_task, "parameters": [
                    self.substitute(str(p)) for p in wheel_task["parameters"]] + step.get("extra", [])}})
            else:
                plan_steps.append(step)
        env = {
            **{k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "JAVA_HOME", "LANG", "TMPDIR")},
            **self.cluster_env(job),
            # the runtime's job identity, as the SDK's auth chain finds it on a cluster
            "DATABRICKS_HOST": self.api.host, "DATABRICKS_TOKEN": TOKEN,
            "DATABRICKS_RUNTIME_VERSION": "16.4",
            "PYSPARK_PYTHON": str(self.python),
        }
        plan = self.root / f"plan-{self.calls}.json"
        plan.write_text(json.dumps({"env": env, "root": str(self.metastore), "jars": self.jars, "steps": plan_steps}))
        done = subprocess.run([str(self.python), str(REPO / "tests" / "databricks_runtime.py"), str(plan)],
                              capture_output=True, text=True, timeout=int(os.environ.get("HEARTBEAT_TEST_TASK_TIMEOUT", "600")), cwd=self.root, env=env)
        outcomes = [json.loads(line[5:]) for line in done.stdout.splitlines() if line.startswith("STEP ")]
        self.last_output = done.stdout + done.stderr
        # the cluster's whole output is kept beside the plan, and each step's seconds shown with -s
        (self.root / f"output-{self.calls}.txt").write_text(self.last_output)
        print(f"cluster {self.calls} ({job_name}): seconds per step", [o.get("seconds") for o in outcomes])
        assert done.returncode == 0 and len(outcomes) == len(plan_steps), self.last_output[-4000:]
        return outcomes


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module", params=RUNTIMES, ids=lambda runtime: runtime.name)
def runtime(request) -> Runtime:
    return request.param


@pytest.fixture(scope="module")
def task_python(runtime, wheel):
    job = resolved_jobs("prod", variables={"catalog": CATALOG})["heartbeat_runner"]
    (task,) = [t for t in job["tasks"] if t["task_key"] == "tick"]
    return task_environment(runtime, wheel, task_libraries(task))


@pytest.fixture(scope="module")
def jars(runtime):
    from heartbeat_runner.engines.spark_jars import spark_jars

    return [str(j) for j in spark_jars(pom=runtime.pom)]


@pytest.fixture
def workspace(tmp_path, task_python, jars):
    with JobsApiServer() as api:
        yield Workspace(tmp_path, api, task_python, jars)


def test_the_task_environment_holds_what_a_cluster_holds_and_nothing_else(runtime, task_python):
    listed = subprocess.run([str(task_python), "-m", "pip", "list", "--format=json"], capture_output=True,
                            text=True, check=True)
    installed = {p["name"].lower(): p["version"] for p in json.loads(listed.stdout)}
    names = set(installed)
    assert {"heartbeat-runner", "pyspark", "delta-spark", "dbt-spark"} <= names
    assert {f"{name}=={installed[name]}" for name in ("pyspark", "delta-spark")} == set(runtime.packages)
    assert not names & {"pysail", "dbt-databricks", "databricks-connect"}, names


def sql_steps(*statements: str) -> list[dict]:
    return [{"sql": s} for s in statements]


def test_the_runner_job_seeds_ticks_and_starts_one_run_for_a_data_commit_and_none_for_optimize(workspace):
    """The issue's 'done when': seed, tick, and exactly one run for one data commit followed by an OPTIMIZE."""
    api = workspace.api
    job = api.add_job("orders_etl")
    table = f"{CATALOG}.sales.orders"
    config = workspace.files / "seeds" / "heartbeat_sensor_config.csv"
    config.write_text(HEADER + "\n" + row("delta_table", table, str(job)) + "\n")

    first = workspace.run("heartbeat_seed", [
        *sql_steps("CREATE SCHEMA IF NOT EXISTS sales",
                   f"CREATE TABLE {table} (id INT, amount DOUBLE) USING delta",
                   f"INSERT INTO {table} VALUES (1, 10.0)"),
        {"task_key": "seed"},
    ])
    assert [s.get("exit", 0) for s in first] == [0, 0, 0, 0], workspace.last_output[-3000:]
    assert all(s.get("ok", True) for s in first)

    # a new cluster for the scheduled runs: the baseline tick, a tick after a data commit and an OPTIMIZE (one
    # run, which ends as soon as it starts), then a tick after an OPTIMIZE alone (as predictive optimization
    # runs it), a property change and a comment: nothing to start. One cluster, not one per run: a cluster's
    # first tick is most of its minute and a half, and the seed cluster already hands the state across JVMs.
    api.after_call("run-now", 1, lambda: [api.finish_run(r.run_id, "SUCCESS") for r in api.runs_of(job)])
    ticks = workspace.run("heartbeat_runner", [
        {"task_key": "tick"},
        *sql_steps(f"INSERT INTO {table} VALUES (2, 20.0)", f"OPTIMIZE {table}"),
        {"task_key": "tick"},
        *sql_steps(f"OPTIMIZE {table}", f"ALTER TABLE {table} SET TBLPROPERTIES ('comment.owner' = 'sales')",
                   f"COMMENT ON TABLE {table} IS 'orders'"),
        {"task_key": "tick"},
    ])
    assert [s.get("exit", 0) for s in ticks] == [0] * 8, workspace.last_output[-3000:]
    assert all(s.get("ok", True) for s in ticks), ticks
    (run,) = api.runs_of(job)
    assert run.result == "SUCCESS", workspace.last_output[-3000:]
    # spark_catalog is a Hive metastore catalog: found without a failing query, so no ERROR from Spark each run
    assert "TABLE_OR_VIEW_NOT_FOUND" not in workspace.last_output, workspace.last_output[-3000:]
    assert "catalog look of spark_catalog failed" not in workspace.last_output  # nor a warning (INFO says it)


def test_a_seed_task_whose_config_is_broken_ends_failed(workspace):
    """The runtime ignores the entry point's return value: a broken seed config must fail the run itself (a
    non-zero SystemExit), so the job's failure notifications fire; nothing reaches the lakehouse."""
    config = workspace.files / "seeds" / "heartbeat_sensor_config.csv"
    config.write_text(HEADER + "\n" + row("delta_table", f"{CATALOG}.sales.orders", "1", state="MAYBE") + "\n")
    (seeded,) = workspace.run("heartbeat_seed", [{"task_key": "seed"}])
    assert seeded["exit"] != 0, workspace.last_output[-3000:]
    assert "column job_state" in workspace.last_output and "Traceback" not in workspace.last_output


def test_sensing_on_databricks_asks_the_catalog_once_and_reads_history_only_for_altered_tables():
    """The remote sensing path forced on local Spark (benchmarks/remote_sensing.py, small): a steady tick is
    one catalog query and one spot check (one history row); a tick after data commits reads the history of those
    tables only and finds their data; while one table gets a commit every second, its history rows per tick are
    bounded by its commits since the last tick; a tick after OPTIMIZE commits finds no new data anywhere."""
    from heartbeat_runner.engines.engine import HISTORY_SLACK

    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "remote_sensing.py"), "--tables", "8",
                           "--changed", "2", "--optimized", "3", "--streaming-s", "3", "--json"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["baseline"]["errors"] == 0 and figures["baseline"]["queries"] >= 8
    assert figures["steady"] == {**figures["steady"], "queries": 2, "history_rows": 1, "new_data": 0, "errors": 0}
    changes = figures["with_changes"]
    assert changes["new_data"] == 2 and changes["errors"] == 0 and changes["queries"] <= 2 + 2 * 2
    for tick in figures["streaming"]:
        assert tick["new_data"] == 1 and tick["errors"] == 0
        assert tick["history_rows"] <= 1 + 2 + 1 + tick["commits"] + HISTORY_SLACK
    optimize = figures["after_optimize"]
    assert optimize["new_data"] == 0 and optimize["errors"] == 0
    # the tables changed a tick ago are still within the catalog's clock margin: read again, nothing new
    assert optimize["queries"] <= 2 + 2 * 3 + 2 + 2
