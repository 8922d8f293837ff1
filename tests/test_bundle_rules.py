"""The bundle as the Databricks CLI decides its deploys, and what a deploy of Heartbeat needs (issue 51).

``tests/bundle_rules.py`` models the CLI's rules at a pinned version. Three groups of tests:

1. the checker agrees with cases taken from the CLI's own tests (run_as_test.go, validate_target_mode_test.go,
   apply_target_mode_test.go at the pinned commit), errors kept apart from recommendations;
2. every target of this repository's bundle, deployed by whom docs/databricks.md says deploys it, gives no
   error and no recommendation, and the rows of issue 51 that live in YAML hold (schemas, app names, alerts,
   pinned libraries, the schedule against the cost advice, the files the runner reads);
3. the same checks report rows 1, 2, 4, 5 and 7 on the bundle as it was at 7fe6466 (tests/fixtures).
"""

from __future__ import annotations

import os
import re
from importlib.metadata import requires
from pathlib import Path
from typing import Any

import pytest
from bundle_rules import (
    CLI_COMMIT,
    Deployer,
    Deployment,
    check,
    deploy,
    documented_privileges,
    heartbeat_findings,
    load_bundle,
)
from cli_runner import run_cli
from harness import HEADER as CONFIG_HEADER
from harness import config_row
from packaging.requirements import Requirement

from heartbeat_runner.core.settings import load_settings
from heartbeat_runner.policies.run_policy_file import read_policy_file
from heartbeat_runner.sensing.connections import load_connections

REPO = Path(__file__).resolve().parent.parent
OLD = REPO / "tests" / "fixtures" / "bundle_7fe6466"
DOCS = REPO / "docs" / "databricks.md"

SP = "6a1c3e52-0000-4000-8000-00000000beef"
VARS = {"service_principal": SP, "notification_email": "oncall@example.com"}
ALICE = Deployer("alice.smith@example.com")
BOB = Deployer("bob@example.com")
CI = Deployer(SP, display_name="heartbeat-ci")

# docs/databricks.md at 7fe6466, section 1 step 3: a person signed in with `databricks auth login` runs
# `databricks bundle deploy -t prod`; nothing named another deployer for any target.
OLD_DOCUMENTED_DEPLOYER = {"dev": ALICE, "prod": ALICE, "prod_continuous": ALICE}


def small_bundle(mode: str = "", run_as: dict[str, Any] | None = None, resources: dict[str, Any] | None = None,
                 target: dict[str, Any] | None = None, top: dict[str, Any] | None = None) -> dict[str, Any]:
    """A bundle of one target ``t`` in the shape the CLI's unit tests build (mockBundle)."""
    spec: dict[str, Any] = {"mode": mode} if mode else {}
    spec.update(target or {})
    if run_as is not None:
        spec["run_as"] = run_as
    return {"bundle": {"name": "b"}, "resources": resources or {}, "targets": {"t": spec}, **(top or {})}


LENNART = Deployer("lennart@company.com")  # the CLI tests' current user (short name "lennart")
MOCK_RESOURCES = {
    "jobs": {"job1": {"name": "job1", "schedule": {"quartz_cron_expression": "* * * * * ?"}},
             "job2": {"name": "job2", "schedule": {"quartz_cron_expression": "* * * * * ?", "pause_status": "UNPAUSED"}}},
    "pipelines": {"pipeline1": {"name": "pipeline1"}},
    "model_serving_endpoints": {"servingendpoint1": {"name": "servingendpoint1"}},
    "registered_models": {"registeredmodel1": {"name": "registeredmodel1"}},
    "schemas": {"schema1": {"name": "schema1", "catalog_name": "main"}},
    "apps": {"app1": {"name": "app1", "source_code_path": "./app"}},
    "dashboards": {"dashboard1": {"display_name": "dashboard1"}},
}


# -- 1. the CLI's own cases ----------------------------------------------------------------------------


