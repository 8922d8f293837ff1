"""The Databricks CLI's bundle rules that decide whether a deploy goes through, as one checker.

Modelled on databricks/cli v1.13.0 (commit 7bbe2852131bc5c4a6c7bad5f147bc7772eedf9f, 2026-08-21), read from
``bundle/config/mutator/resourcemutator/``: ``run_as.go`` (validateRunAs), ``validate_target_mode.go``
(validateProductionMode, validateDevelopmentMode), ``apply_target_mode.go`` + ``apply_presets.go`` (the
development-mode name prefix), ``libs/iamutil`` (who is a service principal, short names). Written here from
that reading, not copied; where the CLI's own tests pin a behaviour, ``tests/test_bundle_rules.py`` replays
them against this module.

What the checker takes: the bundle's YAML (a folder with ``databricks.yml`` and its includes), a target,
and who deploys it (:class:`Deployer`: a person's e-mail, or a service principal's application id). What it
returns: a :class:`Report` whose errors are what the CLI refuses the deploy for and whose recommendations
are what it prints and deploys anyway. Kept apart on purpose: a recommendation never fails a deploy.

Rules modelled (the CLI at the version above):

- ``run_as`` differing from the deployer is refused when the bundle holds apps, model serving endpoints,
  quality monitors, or dashboards with ``embed_credentials``. Pipelines gained run_as support in the CLI
  before this version (earlier CLIs refused them too); at the pinned version they are allowed.
- ``run_as`` present must name exactly one identity.
- production mode: a pipeline with ``development: true`` is refused; an explicit ``workspace.root_path``
  on the target is needed, unless every job has ``run_as`` or a service principal deploys, in which case
  it is only a recommendation.
- permissions (``bundle/permissions/permission_diagnostics.go``): a ``permissions`` section that does not
  give the deployer CAN_MANAGE is a recommendation.
- development mode: job names get ``[dev <short name>] ``, ``resources.schemas`` names get
  ``dev_<short name>_``, apps get no prefix; a schema that is only a variable's value (as Heartbeat's
  ``${var.schema}``) is not a resource and stays as written. Schedules without a pause status pause.
  Workspace paths set on the target must contain the user's name or short name.

Beside the CLI's rules, :func:`heartbeat_findings` checks what a deploy of Heartbeat needs that the CLI
does not check (issue 51, rows 2, 4, 5, 7): the runner's identity can read the bundle folder, dev and prod
use different schemas and app names, production runs page someone.
"""

from __future__ import annotations

import copy
import glob
import json
import re
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CLI_VERSION = "v1.13.0"
CLI_COMMIT = "7bbe2852131bc5c4a6c7bad5f147bc7772eedf9f"

# Resource kinds whose deploy the CLI refuses when run_as differs from the deployer (run_as.go).
RUN_AS_REFUSED = ("model_serving_endpoints", "quality_monitors", "apps")
# Dashboards are refused only with embed_credentials: true (run_as.go).
#: what ``bundle deploy`` does not upload from the repository's top folder: the bundle's ``sync.exclude`` (tests,
#: benchmarks), what git ignores (the venv, built wheels) and hidden folders; the app's folder is left out too
#: (the jobs never read it)
NOT_SYNCED = ("tests", "benchmarks", ".git", ".venv", "dist", "app")


def workspace_files(repo: Path, dest: Path) -> Path:
    """The repository as the bundle syncs it to the workspace (``${workspace.file_path}``)."""
    shutil.copytree(repo, dest, ignore=lambda folder, names: [n for n in names if Path(folder) == repo
                                                              and (n in NOT_SYNCED or n.startswith("."))])
    return dest


REFERENCE = re.compile(r"\$\{([A-Za-z0-9_.\-]+)\}")


@dataclass(frozen=True)
class Deployer:
    """Who runs ``databricks bundle deploy``: ``user_name`` is a person's e-mail or a service principal's
    application id (the CLI's ``workspace.current_user.userName``). ``display_name`` matters only for a
    service principal's short name."""

    user_name: str
    display_name: str = ""

    @property
    def is_service_principal(self) -> bool:
        """The CLI's heuristic (libs/iamutil): a user name that parses as a UUID is a service principal."""
        try:
            uuid.UUID(self.user_name)
        except ValueError:
            return False
        return True

    @property
    def short_name(self) -> str:
        """``workspace.current_user.short_name``: the e-mail's local part, lower case, every run of
        characters other than letters and digits one underscore, none at either end."""
        name = self.display_name if self.is_service_principal and self.display_name else self.user_name
        local = name.split("@", 1)[0].lower()
        return re.sub(r"_+", "_", "".join(c if c.isalnum() else "_" for c in local)).strip("_")

    @property
    def domain_friendly_name(self) -> str:
        """``workspace.current_user.domain_friendly_name``: the short name with dashes for the rest (what
        Databricks Apps accepts in a name)."""
        return "".join(c if c.isascii() and c.isalnum() else "-" for c in self.short_name).lower()


