"""The Databricks Asset Bundle (databricks.yml + resources/) and the example downstream job.

No workspace and no Databricks CLI here, so the bundle is checked the way the CLI would
read it: includes resolved, target overrides merged (tasks by task_key, clusters by
job_cluster_key), variables substituted; then every job is loaded with the typed models
of ``databricks-bundles`` (Databricks' Python support for bundles), which reject unknown
or misspelt fields, and every task command line is parsed by the real CLI parser.
"""

from __future__ import annotations

import copy
import glob
import json
import re
import sys
from importlib.metadata import distribution
from pathlib import Path
from typing import Any

import pytest
import yaml
from bundle_rules import merge
from harness import config_row

from heartbeat_runner.interfaces.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "examples" / "databricks"))

import orders_etl  # noqa: E402

VARIABLE = re.compile(r"\$\{var\.([A-Za-z0-9_]+)\}")
# variables without a default, given at deploy time
TEST_VALUES = {"service_principal": "6a1c3e52-0000-4000-8000-00000000beef", "notification_email": "oncall@example.com"}


def load_bundle() -> tuple[dict[str, Any], dict[str, Path]]:
    """databricks.yml with its includes merged in; also which file defined each resource (job or app)."""
    root = yaml.safe_load((REPO / "databricks.yml").read_text())
    origin: dict[str, Path] = {}
    for pattern in root.get("include", []):
        for path in sorted(glob.glob(str(REPO / pattern))):
            part = yaml.safe_load(Path(path).read_text())
            assert set(part) <= {"resources", "variables", "targets"}, f"{path}: unexpected top-level keys"
            assert set(part["resources"]) <= {"jobs", "apps"}, f"{path}: unexpected resource kinds"
            for kind, resources in part["resources"].items():
                for name, spec in resources.items():
                    assert name not in origin, f"resource {name} defined twice"
                    origin[name] = Path(path)
                    root.setdefault("resources", {}).setdefault(kind, {})[name] = spec
    return root, origin