def test_the_rules_are_pinned_to_a_cli_commit():
    assert re.fullmatch(r"[0-9a-f]{40}", CLI_COMMIT)


def test_run_as_another_identity_works_for_allowed_resources_and_reaches_every_job():
    """run_as_test.go TestRunAsWorksForAllowedResources: alice deploys, bob runs; jobs, models, registered
    models, experiments, pipelines and alerts are fine, and every job runs as bob."""
    b = small_bundle(run_as={"user_name": "bob"}, resources={
        "jobs": {"job_one": {"name": "foo"}, "job_two": {"name": "bar"}},
        "models": {"m": {}}, "registered_models": {"r": {}}, "experiments": {"e": {}},
        "pipelines": {"p": {}}, "alerts": {"a": {"display_name": "alert"}}})
    alice = Deployer("alice")
    assert check(b, "t", alice).errors == ()
    assert {j["run_as"]["user_name"] for j in deploy(b, "t", alice).jobs().values()} == {"bob"}


@pytest.mark.parametrize("kind", ["apps", "model_serving_endpoints", "quality_monitors"])
def test_run_as_another_identity_is_refused_beside_resources_that_cannot_run_as(kind):
    """run_as_test.go TestRunAsErrorForUnsupportedResources: each kind off the allow list is an error."""
    b = small_bundle(run_as={"user_name": "bob"}, resources={kind: {"foo": {"path": "bar"}}})
    report = check(b, "t", Deployer("alice"))
    assert report.error_rules == {f"run_as.{kind}"} and report.recommendations == ()
    assert check(b, "t", Deployer("bob")).errors == (), "the same identity: every resource is supported"


@pytest.mark.parametrize("kind", ["jobs", "pipelines", "schemas", "volumes", "clusters", "experiments", "dashboards",
                                  "sql_warehouses", "secret_scopes"])
def test_run_as_another_identity_is_accepted_beside_allowed_resources(kind):
    """run_as_test.go TestRunAsNoErrorForSupportedResources (a sample of the allow list)."""
    b = small_bundle(run_as={"user_name": "bob"}, resources={kind: {"foo": {"name": "bar"}}})
    assert check(b, "t", Deployer("alice")).errors == ()


def test_a_dashboard_embedding_credentials_cannot_run_as_another_identity():
    """acceptance/bundle/run_as/dashboard_embed: only embed_credentials: true is refused."""
    b = small_bundle(run_as={"user_name": "bob"}, resources={"dashboards": {"d": {"embed_credentials": True}}})
    assert check(b, "t", Deployer("alice")).error_rules == {"run_as.dashboards"}


def test_run_as_names_exactly_one_identity():
    for spec, rule in (({}, "run_as.empty"), ({"user_name": "", "service_principal_name": ""}, "run_as.empty"),
                       ({"user_name": "bob", "service_principal_name": SP}, "run_as.both")):
        assert rule in check(small_bundle(run_as=spec), "t", Deployer("alice")).error_rules, spec
    assert "run_as.empty" in check(small_bundle(top={"run_as": None}), "t", Deployer("alice")).error_rules


def test_production_mode_needs_an_explicit_root_path_when_a_person_deploys_jobs_without_run_as():
    """validate_target_mode_test.go TestProcessTargetModeProduction / ...OkForPrincipal / ...OkWithRootPath."""
    b = small_bundle("production", resources={"jobs": {"job1": {"name": "job1"}}})
    assert check(b, "t", LENNART).error_rules == {"production.root_path"}
    principal = check(b, "t", Deployer(SP))
    assert principal.errors == () and principal.recommendation_rules == {"production.root_path"}
    every_job_runs_as = small_bundle("production", resources={"jobs": {"job1": {"name": "job1", "run_as": {
        "user_name": "user@company.com"}}}})
    person = check(every_job_runs_as, "t", LENNART)
    assert person.errors == () and person.recommendation_rules == {"production.root_path"}
    rooted = small_bundle("production", resources={"jobs": {"job1": {"name": "job1"}}},
                          target={"workspace": {"root_path": "some-root-path"}})
    assert check(rooted, "t", LENNART) == check(rooted, "t", Deployer(SP)) and check(rooted, "t", LENNART).errors == ()
    assert check(rooted, "t", LENNART).recommendations == ()