@dataclass(frozen=True)
class Finding:
    """One diagnostic: ``rule`` a stable key tests match on, ``message`` what a person reads."""

    rule: str
    message: str


@dataclass(frozen=True)
class Report:
    """What ``databricks bundle validate`` / ``deploy`` would say: errors refuse the deploy, recommendations
    do not."""

    errors: tuple[Finding, ...] = ()
    recommendations: tuple[Finding, ...] = ()

    @property
    def error_rules(self) -> set[str]:
        return {f.rule for f in self.errors}

    @property
    def recommendation_rules(self) -> set[str]:
        return {f.rule for f in self.recommendations}


@dataclass
class Deployment:
    """One target of a bundle as its deployer would deploy it: overrides merged, references substituted,
    run_as given to every job without one, development-mode presets applied.

    ``root_path`` is where the CLI uploads files and artifacts; ``root_path_explicit`` whether the target
    sets it (the production rule looks at the target only). ``run_as`` is the bundle's identity for jobs
    (None: the deployer)."""

    target: str
    mode: str
    deployer: Deployer
    run_as: str | None
    run_as_spec: dict[str, Any] | None
    root_path: str
    root_path_explicit: bool
    variables: dict[str, str]
    resources: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict)
    presets: dict[str, Any] = field(default_factory=dict)
    permissions: list[dict[str, Any]] = field(default_factory=list)
    run_as_present: bool = False

    def jobs(self) -> dict[str, dict[str, Any]]:
        return self.resources.get("jobs", {})

    def apps(self) -> dict[str, dict[str, Any]]:
        return self.resources.get("apps", {})


def load_bundle(root: Path) -> dict[str, Any]:
    """``databricks.yml`` under ``root`` with its includes merged in (resources, variables, targets)."""
    bundle = yaml.safe_load((root / "databricks.yml").read_text())
    for pattern in bundle.get("include", []):
        for path in sorted(glob.glob(str(root / pattern))):
            part = yaml.safe_load(Path(path).read_text()) or {}
            for kind, specs in (part.get("resources") or {}).items():
                bundle.setdefault("resources", {}).setdefault(kind, {}).update(copy.deepcopy(specs))
            bundle.setdefault("variables", {}).update(part.get("variables") or {})
            for name, spec in (part.get("targets") or {}).items():
                bundle.setdefault("targets", {})[name] = merge(bundle.get("targets", {}).get(name, {}), spec)
    return bundle