def resolved(kind: str, target: str, variables: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """The resources of one kind (jobs, apps) for ``target``: overrides merged, variables substituted
    (``variables``: values given at deploy time, ``--var name=value``)."""
    bundle, _ = load_bundle()
    specs = merge(bundle["resources"][kind], bundle["targets"][target].get("resources", {}).get(kind, {}))
    values = {name: spec.get("default", TEST_VALUES.get(name)) for name, spec in bundle["variables"].items()}
    values.update(bundle["targets"][target].get("variables", {}))
    values.update(variables or {})
    text = VARIABLE.sub(lambda m: str(values[m.group(1)]), json.dumps(specs))
    return json.loads(text)


def resolved_jobs(target: str, variables: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    return resolved("jobs", target, variables)


BUNDLE, ORIGIN = load_bundle()
TARGETS = sorted(BUNDLE["targets"])


def all_tasks(jobs: dict[str, dict[str, Any]]):
    for job_name, job in jobs.items():
        for task in job["tasks"]:
            yield job_name, task


def test_bundle_has_the_fields_the_cli_requires():
    assert BUNDLE["bundle"]["name"] == "heartbeat"
    assert TARGETS and sum(1 for t in BUNDLE["targets"].values() if t.get("default")) == 1
    assert {t.get("mode") for t in BUNDLE["targets"].values()} <= {"development", "production"}
    assert BUNDLE["artifacts"]["heartbeat_runner_wheel"]["type"] == "whl"
    for name, job in BUNDLE["resources"]["jobs"].items():
        assert job["name"] and job["tasks"], name
        keys = [task["task_key"] for task in job["tasks"]]
        assert len(keys) == len(set(keys)), f"{name}: duplicate task_key"


def test_every_variable_used_is_declared_and_has_a_value():
    text = (REPO / "databricks.yml").read_text() + "".join(p.read_text() for p in set(ORIGIN.values()))
    used = set(VARIABLE.findall(text))
    declared = BUNDLE["variables"]
    assert used <= set(declared), used - set(declared)
    assert all("description" in spec for spec in declared.values())
    assert {n for n, spec in declared.items() if "default" not in spec} <= set(TEST_VALUES)


@pytest.mark.parametrize("target", TARGETS)
def test_jobs_load_as_typed_databricks_job_definitions(target):
    jobs_model = pytest.importorskip("databricks.bundles.jobs", reason="pip install databricks-bundles")
    for _name, job in resolved_jobs(target).items():
        jobs_model.Job.from_dict(copy.deepcopy(job))  # raises on an unknown or misplaced field


@pytest.mark.parametrize("target", TARGETS)
def test_tasks_reference_what_exists(target):
    jobs = resolved_jobs(target)
    for job_name, job in jobs.items():
        clusters = {c["job_cluster_key"] for c in job.get("job_clusters", [])}
        keys = {t["task_key"] for t in job["tasks"]}
        for task in job["tasks"]:
            kinds = [k for k in task if k.endswith("_task")]
            assert len(kinds) == 1, f"{job_name}.{task['task_key']}: exactly one task type, got {kinds}"
            assert task.get("job_cluster_key") in clusters, f"{job_name}.{task['task_key']}: unknown cluster"
            assert {d["task_key"] for d in task.get("depends_on", [])} <= keys
            if "spark_python_task" in task:
                assert (ORIGIN[job_name].parent / task["spark_python_task"]["python_file"]).resolve().is_file()
            for library in task.get("libraries", []):  # the wheel the artifact build writes to dist/
                if "whl" in library:
                    assert (ORIGIN[job_name].parent / library["whl"]).resolve().parent == REPO / "dist"
                else:  # the pinned dependencies, a file of the bundle
                    assert (ORIGIN[job_name].parent / library["requirements"]).resolve().is_file()


@pytest.mark.parametrize("target", TARGETS)
def test_wheel_tasks_are_valid_heartbeat_command_lines(target):
    scripts = {e.name for e in distribution("heartbeat-runner").entry_points if e.group == "console_scripts"}
    for _job_name, task in all_tasks(resolved_jobs(target)):
        wheel = task.get("python_wheel_task")
        if wheel is None:
            continue
        assert wheel["package_name"] == "heartbeat_runner" and wheel["entry_point"] in scripts
        args = [re.sub(r"\{\{job\.(id|run_id)\}\}", "123", a) for a in wheel["parameters"]]
        parsed = build_parser().parse_args(args)
        assert parsed.target == "databricks"


def test_runner_is_scheduled_or_continuous_by_target():
    modes = {}
    for target in TARGETS:
        job = resolved_jobs(target)["heartbeat_runner"]
        assert ("schedule" in job) != ("continuous" in job), target
        args = job["tasks"][0]["python_wheel_task"]["parameters"]
        assert args[0] == "run" and ("--loop" in args) == ("continuous" in job)
        modes[target] = "schedule" if "schedule" in job else "continuous"
        assert job["max_concurrent_runs"] == 1
        cluster = job["job_clusters"][0]["new_cluster"]
        assert cluster["num_workers"] == 0 and cluster["spark_conf"]["spark.databricks.cluster.profile"] == "singleNode"
    assert set(modes.values()) == {"schedule", "continuous"}
    assert resolved_jobs("prod")["heartbeat_runner"]["schedule"]["quartz_cron_expression"] == \
        BUNDLE["variables"]["heartbeat_cron"]["default"]


def test_nothing_secret_in_the_bundle():
    text = (REPO / "databricks.yml").read_text() + "".join(p.read_text() for p in set(ORIGIN.values()))
    assert not re.search(r"dapi[0-9a-f]{8,}", text)
    for target in TARGETS:  # the tick authenticates as the job's identity (run_as): no token, no warehouse
        for name in ("heartbeat_runner", "heartbeat_seed"):
            env = resolved_jobs(target)[name]["job_clusters"][0]["new_cluster"]["spark_env_vars"]
            assert not {"DATABRICKS_TOKEN", "DATABRICKS_HTTP_PATH", "DATABRICKS_CLIENT_SECRET"} & set(env), (target, name)


def run_as_of(target: str, variables: dict[str, str] | None = None) -> dict[str, Any] | None:
    """The ``run_as`` the CLI gives the target's jobs: the target's own, else the bundle's top level."""
    target_spec = BUNDLE["targets"][target]
    spec = target_spec.get("run_as", BUNDLE.get("run_as"))
    if spec is None:
        return None
    values = {name: s.get("default", TEST_VALUES.get(name)) for name, s in BUNDLE["variables"].items()}
    values.update(target_spec.get("variables", {}))
    values.update(variables or {})
    return json.loads(VARIABLE.sub(lambda m: str(values[m.group(1)]), json.dumps(spec)))


@pytest.mark.parametrize("target", TARGETS)
def test_production_targets_run_every_job_as_a_service_principal(target):
    """The Databricks CLI refuses to deploy `mode: production` unless every job has `run_as` (or a service
    principal deploys): bundle/config/mutator/process_target_mode.go, validateProductionMode. Heartbeat's
    production targets name a service principal, given at deploy as --var service_principal=<id>."""
    jobs_model = pytest.importorskip("databricks.bundles.jobs", reason="pip install databricks-bundles")
    spec = run_as_of(target)
    if BUNDLE["targets"][target].get("mode") != "production":
        return
    assert spec is not None, f"{target}: 'run_as' must be set for all jobs when using 'mode: production'"
    run_as = jobs_model.JobRunAs.from_dict(copy.deepcopy(spec))
    assert run_as.service_principal_name == TEST_VALUES["service_principal"] and not run_as.user_name
    assert "service_principal" not in {n for n, v in BUNDLE["variables"].items() if "default" in v}, \
        "no default: a production deploy names its service principal"


@pytest.mark.parametrize("target", TARGETS)
def test_the_runner_job_skips_an_overrun_and_only_a_stuck_scheduled_tick_times_out(target):
    """Queueing off (bundle jobs queue by default: overrunning runs would stack); one run at a time; a
    scheduled tick ends after its timeout, the continuous runner's one long run has none."""
    jobs_model = pytest.importorskip("databricks.bundles.jobs", reason="pip install databricks-bundles")
    spec = resolved_jobs(target)["heartbeat_runner"]
    job = jobs_model.Job.from_dict(copy.deepcopy(spec))
    assert job.queue is not None and job.queue.enabled is False
    assert job.max_concurrent_runs == 1
    if "continuous" in spec:
        assert spec["timeout_seconds"] == 0 and "schedule" not in spec
    else:
        assert 0 < spec["timeout_seconds"] <= 3600


# -- the example downstream job ------------------------------------------------------------------


def test_example_job_receives_heartbeat_parameters_and_ends_with_complete():
    job = resolved_jobs("prod")["example_orders_etl"]
    assert {p["name"] for p in job["parameters"]} == {"heartbeat_run_id", "heartbeat_windows", "heartbeat_params",
                                                      "heartbeat_catch_up", "window_start", "window_end",
                                                      "heartbeat_window_correction"}
    etl = job["tasks"][0]["spark_python_task"]["parameters"]
    assert "{{job.parameters.heartbeat_params}}" in etl and "{{job.parameters.heartbeat_run_id}}" in etl
    last = job["tasks"][-1]
    assert last["depends_on"] == [{"task_key": "etl"}] and last.get("run_if") == "ALL_SUCCESS"
    args = last["python_wheel_task"]["parameters"]
    assert args[0] == "complete" and args[args.index("--job-id") + 1] == "{{job.id}}"


def test_example_plans_reads_from_the_structured_parameter_heartbeat_sends():
    params = json.dumps({"version": 1, "run_id": "r", "window": None, "catch_up": None, "sources": [
        {"sensor_source": "delta_table", "sensor_id": "sales.orders", "kind": "delta_version", "from": 3, "until": 9},
        {"sensor_source": "trigger_file", "sensor_id": "orders_ready", "kind": "cursor", "from": None,
         "until": {"mtime_ns": 1, "name": "b.done"}},
    ]}, sort_keys=True)
    assert orders_etl.plan_reads(orders_etl.parse_params(params), ["sales.orders"]) == \
        [orders_etl.Read("sales.orders", 4, 9)]
    assert orders_etl.plan_reads(orders_etl.parse_params(""), ["sales.orders"]) == [orders_etl.Read("sales.orders")]
    with pytest.raises(ValueError, match="version"):
        orders_etl.parse_params('{"version": 2, "sources": []}')


# -- the status page app -------------------------------------------------------------------------

APP_DIR = REPO / "app"


def app_config(target: str, variables: dict[str, str] | None = None) -> Any:
    """The app's command and environment: the typed ``AppConfig`` of the bundle's app resource."""
    apps_model = pytest.importorskip("databricks.bundles.apps", reason="pip install databricks-bundles")
    app = apps_model.App.from_dict(copy.deepcopy(resolved("apps", target, variables)["heartbeat_ui"]))
    assert app.config is not None, "the app's command and environment are the bundle's (config:)"
    return app.config


@pytest.mark.parametrize("target", TARGETS)
def test_app_loads_as_a_typed_databricks_app_and_its_code_is_the_app_folder(target):
    apps_model = pytest.importorskip("databricks.bundles.apps", reason="pip install databricks-bundles")
    apps = resolved("apps", target)
    assert set(apps) == {"heartbeat_ui"}
    app = apps_model.App.from_dict(copy.deepcopy(apps["heartbeat_ui"]))  # raises on an unknown field
    assert (ORIGIN["heartbeat_ui"].parent / app.source_code_path).resolve() == APP_DIR
    assert all(p.group_name for p in app.permissions)


@pytest.mark.parametrize("target", TARGETS)
def test_app_config_is_a_valid_app_config_running_the_ui_command(target):
    config = app_config(target)
    assert config.command[:3] == ["python", "-m", "heartbeat_runner"]
    parsed = build_parser().parse_args(config.command[3:])
    assert parsed.command == "ui" and parsed.target == "databricks"
    assert not getattr(parsed, "allow_actions", False), "the deployed page is read-only by default"
    assert not (APP_DIR / "app.yaml").exists() and not (APP_DIR / "app.yml").exists(), \
        "an app.yaml beside the bundle's config: Databricks Apps would not take both"


@pytest.mark.parametrize("target", TARGETS)
def test_app_reads_the_catalog_and_schema_the_bundle_deploys_with_and_keeps_no_secret(target):
    """``databricks bundle deploy --var catalog=... --var schema=...`` moves the app with the runner's job."""
    deployed = {"catalog": "analytics", "schema": "heartbeat_prod"}
    env = {e.name: e.value for e in app_config(target, deployed).env}
    assert (env["HEARTBEAT_CATALOG"], env["HEARTBEAT_SCHEMA"]) == ("analytics", "heartbeat_prod")
    job_env = json.dumps(resolved("jobs", target, deployed))
    assert '"HEARTBEAT_CATALOG": "analytics"' in job_env and '"HEARTBEAT_SCHEMA": "heartbeat_prod"' in job_env
    defaults = {e.name: e.value for e in app_config(target).env}
    bundle_values = {**{k: v.get("default") for k, v in BUNDLE["variables"].items()},
                     **BUNDLE["targets"][target].get("variables", {})}
    assert (defaults["HEARTBEAT_CATALOG"], defaults["HEARTBEAT_SCHEMA"]) == (bundle_values["catalog"],
                                                                             bundle_values["schema"])
    assert not any(k in env for k in ("DATABRICKS_TOKEN", "DATABRICKS_CLIENT_SECRET")), "the app's own identity only"
    assert env["HEARTBEAT_UI_OPERATORS"] == "" and env["HEARTBEAT_UI_OPERATOR_GROUPS"] == ""


def test_app_installs_heartbeat_from_the_wheel_the_artifact_build_copies():
    lines = [x.strip() for x in (APP_DIR / "requirements.txt").read_text().splitlines()
             if x.strip() and not x.startswith("#")]
    assert lines[0] == "--find-links ./wheels"
    extras = distribution("heartbeat-runner").metadata.get_all("Provides-Extra") or []
    assert lines[1] == "heartbeat-runner[app]" and "app" in extras
    assert "--wheel-dir app/wheels" in BUNDLE["artifacts"]["heartbeat_runner_wheel"]["build"]
    assert "app/wheels/*.whl" in BUNDLE["sync"]["include"]


EXAMPLE_ALERT = REPO / "examples" / "databricks" / "open_alerts.alert.yml"


def test_the_example_sql_alert_is_a_typed_bundle_alert_that_fires_on_an_open_heartbeat_alert(hb):
    """examples/databricks/open_alerts.alert.yml loads as a Databricks SQL alert (v2) of the bundle format,
    and its query, run on a real lakehouse against heartbeat_alerts, counts the open JOB_FAILED alert a
    failed run raised: the alert's condition (count > 0) holds."""
    alerts_model = pytest.importorskip("databricks.bundles.alerts", reason="pip install databricks-bundles")
    part = yaml.safe_load(EXAMPLE_ALERT.read_text())
    assert set(part) == {"variables", "resources"} and set(part["resources"]) == {"alerts"}
    variables = {**BUNDLE["variables"], **part["variables"]}
    values = {name: spec.get("default", {**TEST_VALUES, "warehouse_id": "0123456789abcdef"}.get(name, "oncall@example.com"))
              for name, spec in variables.items()}
    used = set(VARIABLE.findall(EXAMPLE_ALERT.read_text()))
    assert used <= set(variables), used - set(variables)
    spec = json.loads(VARIABLE.sub(lambda m: str(values[m.group(1)]), json.dumps(part["resources"]["alerts"])))
    (alert,) = [alerts_model.Alert.from_dict(copy.deepcopy(a)) for a in spec.values()]  # raises on an unknown field
    assert alert.evaluation.source.name == "open_alerts"

    policies = hb.root / "run_policies.yml"
    policies.write_text("alerts:\n  default:\n    job: {failed: true}\n")
    hb.app.settings = hb.settings.with_(run_policy_file=policies)
    hb.create_table("up.orders", "id int")
    hb.seed(config_row("delta_table", "up.orders", "J1"))
    hb.jobs(J1=3)
    hb.tick()
    hb.insert("up.orders", "(1)")
    hb.tick()
    hb.wait_for_jobs()
    hb.tick()
    query = part["resources"]["alerts"]["heartbeat_open_alerts"]["query_text"].replace(
        "${var.catalog}.${var.schema}.heartbeat_alerts", hb.app.store.name("heartbeat_alerts"))
    (row,) = hb.spark.sql(query).collect()
    assert row["open_alerts"] == 1 > alert.evaluation.threshold.value.double_value