def test_a_root_path_set_outside_the_target_does_not_count_for_production_mode():
    """isExplicitRootSet looks at the target's workspace only."""
    b = small_bundle("production", resources={"jobs": {"j": {"name": "j"}}},
                     top={"workspace": {"root_path": "/Workspace/Shared/x"}})
    assert check(b, "t", LENNART).error_rules == {"production.root_path"}


def test_production_mode_refuses_a_development_pipeline():
    b = small_bundle("production", resources={"pipelines": {"p": {"development": True}}})
    assert check(b, "t", Deployer(SP)).error_rules == {"production.pipeline_development"}


def test_development_mode_prefixes_jobs_and_schemas_but_not_apps_and_pauses_unset_schedules():
    """apply_target_mode_test.go TestProcessTargetModeDevelopment and TestAppropriateResourcesAreRenamed."""
    d = deploy(small_bundle("development", resources=MOCK_RESOURCES), "t", LENNART)
    assert d.jobs()["job1"]["name"] == "[dev lennart] job1"
    assert d.jobs()["job1"]["schedule"]["pause_status"] == "PAUSED"
    assert d.jobs()["job2"]["schedule"]["pause_status"] == "UNPAUSED", "an object's own status wins"
    assert d.resources["pipelines"]["pipeline1"]["name"] == "[dev lennart] pipeline1"
    assert d.resources["model_serving_endpoints"]["servingendpoint1"]["name"] == "dev_lennart_servingendpoint1"
    assert d.resources["registered_models"]["registeredmodel1"]["name"] == "dev_lennart_registeredmodel1"
    assert d.resources["schemas"]["schema1"]["name"] == "dev_lennart_schema1"
    assert d.resources["dashboards"]["dashboard1"]["display_name"] == "[dev lennart] dashboard1"
    assert d.apps()["app1"]["name"] == "app1", "apps get no prefix"
    assert check(small_bundle("development", resources=MOCK_RESOURCES), "t", LENNART).errors == ()


def test_development_mode_leaves_a_schema_named_through_a_variable_untouched():
    """Only resources.schemas are renamed: a variable's value used in a job's environment is not a resource."""
    b = small_bundle("development", resources={"jobs": {"j": {"name": "j", "env": "${var.schema}"}}},
                     top={"variables": {"schema": {"default": "heartbeat"}}})
    assert deploy(b, "t", LENNART).jobs()["j"]["env"] == "heartbeat"


def test_development_mode_refuses_unpaused_presets_shared_paths_and_a_prefix_without_the_user():
    """validate_target_mode_test.go TestValidateDevelopmentMode, TestTriggerPauseStatusWhenUnpaused."""
    unpaused = small_bundle("development", target={"presets": {"trigger_pause_status": "UNPAUSED"}})
    assert check(unpaused, "t", LENNART).error_rules == {"development.unpaused"}
    shared = small_bundle("development", target={"workspace": {"root_path": "/Shared/.bundle/x/y/state"}})
    assert check(shared, "t", LENNART).error_rules == {"development.root_path"}
    own = small_bundle("development", target={"workspace": {"root_path": "~/.bundle/x/lennart"}})
    assert check(own, "t", LENNART).errors == ()
    prefix = small_bundle("development", target={"presets": {"name_prefix": "custom_deploy_"}})
    assert check(prefix, "t", LENNART).error_rules == {"development.prefix"}
    assert check(small_bundle("development", target={"presets": {"name_prefix": "custom_lennart_deploy_"}}),
                 "t", LENNART).errors == ()