def merge(base: Any, override: Any, key: str | None = None) -> Any:
    """The CLI's target merge: maps recursively, task and cluster lists by their key, anything else replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for k, v in override.items():
            out[k] = merge(base[k], v, k) if k in base else v
        return out
    item_key = {"tasks": "task_key", "job_clusters": "job_cluster_key"}.get(key or "")
    if item_key and isinstance(base, list) and isinstance(override, list):
        merged = {item[item_key]: item for item in base}
        for item in override:
            merged[item[item_key]] = merge(merged.get(item[item_key], {}), item)
        return list(merged.values())
    return override


def _substitute(value: Any, lookup: dict[str, str]) -> Any:
    """Replace every ``${name}`` that ``lookup`` knows, repeatedly (a variable's value may hold references);
    unknown references stay as written."""
    text = json.dumps(value)
    for _ in range(5):
        new = REFERENCE.sub(lambda m: json.dumps(lookup[m.group(1)])[1:-1] if m.group(1) in lookup else m.group(0),
                            text)
        if new == text:
            break
        text = new
    return json.loads(text)


def normalize_prefix(prefix: str) -> str:
    """apply_presets.go's normalizePrefix: ``[dev alice] `` -> ``dev_alice_`` (for names that allow no
    brackets or spaces: schemas, serving endpoints, registered models)."""
    stripped = prefix.replace("[", "").strip(" ")
    suffix = "_" if stripped.endswith("]") else ""
    name = re.sub(r"_+", "_", "".join(c if c.isalnum() else "_" for c in stripped.lower())).strip("_")
    return name + suffix


def deploy(bundle: dict[str, Any], target: str, deployer: Deployer,
           variables: dict[str, str] | None = None) -> Deployment:
    """``bundle`` (from :func:`load_bundle`) as ``deployer`` deploys ``target`` with ``--var`` ``variables``."""
    spec = bundle["targets"][target] or {}
    mode = spec.get("mode", "")
    values = {name: v.get("default") for name, v in (bundle.get("variables") or {}).items()}
    values.update(spec.get("variables") or {})
    values.update(variables or {})
    workspace = merge(bundle.get("workspace") or {}, spec.get("workspace") or {})
    explicit_root = "root_path" in (spec.get("workspace") or {})
    lookup: dict[str, str] = {
        "bundle.name": bundle["bundle"]["name"],
        "bundle.target": target,
        "workspace.current_user.userName": deployer.user_name,
        "workspace.current_user.short_name": deployer.short_name,
        "workspace.current_user.domain_friendly_name": deployer.domain_friendly_name,
    }
    lookup.update({f"var.{k}": str(v) for k, v in values.items() if v is not None})
    root = workspace.get("root_path") or f"~/.bundle/{bundle['bundle']['name']}/{target}"
    root = str(_substitute(root, lookup))
    if root.startswith("~/"):
        root = f"/Workspace/Users/{deployer.user_name}/{root[2:]}"
    lookup["workspace.root_path"] = root
    lookup["workspace.file_path"] = workspace.get("file_path") or f"{root}/files"
    lookup["workspace.artifact_path"] = workspace.get("artifact_path") or f"{root}/artifacts"
    resolved_values = {k[4:]: v for k, v in _substitute(lookup, lookup).items() if k.startswith("var.")}

    resources = merge(copy.deepcopy(bundle.get("resources") or {}), copy.deepcopy(spec.get("resources") or {}))
    resources = _substitute(resources, lookup)
    run_as_present = "run_as" in spec or "run_as" in bundle
    run_as_spec = spec["run_as"] if "run_as" in spec else bundle.get("run_as")
    run_as_spec = _substitute(run_as_spec, lookup) if run_as_spec is not None else None
    run_as = None
    if isinstance(run_as_spec, dict):
        run_as = run_as_spec.get("service_principal_name") or run_as_spec.get("user_name") or None
        for job in resources.get("jobs", {}).values():
            job.setdefault("run_as", {k: v for k, v in run_as_spec.items() if v})

    presets = dict(spec.get("presets") or bundle.get("presets") or {})
    deployment = Deployment(target=target, mode=mode, deployer=deployer, run_as=run_as, run_as_spec=run_as_spec,
                            root_path=root, root_path_explicit=explicit_root, variables=resolved_values,
                            resources=resources, presets=presets, run_as_present=run_as_present,
                            permissions=_substitute(list(spec.get("permissions", bundle.get("permissions")) or []),
                                                    lookup))
    if mode == "development":
        _apply_development_mode(deployment)
    return deployment


def _apply_development_mode(d: Deployment) -> None:
    """apply_target_mode.go + apply_presets.go for development mode: name prefix, paused triggers."""
    prefix = d.presets.setdefault("name_prefix", f"[dev {d.deployer.short_name}] ")
    pause = d.presets.setdefault("trigger_pause_status", "PAUSED")
    for job in d.jobs().values():
        job["name"] = prefix + job.get("name", "")
        for trigger in ("schedule", "continuous", "trigger"):
            if isinstance(job.get(trigger), dict) and not job[trigger].get("pause_status"):
                job[trigger]["pause_status"] = pause
    for kind in ("pipelines", "models", "clusters"):
        name_key = "cluster_name" if kind == "clusters" else "name"
        for resource in d.resources.get(kind, {}).values():
            resource[name_key] = prefix + resource.get(name_key, "")
    for kind in ("schemas", "model_serving_endpoints", "registered_models"):
        for resource in d.resources.get(kind, {}).values():
            resource["name"] = normalize_prefix(prefix) + resource.get("name", "")
    for dashboard in d.resources.get("dashboards", {}).values():
        dashboard["display_name"] = prefix + dashboard.get("display_name", "")
    # apps: no presets (apply_presets.go)


def check(bundle: dict[str, Any], target: str, deployer: Deployer,
          variables: dict[str, str] | None = None) -> Report:
    """The CLI's verdict on ``deployer`` deploying ``target`` of ``bundle``."""
    return check_deployment(deploy(bundle, target, deployer, variables))


def check_deployment(d: Deployment) -> Report:
    errors: list[Finding] = []
    recommendations: list[Finding] = []
    errors += _validate_run_as(d)
    if d.mode == "production":
        e, r = _validate_production(d)
        errors += e
        recommendations += r
    elif d.mode == "development":
        errors += _validate_development(d)
    elif d.mode:
        errors.append(Finding("mode", f"unsupported value {d.mode!r} specified for 'mode'"))
    recommendations += _permission_diagnostics(d)
    return Report(tuple(errors), tuple(recommendations))


def _permission_diagnostics(d: Deployment) -> list[Finding]:
    """bundle/permissions/permission_diagnostics.go: a permissions section that does not give the deployer
    (by name; groups are not modelled) CAN_MANAGE is a recommendation: without it, CAN_MANAGE applies only while
    that identity deploys."""
    if not d.permissions:
        return []
    me = d.deployer.user_name
    if any(p.get("level") == "CAN_MANAGE" and me in (p.get("user_name"), p.get("service_principal_name"))
           for p in d.permissions):
        return []
    return [Finding("permissions.deployer", f"permissions section should explicitly include the current deployment "
                                            f"identity '{me}' or one of its groups")]


def _validate_run_as(d: Deployment) -> list[Finding]:
    if not d.run_as_present:
        return []
    spec = d.run_as_spec if isinstance(d.run_as_spec, dict) else {}
    sp, user = spec.get("service_principal_name") or "", spec.get("user_name") or ""
    if not sp and not user:
        return [Finding("run_as.empty", "run_as section must specify exactly one identity")]
    out = []
    if sp and user:
        out.append(Finding("run_as.both", "run_as section cannot specify both user_name and service_principal_name"))
    identity = sp or user
    if identity == d.deployer.user_name:
        return out
    for kind in RUN_AS_REFUSED:
        if d.resources.get(kind):
            out.append(Finding(f"run_as.{kind}",
                               f"{kind} do not support a run_as identity ({identity}) different from the deploying "
                               f"identity ({d.deployer.user_name})"))
    for name, dashboard in d.resources.get("dashboards", {}).items():
        if dashboard.get("embed_credentials"):
            out.append(Finding("run_as.dashboards", f"dashboard {name} with embed_credentials cannot run as {identity}"))
    return out


def _validate_production(d: Deployment) -> tuple[list[Finding], list[Finding]]:
    for pipeline in d.resources.get("pipelines", {}).values():
        if pipeline.get("development"):
            return [Finding("production.pipeline_development",
                            "target with 'mode: production' cannot include a pipeline with 'development: true'")], []
    if d.root_path_explicit:
        return [], []
    every_job_runs_as = all(job.get("run_as") for job in d.jobs().values())
    finding = Finding("production.root_path",
                      "target with 'mode: production' should set 'workspace.root_path' to make sure only one copy "
                      "is deployed")
    if every_job_runs_as or d.deployer.is_service_principal:
        return [], [finding]
    return [finding], []


def _validate_development(d: Deployment) -> list[Finding]:
    out = []
    if d.presets.get("trigger_pause_status") == "UNPAUSED":
        out.append(Finding("development.unpaused",
                           "target with 'mode: development' cannot set trigger pause status to UNPAUSED by default"))
    names = (d.deployer.user_name, d.deployer.short_name)
    if d.root_path_explicit and not any(n and n in d.root_path for n in names):
        out.append(Finding("development.root_path",
                           "root_path must start with '~/' or contain the current username when using "
                           "'mode: development'"))
    prefix = d.presets.get("name_prefix", "")
    if prefix and not any(n and n in prefix for n in (*names, d.deployer.domain_friendly_name)):
        out.append(Finding("development.prefix", "prefix should contain the current username"))
    return out


# -- what a deploy of Heartbeat needs beyond the CLI's rules (issue 51) -----------------------------------


APP_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,28}[a-z0-9]$")  # Databricks Apps: 2-30 chars, lower case, dashes