def test_a_permissions_section_without_the_deployer_is_a_recommendation():
    """permission_diagnostics_test.go: CAN_MANAGE for the current identity silences it; another level does not."""
    others = small_bundle(top={"permissions": [{"level": "CAN_MANAGE", "group_name": "team"}]})
    report = check(others, "t", LENNART)
    assert report.errors == () and report.recommendation_rules == {"permissions.deployer"}
    mine = small_bundle(top={"permissions": [{"level": "CAN_MANAGE", "user_name": "lennart@company.com"}]})
    assert check(mine, "t", LENNART).recommendations == ()
    viewer = small_bundle(top={"permissions": [{"level": "CAN_VIEW", "user_name": "lennart@company.com"}]})
    assert check(viewer, "t", LENNART).recommendation_rules == {"permissions.deployer"}


def test_production_operators_may_run_the_jobs_without_deploying():
    """The principal owns production; the operators' group gets CAN_RUN (the jobs' CAN_MANAGE_RUN), so a person
    can run, repair or cancel a production run (section 1, step 7) while deploys stay with CI."""
    for target in ("prod", "prod_continuous"):
        levels = {(p.get("group_name") or p.get("service_principal_name"), p["level"])
                  for p in deploy(BUNDLE, target, CI, VARS).permissions}
        assert levels == {(SP, "CAN_MANAGE"), ("admins", "CAN_RUN")}, target


def test_who_is_a_service_principal_and_short_names():
    """libs/iamutil: a UUID user name is a service principal; its short name comes from its display name."""
    assert CI.is_service_principal and not ALICE.is_service_principal
    assert ALICE.short_name == "alice_smith" and ALICE.domain_friendly_name == "alice-smith"
    assert CI.short_name == "heartbeat_ci" and Deployer("Jane.O'Neil+x@example.com").short_name == "jane_o_neil_x"


# -- 2. this repository's bundle ---------------------------------------------------------------------


def documented_deployers() -> dict[str, Deployer]:
    """docs/databricks.md, the table under "Who deploys each target": target -> a person or the principal."""
    text = DOCS.read_text()
    section = text.split("### Who deploys each target", 1)[1].split("\n#", 1)[0]
    out = {}
    for line in section.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] in BUNDLE["targets"]:
            who = cells[1].lower()
            assert ("service principal" in who) != ("person" in who), line
            out[cells[0]] = CI if "service principal" in who else ALICE
    return out


BUNDLE = load_bundle(REPO)
OLD_BUNDLE = load_bundle(OLD)


def deployments(bundle: dict[str, Any], deployers: dict[str, Deployer]) -> list[Deployment]:
    """Every target with its deployer, and dev a second time by another developer."""
    out = [deploy(bundle, target, who, VARS) for target, who in deployers.items()]
    return out + [deploy(bundle, "dev", BOB, VARS)]


def test_the_docs_name_a_deployer_for_every_target_and_production_is_the_principal():
    deployers = documented_deployers()
    assert set(deployers) == set(BUNDLE["targets"])
    for target, who in deployers.items():
        production = BUNDLE["targets"][target].get("mode") == "production"
        assert who.is_service_principal == production, target


@pytest.mark.parametrize("target", sorted(BUNDLE["targets"]))
def test_every_target_deployed_by_its_documented_deployer_gives_no_error_and_no_recommendation(target):
    """Row 1: the deploy the docs describe goes through."""
    report = check(BUNDLE, target, documented_deployers()[target], VARS)
    assert report.errors == () and report.recommendations == ()


def test_a_person_deploying_production_is_refused_because_of_the_app():
    """What a person who ignores the docs meets (troubleshooting names it)."""
    assert check(BUNDLE, "prod", ALICE, VARS).error_rules == {"run_as.apps"}
    assert "do not support a setting a run_as user" in DOCS.read_text()


def test_no_heartbeat_finding_on_the_bundle():
    """Rows 2, 4, 5, 7: the runner reads its folder, schemas and apps are not shared, production pages."""
    assert heartbeat_findings(BUNDLE, deployments(BUNDLE, documented_deployers())) == {}


def test_dev_uses_a_schema_of_its_own_per_developer_and_prod_the_production_schema():
    """Row 4: what reaches the runner's cluster (HEARTBEAT_SCHEMA) and the app differs per developer."""
    def where(d: Deployment) -> tuple[str, str]:
        env = d.jobs()["heartbeat_runner"]["job_clusters"][0]["new_cluster"]["spark_env_vars"]
        app_env = {e["name"]: e["value"] for e in d.apps()["heartbeat_ui"]["config"]["env"]}
        assert (app_env["HEARTBEAT_CATALOG"], app_env["HEARTBEAT_SCHEMA"]) == (env["HEARTBEAT_CATALOG"],
                                                                             env["HEARTBEAT_SCHEMA"])
        return env["HEARTBEAT_CATALOG"], env["HEARTBEAT_SCHEMA"]

    alice, bob = where(deploy(BUNDLE, "dev", ALICE, VARS)), where(deploy(BUNDLE, "dev", BOB, VARS))
    prod = where(deploy(BUNDLE, "prod", CI, VARS))
    assert alice == ("main", "heartbeat_alice_smith") and bob == ("main", "heartbeat_bob")
    assert prod == ("main", "heartbeat") == where(deploy(BUNDLE, "prod_continuous", CI, VARS))
    assert where(deploy(OLD_BUNDLE, "dev", ALICE, VARS)) == prod, "the old bundle: one schema for all"


def test_app_names_differ_between_developers_and_production_and_are_valid_app_names():
    """Row 5: development mode does not prefix apps, so the name itself carries the target or the user."""
    names = {(t, who.user_name): deploy(BUNDLE, t, who, VARS).apps()["heartbeat_ui"]["name"]
             for t, who in [("dev", ALICE), ("dev", BOB), ("prod", CI), ("prod_continuous", CI)]}
    assert len(set(names.values())) == len(names), names
    assert names[("prod", SP)] == "heartbeat-ui" and names[("dev", ALICE.user_name)] == "heartbeat-ui-alice-smith"
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9-]{0,28}[a-z0-9]", n) for n in names.values()), names


@pytest.mark.parametrize("target", ["prod", "prod_continuous"])
def test_a_failed_production_run_emails_and_a_stuck_scheduled_tick_raises_a_health_warning(target):
    """Row 7: on_failure reaches the address the deploy names; the scheduled runner has a run-duration
    health rule below its timeout (the continuous run has no duration to judge)."""
    jobs = deploy(BUNDLE, target, CI, VARS).jobs()
    for name in ("heartbeat_runner", "heartbeat_seed"):
        assert jobs[name]["email_notifications"]["on_failure"] == ["oncall@example.com"], (target, name)
    runner = jobs["heartbeat_runner"]
    if "schedule" in runner:
        (rule,) = runner["health"]["rules"]
        assert rule["metric"] == "RUN_DURATION_SECONDS" and rule["op"] == "GREATER_THAN"
        assert 0 < rule["value"] < runner["timeout_seconds"]
        assert runner["email_notifications"]["on_duration_warning_threshold_exceeded"] == ["oncall@example.com"]
    else:
        assert "health" not in runner and runner["timeout_seconds"] == 0
    assert "email_notifications" not in deploy(BUNDLE, "dev", ALICE, VARS).jobs()["heartbeat_runner"], \
        "developers' paused runs page no one"


def test_the_typed_job_model_accepts_the_notifications_and_health_rules():
    jobs_model = pytest.importorskip("databricks.bundles.jobs", reason="pip install databricks-bundles")
    job = jobs_model.Job.from_dict(deploy(BUNDLE, "prod", CI, VARS).jobs()["heartbeat_runner"])
    assert job.health is not None and job.email_notifications is not None