def reader_of_bundle_folder(d: Deployment, identity: str) -> bool:
    """Whether ``identity`` can read the deployed bundle folder (the wheel, the dbt project, the seed CSV).

    A folder under ``/Workspace/Users/<owner>/`` is readable by its owner only (and admins), unless the
    bundle's top-level or target ``permissions`` grant the identity a level (the CLI applies them to the
    root folder too). A folder elsewhere (``/Workspace/Shared``) needs such a grant just the same for
    anyone who did not deploy it."""
    match = re.match(r"^/Workspace/Users/([^/]+)/", d.root_path)
    if match and match.group(1) == identity:
        return True
    if identity == d.deployer.user_name:
        return True
    return any(identity in (p.get("service_principal_name"), p.get("user_name")) for p in d.permissions)


def heartbeat_findings(bundle: dict[str, Any], deployments: list[Deployment]) -> dict[int, list[str]]:
    """Issue 51's rows 2, 4, 5 and 7, as problems found over a set of deployments (every target with its
    deployer, two developers for dev): row number -> what is wrong. Empty when none."""
    rows: dict[int, list[str]] = {}
    for d in deployments:
        runner = d.jobs().get("heartbeat_runner", {})
        identity = d.run_as or d.deployer.user_name
        if not reader_of_bundle_folder(d, identity):
            rows.setdefault(2, []).append(f"{d.target}: {identity} runs the jobs but cannot read {d.root_path}")
        if d.mode == "production":
            notes = runner.get("email_notifications") or {}
            if not [a for a in notes.get("on_failure") or [] if a]:
                rows.setdefault(7, []).append(f"{d.target}: no one is e-mailed when the runner's run fails")
            rules = (runner.get("health") or {}).get("rules") or []
            if "schedule" in runner and not any(r.get("metric") == "RUN_DURATION_SECONDS" for r in rules):
                rows.setdefault(7, []).append(f"{d.target}: no run-duration health rule on the scheduled runner")
        for app in d.apps().values():
            if not APP_NAME.match(str(app.get("name", ""))):
                rows.setdefault(5, []).append(f"{d.target}: app name {app.get('name')!r} is not a valid app name")
    schemas: dict[tuple[str, str], list[str]] = {}
    apps: dict[str, list[str]] = {}
    for d in deployments:
        env = (d.jobs().get("heartbeat_runner", {}).get("job_clusters") or [{}])[0].get("new_cluster", {}).get(
            "spark_env_vars", {})
        where = (str(env.get("HEARTBEAT_CATALOG")), str(env.get("HEARTBEAT_SCHEMA")))
        schemas.setdefault(where, []).append(f"{d.target} by {d.deployer.user_name}")
        for app in d.apps().values():
            apps.setdefault(str(app.get("name")), []).append(f"{d.target} by {d.deployer.user_name}")
    for (catalog, schema), users in schemas.items():
        dev = [u for u in users if u.startswith("dev ")]
        if len(dev) > 1 or (dev and len(users) > len(dev)):
            rows.setdefault(4, []).append(f"{catalog}.{schema} is shared by {', '.join(users)}")
    for name, users in apps.items():
        if len(users) > 1:
            rows.setdefault(5, []).append(f"app {name} is claimed by {', '.join(users)}")
    return rows


# -- the privileges table of docs/databricks.md ------------------------------------------------------------


PRIVILEGES_HEADING = "## Privileges of each identity"


@dataclass(frozen=True)
class Grant:
    """One row of the table under :data:`PRIVILEGES_HEADING`: ``identity`` (runner, seed, app, downstream)
    holds ``privilege`` on ``securable`` ``object`` (placeholders such as ``<catalog>`` kept) ``when`` the
    condition holds (``always`` or a sentence)."""

    identity: str
    privilege: str
    securable: str
    object: str
    when: str

    def sql(self, names: dict[str, str], grantee: str) -> str | None:
        """The Unity Catalog statement granting this, with ``names`` for the placeholders (``catalog`` ->
        ``main``); None for a grant made elsewhere (job permissions, secret ACLs, folders)."""
        if self.securable not in ("CATALOG", "SCHEMA", "TABLE", "VOLUME"):
            return None
        target = self.object
        for key, value in names.items():
            target = target.replace(f"<{key}>", value)
        return f"GRANT {self.privilege} ON {self.securable} {target} TO `{grantee}`"


def documented_privileges(doc: Path) -> list[Grant]:
    """The grants of docs/databricks.md's privileges table, in the table's order."""
    section = doc.read_text().split(PRIVILEGES_HEADING + "\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [c.strip() for c in rows[0].strip("|").split("|")]
    assert header[:5] == ["identity", "privilege", "securable", "object", "when"], header
    grants = []
    for line in rows[2:]:
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        grants.append(Grant(*cells[:5]))
    return grants