def pinned_requirements(bundle_root: Path, bundle: dict[str, Any]) -> dict[str, dict[str, Requirement]]:
    """For each wheel task (job.task): the requirements its libraries pin, by lower-case name."""
    out: dict[str, dict[str, Requirement]] = {}
    for job_name, job in deploy(bundle, "prod", CI, VARS).jobs().items():
        for task in job["tasks"]:
            if "python_wheel_task" not in task:
                continue
            pins: dict[str, Requirement] = {}
            for library in task.get("libraries", []):
                if "requirements" in library:
                    for line in (bundle_root / "resources" / library["requirements"]).read_text().splitlines():
                        if line.strip() and not line.lstrip().startswith(("#", "-")):
                            req = Requirement(line)
                            pins[req.name.lower()] = req
            out[f"{job_name}.{task['task_key']}"] = pins
    return out


def test_every_wheel_task_installs_the_wheels_dependencies_at_pinned_versions_within_its_ranges():
    """Row 8: a cluster start installs the tested versions, the same each time, never the index's newest."""
    base = [Requirement(r) for r in requires("heartbeat-runner") or [] if "extra ==" not in r]
    tasks = pinned_requirements(REPO, BUNDLE)
    assert tasks and all(tasks.values()), tasks
    for task, pins in tasks.items():
        for dep in base:
            pin = pins.get(dep.name.lower())
            assert pin is not None, f"{task}: {dep.name} not pinned"
            (spec,) = pin.specifier
            assert spec.operator == "==" and dep.specifier.contains(spec.version), f"{task}: {pin} outside {dep}"
    assert not any(pinned_requirements(OLD, OLD_BUNDLE).values()), "the old bundle pinned nothing"


def cron_minutes(expression: str) -> int:
    """Minutes between runs of a Quartz cron whose minute field is ``0/N``, ``*/N`` or a single minute (hourly)."""
    minute = expression.split()[1]
    step = re.fullmatch(r"(?:\d+|\*)/(\d+)", minute)
    return int(step.group(1)) if step else 60


def test_the_default_schedule_follows_the_cost_advice():
    """Row 9: section 9 says a schedule below 15 minutes costs what continuous costs; the default is not below,
    and the cost table prices the default schedule, and no shape the bundle does not deploy as deployed."""
    default = BUNDLE["variables"]["heartbeat_cron"]["default"]
    assert cron_minutes(default) >= 15 and cron_minutes(OLD_BUNDLE["variables"]["heartbeat_cron"]["default"]) < 15
    costs = DOCS.read_text().split("## 9. What it costs per day", 1)[1].split("\n## ", 1)[0]
    assert "Below a 15-minute interval, choose continuous" in costs
    assert f"every {cron_minutes(default)} minutes** (`prod`, the default)" in costs
    for line in costs.splitlines():
        if "serverless jobs compute" in line.lower() and line.startswith("| **"):
            pytest.fail(f"a priced shape the bundle does not deploy: {line}")


@pytest.mark.parametrize("target", sorted(BUNDLE["targets"]))
def test_the_runner_finds_its_sources_and_run_policy_files_in_the_uploaded_project(target):
    """Row 11 (bundle side): the cluster's working directory is not the project, so the runner looks for both
    files in the uploaded project (HEARTBEAT_PROJECT_DIR). The jobs name neither file: a HEARTBEAT_RUN_POLICY that
    names a missing file is refused by `run`, and a team without policies has no file."""
    d = deploy(BUNDLE, target, documented_deployers()[target], VARS)
    for name in ("heartbeat_runner", "heartbeat_seed"):
        env = d.jobs()[name]["job_clusters"][0]["new_cluster"]["spark_env_vars"]
        project = env["HEARTBEAT_PROJECT_DIR"]
        assert project == f"{d.root_path}/files" and project.startswith(f"/Workspace/Users/{d.deployer.user_name}/")
        assert "HEARTBEAT_SOURCES_FILE" not in env and "HEARTBEAT_RUN_POLICY" not in env


def test_every_declared_variable_is_used():
    """A variable nothing reads (the old secret_scope) promises a setting that does nothing."""
    text = "".join(p.read_text() for p in [REPO / "databricks.yml", *sorted((REPO / "resources").glob("*.yml"))])
    used = set(re.findall(r"\$\{var\.([A-Za-z0-9_]+)\}", text))
    assert set(BUNDLE["variables"]) <= used, set(BUNDLE["variables"]) - used


# -- 3. the bundle at 7fe6466 -------------------------------------------------------------------------


def test_the_old_bundle_shows_rows_1_2_4_5_and_7():
    """What the checker would have said before issue 51, with the deployer the old docs named."""
    assert check(OLD_BUNDLE, "prod", OLD_DOCUMENTED_DEPLOYER["prod"], VARS).error_rules == {"run_as.apps"}  # row 1
    rows = heartbeat_findings(OLD_BUNDLE, deployments(OLD_BUNDLE, OLD_DOCUMENTED_DEPLOYER))
    assert set(rows) == {2, 4, 5, 7}, rows
    assert any("cannot read /Workspace/Users/alice.smith@example.com/" in r for r in rows[2])
    assert any("main.heartbeat is shared by dev" in r for r in rows[4])
    assert any("app heartbeat-ui is claimed by" in r for r in rows[5])
    assert any("no one is e-mailed" in r for r in rows[7]) and any("health rule" in r for r in rows[7])


def test_the_old_bundle_deployed_by_the_principal_only_lacks_a_root_path():
    """Deployed as the new docs say, the old YAML passes the CLI with a recommendation: rows 4, 5, 7 remain."""
    report = check(OLD_BUNDLE, "prod", CI, VARS)
    assert report.errors == () and report.recommendation_rules == {"production.root_path"}
    rows = heartbeat_findings(OLD_BUNDLE, deployments(OLD_BUNDLE, {"dev": ALICE, "prod": CI, "prod_continuous": CI}))
    assert set(rows) == {4, 5, 7}, rows


# -- docs/databricks.md, the privileges of each identity ------------------------------------------------


UC_PRIVILEGES = {"USE CATALOG", "CREATE SCHEMA", "USE SCHEMA", "CREATE TABLE", "MODIFY", "SELECT", "READ VOLUME"}


def test_the_privileges_table_names_each_identity_and_only_unity_catalog_privileges_on_uc_objects():
    grants = documented_privileges(DOCS)
    assert {g.identity for g in grants} == {"runner", "seed", "app", "downstream", "operators"}
    for g in grants:
        if g.securable in ("CATALOG", "SCHEMA", "TABLE", "VOLUME"):
            assert g.privilege in UC_PRIVILEGES, g
            assert g.object.startswith("<catalog>"), g
    sql = {g.sql({"catalog": "main", "schema": "heartbeat"}, SP) for g in grants if g.identity == "app"}
    assert f"GRANT SELECT ON SCHEMA main.heartbeat TO `{SP}`" in sql


def test_the_runner_may_write_its_schema_and_the_app_writes_only_with_actions_on():
    """What each identity does, as grants: the tick writes events, the control table and the lease; the page
    reads, and writes the three tables an action touches only when actions are on."""
    grants = documented_privileges(DOCS)

    def held(identity: str, when: str | None = None) -> set[tuple[str, str]]:
        return {(g.privilege, g.object) for g in grants if g.identity == identity and (when is None or g.when == when)}

    schema = "<catalog>.<schema>"
    for identity in ("runner", "seed"):
        assert {("USE CATALOG", "<catalog>"), ("USE SCHEMA", schema), ("CREATE TABLE", schema), ("MODIFY", schema),
                ("SELECT", schema)} <= held(identity, "always"), identity
    app_always = held("app", "always")
    assert ("SELECT", schema) in app_always and not any(p == "MODIFY" for p, _ in app_always)
    actions = {o.rsplit(".", 1)[1] for p, o in held("app") if p == "MODIFY"}
    assert actions == {"heartbeat_events", "heartbeat_lease", "heartbeat_control"}
    assert ("MODIFY", f"{schema}.heartbeat_events") in held("downstream")
    assert ("CAN_MANAGE_RUN", "<job>") in held("runner")


def test_a_runner_started_elsewhere_than_the_project_reads_the_uploaded_sources_and_run_policy(tmp_path,
                                                                                            monkeypatch):
    """Row 11, as the runner sees it: the cluster's spark_env_vars, with the bundle folder on this disk, give
    settings that read heartbeat_sources.yml and the run-policy file of the uploaded project, from a working
    directory that is not the project (before, neither file was found there)."""
    d = deploy(BUNDLE, "prod", CI, VARS)
    files = tmp_path / "files"
    files.mkdir()
    (files / "heartbeat_sources.yml").write_text("jdbc:\n  warehouse:\n    url: {env: WAREHOUSE_URL}\n")
    (files / "heartbeat_run_policy.yml").write_text('jobs:\n  "123": {max_retries: 2}\n')
    elsewhere = tmp_path / "driver_cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    env = {k: str(v).replace(f"{d.root_path}/files", str(files)).replace("/local_disk0", str(tmp_path / "disk"))
           for k, v in d.jobs()["heartbeat_runner"]["job_clusters"][0]["new_cluster"]["spark_env_vars"].items()}
    settings = load_settings(env=env)
    assert settings.effective_sources_file == files / "heartbeat_sources.yml"
    assert load_connections(settings.effective_sources_file) == {"jdbc": {"warehouse": {"url": {"env": "WAREHOUSE_URL"}}}}
    assert read_policy_file(settings.run_policy_file)["jobs"]["123"]["max_retries"] == 2
    old = deploy(OLD_BUNDLE, "prod", CI, VARS).jobs()["heartbeat_runner"]["job_clusters"][0]["new_cluster"]
    old_env = {k: str(v).replace("/local_disk0", str(tmp_path / "disk")) for k, v in old["spark_env_vars"].items()}
    old_settings = load_settings(env=old_env)
    assert old_settings.effective_sources_file is None and old_settings.run_policy_file is None


CONFIG_ROW = config_row("delta_table", "main.sales.orders", "123")


@pytest.mark.parametrize("job", ["heartbeat_runner", "heartbeat_seed"])
def test_a_deployed_project_without_policy_or_sources_files_is_not_refused(tmp_path, job):
    """The jobs' own environment, with an uploaded project that holds neither optional file: `validate` (the
    check `run` and `seed` make before anything else) passes. A job that named a missing run-policy file would
    be refused at every tick (HEARTBEAT_RUN_POLICY must name a file that exists), as the first bundle of issue
    51 was on the Databricks-shaped leg."""
    d = deploy(BUNDLE, "prod", CI, VARS)
    files = tmp_path / "files"
    (files / "seeds").mkdir(parents=True)
    config = files / "seeds" / "heartbeat_sensor_config.csv"
    config.write_text("\n".join([CONFIG_HEADER, CONFIG_ROW]) + "\n")
    env = {k: str(v).replace(f"{d.root_path}/files", str(files)).replace("/local_disk0", str(tmp_path / "disk"))
           for k, v in d.jobs()[job]["job_clusters"][0]["new_cluster"]["spark_env_vars"].items()}
    # the local engine stands in for the cluster's: it has one catalog, so the cluster's HEARTBEAT_CATALOG stays out
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")},
           **{k: v for k, v in env.items() if k != "HEARTBEAT_CATALOG"},
           "HEARTBEAT_TARGET": "local", "HEARTBEAT_JOBS_BACKEND": "local"}
    proc = run_cli(["validate", "--config", str(config)], env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "does not exist" not in proc.stdout + proc.stderr
