"""The runner's files as the identity its jobs run as reads them (issue 51, row 2): a separate OS user stands in
for each workspace identity, and the operating system, not the checker, decides who reads what.

A deployment is laid out on this disk as the workspace holds it:

- ``/Workspace/Users/<owner>/`` is its owner's alone; the folders from there down to the bundle folder
  (``root_path``) can be passed through by anyone but listed by the owner only, and the bundle folder with the
  uploaded project (``files/``) and the wheel (``artifacts/.internal/``) is readable by its owner only;
- the only grants are the bundle's ``permissions`` (the CLI applies them to the bundle folder) and the FOLDER
  rows of docs/databricks.md's privileges table (a grant on a folder reaches everything under it); each is a
  group of OS users that may read the bundle folder;
- the deployer's OS user owns what the deploy uploads.

Then the jobs' identity (``run_as``, else the deployer) does what a job cluster does as that identity: installs the
wheel from the bundle folder, runs the seed job's command, and ticks once with the runner job's command, with the
cluster's ``spark_env_vars`` (the bundle folder and ``/local_disk0`` mapped onto this disk; the local engine and
jobs stand in for the workspace's). With today's bundle every documented deploy works; with the bundle of
7fe6466 deployed as its docs said (a person deploys prod, the jobs run as the service principal) the principal
cannot read the project, and the seed job fails saying so.

Needs root (to make users): elsewhere it is skipped, and says why.
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from bundle_rules import Deployer, Deployment, deploy, documented_privileges, load_bundle, workspace_files
from harness import HEADER as CONFIG_HEADER
from harness import config_row
from test_bundle_rules import ALICE, CI, DOCS, OLD, REPO, SP, VARS

#: the file name the cluster installs the package from (a wheel's: name, version, tags)
WHEEL = "heartbeat_runner-0-py3-none-any.whl"

pytestmark = [
    pytest.mark.slow,  # three seed jobs, two ticks and three installs as processes of other users: the CI leg's
    pytest.mark.skipif(os.geteuid() != 0, reason="makes OS users to stand in for workspace identities: needs root"),
]


def os_user(identity: str) -> str:
    """The OS user standing in for a workspace identity (an e-mail or an application id): ``hbw-`` and a digest,
    a valid user name whatever the identity's characters."""
    return "hbw-" + hashlib.sha256(identity.encode()).hexdigest()[:10]


def ensure_user(name: str) -> pwd.struct_passwd:
    """The OS user ``name``, made (no home, no login) if missing; another worker making it at once is fine."""
    try:
        return pwd.getpwnam(name)
    except KeyError:
        done = subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                              capture_output=True, text=True)
        assert done.returncode in (0, 9), done.stderr  # 9: made by another worker meanwhile
        return pwd.getpwnam(name)


def ensure_group(name: str, members: list[str]) -> int:
    """The OS group ``name`` holding ``members`` (OS users); its id."""
    try:
        gid = grp.getgrnam(name).gr_gid
    except KeyError:
        done = subprocess.run(["groupadd", "--system", name], capture_output=True, text=True)
        assert done.returncode in (0, 9), done.stderr
        gid = grp.getgrnam(name).gr_gid
    for member in members:
        subprocess.run(["usermod", "--append", "--groups", name, member], check=True, capture_output=True)
    return gid


@dataclass(frozen=True)
class Workspace:
    """A workspace's file tree on this disk: ``/Workspace/...`` is ``root/Workspace/...``, the cluster's
    ``/local_disk0`` is ``root/local_disk0``."""

    root: Path

    def path(self, workspace_path: str) -> Path:
        return self.root / workspace_path.lstrip("/")

    def cluster_value(self, value: str) -> str:
        """A ``spark_env_vars`` value with the workspace's and the cluster's paths on this disk."""
        return value.replace("/Workspace/", f"{self.root}/Workspace/").replace("/local_disk0", f"{self.root}/local_disk0")


@pytest.fixture
def workspace() -> Iterator[Workspace]:
    """An empty workspace tree other users can pass through (pytest's own temporary folders are root's alone)."""
    root = Path(tempfile.mkdtemp(prefix="hb-workspace-", dir="/tmp"))
    root.chmod(0o755)
    try:
        yield Workspace(root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def readers_granted(d: Deployment) -> set[str]:
    """The identities granted the bundle folder of ``d`` beside its owner: the bundle's permissions naming a user
    or a service principal, and the privileges table's FOLDER rows whose folder holds the bundle folder (a
    ``<runner>`` there is the jobs' identity)."""
    runner = d.run_as or d.deployer.user_name
    granted = {p.get("service_principal_name") or p.get("user_name") for p in d.permissions}
    for grant in documented_privileges(DOCS):
        if grant.securable == "FOLDER" and grant.identity in ("runner", "seed"):
            folder = grant.object.replace("<runner>", runner).rstrip("/")
            if d.root_path == folder or d.root_path.startswith(folder + "/"):
                granted.add(runner)
    return {g for g in granted if g}


def wheel_of_the_checkout(out: Path) -> Path:
    """The package as a wheel holds it (a zip of ``heartbeat_runner/``): what the cluster installs."""
    wheel = out / WHEEL
    with zipfile.ZipFile(wheel, "w") as archive:
        for path in sorted((REPO / "heartbeat_runner").rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                archive.write(path, path.relative_to(REPO).as_posix())
    return wheel


def lay_out(ws: Workspace, d: Deployment, config_csv: str, wheel: Path) -> None:
    """What ``bundle deploy`` leaves: the project in ``files/``, the wheel in ``artifacts/.internal/``, owned by
    the deployer, readable by the owner of the bundle folder and by the identities granted it."""
    deployer = ensure_user(os_user(d.deployer.user_name))
    root = ws.path(d.root_path)
    files = workspace_files(REPO, root / "files")
    (files / "seeds" / "heartbeat_sensor_config.csv").write_text(config_csv)
    (root / "artifacts" / ".internal").mkdir(parents=True)
    shutil.copyfile(wheel, root / "artifacts" / ".internal" / wheel.name)

    readers = sorted(ensure_user(os_user(i)).pw_name for i in readers_granted(d))
    group = ensure_group("hbg-" + hashlib.sha256(d.root_path.encode()).hexdigest()[:10], readers)
    for path in [root, *root.rglob("*")]:
        os.chown(path, deployer.pw_uid, group)
        path.chmod(0o750 if path.is_dir() else 0o640)
    # from the owner's home down to the bundle folder: pass through, not list
    home = ws.path("/Workspace/Users/" + d.root_path.split("/")[3])
    folder = root.parent
    while True:
        os.chown(folder, deployer.pw_uid, deployer.pw_gid)
        folder.chmod(0o711)
        if folder == home:
            break
        folder = folder.parent


def cluster_env(ws: Workspace, d: Deployment, job: str, home: Path) -> dict[str, str]:
    """The job cluster's environment for ``job``: its ``spark_env_vars`` on this disk, the local engine and jobs."""
    cluster = d.jobs()[job]["job_clusters"][0]["new_cluster"]
    # the local engine stands in for Unity Catalog: one catalog, so the cluster's HEARTBEAT_CATALOG is left out
    env = {k: ws.cluster_value(str(v)) for k, v in cluster["spark_env_vars"].items() if k != "HEARTBEAT_CATALOG"}
    return {"PATH": os.environ["PATH"], "HOME": str(home), "LANG": "C.UTF-8", **env,
            "HEARTBEAT_TARGET": "local", "HEARTBEAT_JOBS_BACKEND": "local", "PYTHONPATH": f"{home / 'site'}:{packages_path()}"}


def runtime_python() -> str:
    """An interpreter every user may run, of this one's version (the cluster's Python): this one if its folders
    let others through, else the system's (a venv's interpreter often links into root's home)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (Path(sys.executable).resolve(), Path("/usr/bin") / version):
        if candidate.is_file() and all(p.stat().st_mode & 0o001 for p in [candidate, *candidate.parents]):
            return str(candidate)
    pytest.skip(f"no {version} that other users may run (the cluster's Python)")


def packages_path() -> str:
    """Where this environment's packages are (the wheel's dependencies, which the cluster installs beside it)."""
    return next(p for p in sys.path if p.endswith("site-packages") and Path(p, "pyspark").is_dir())


def task_command(ws: Workspace, d: Deployment, job: str) -> list[str]:
    """The job's wheel task as a command line (its paths on this disk), on the local engine."""
    (task,) = d.jobs()[job]["tasks"]
    parameters = [ws.cluster_value(str(p)) for p in task["python_wheel_task"]["parameters"]]
    if "--target" in parameters:
        at = parameters.index("--target")
        del parameters[at:at + 2]
    return [runtime_python(), "-m", "heartbeat_runner", *parameters]


@dataclass(frozen=True)
class ClusterRun:
    """What the jobs' identity met on the cluster: the wheel's install, then each job's exit and output."""

    installed: subprocess.CompletedProcess
    seed: subprocess.CompletedProcess | None = None
    tick: subprocess.CompletedProcess | None = None


def run_as_jobs_identity(ws: Workspace, d: Deployment, wheel: Path | None = None) -> ClusterRun:
    """Install the wheel (the bundle folder's, or ``wheel``) and run the seed job, then one tick, as the OS user of
    the jobs' identity; what it met, up to the first failure."""
    identity = ensure_user(os_user(d.run_as or d.deployer.user_name))
    home = ws.root / "cluster-home"
    (home / "site").mkdir(parents=True, exist_ok=True)
    disk = ws.root / "local_disk0"
    disk.mkdir(exist_ok=True)
    for path in (home, home / "site", disk):
        os.chown(path, identity.pw_uid, identity.pw_gid)
    groups = [g.gr_gid for g in grp.getgrall() if identity.pw_name in g.gr_mem]

    def as_identity(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
        return subprocess.run(command, env=env, cwd=home, user=identity.pw_uid, group=identity.pw_gid,
                              extra_groups=groups, capture_output=True, text=True, timeout=600)

    wheel = wheel or ws.path(f"{d.root_path}/artifacts/.internal/{WHEEL}")
    env = cluster_env(ws, d, "heartbeat_seed", home)
    installed = as_identity([runtime_python(), "-c", "import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall("
                             "sys.argv[2])", str(wheel), str(home / "site")], env)
    if installed.returncode != 0:
        return ClusterRun(installed)
    seed = as_identity(task_command(ws, d, "heartbeat_seed"), env)
    if seed.returncode != 0:
        return ClusterRun(installed, seed)
    return ClusterRun(installed, seed, as_identity(task_command(ws, d, "heartbeat_runner"),
                                                   cluster_env(ws, d, "heartbeat_runner", home)))


def deployed(ws: Workspace, bundle_root: Path, target: str, deployer: Deployer) -> Deployment:
    d = deploy(load_bundle(bundle_root), target, deployer, VARS)
    wheel = wheel_of_the_checkout(ws.root)
    trigger_dir = ws.root / "landing"
    trigger_dir.mkdir(mode=0o777)
    lay_out(ws, d, "\n".join([CONFIG_HEADER, config_row("trigger_file", str(trigger_dir / "ready"), "J1")]) + "\n",
            wheel)
    return d


@pytest.mark.parametrize("target, deployer", [("dev", ALICE), ("prod", CI)], ids=["dev-by-a-person", "prod-by-ci"])
def test_the_jobs_identity_installs_the_wheel_seeds_and_ticks_from_the_bundle_folder(workspace, target, deployer):
    """Every target deployed as docs/databricks.md says: the jobs' identity reads what the deploy uploaded."""
    d = deployed(workspace, REPO, target, deployer)
    ran = run_as_jobs_identity(workspace, d)
    assert ran.installed.returncode == 0, ran.installed.stderr
    assert ran.seed is not None and ran.seed.returncode == 0, ran.seed and ran.seed.stderr
    assert ran.tick is not None and ran.tick.returncode == 0, ran.tick.stderr
    assert "Traceback" not in ran.seed.stderr + ran.tick.stderr
    identity = os_user(d.run_as or d.deployer.user_name)
    lakehouse = workspace.root / "local_disk0" / "heartbeat"
    assert pwd.getpwuid(lakehouse.stat().st_uid).pw_name == identity  # the tick wrote as the jobs' identity


def test_the_principal_cannot_read_the_bundle_a_person_deployed_and_the_seed_job_says_which_file(workspace):
    """The bundle of 7fe6466, deployed as its docs said: a person deploys prod into their own folder and the jobs
    run as the service principal, which nothing grants that folder. Its owner reads it; the principal cannot
    install the wheel, and the seed job fails (exit non-zero: the run ends FAILED) naming what it could not read,
    without a traceback."""
    d = deployed(workspace, OLD, "prod", ALICE)
    assert d.run_as == SP and d.root_path.startswith(f"/Workspace/Users/{ALICE.user_name}/")
    owner = ensure_user(os_user(ALICE.user_name))
    config = workspace.path(d.root_path) / "files" / "seeds" / "heartbeat_sensor_config.csv"
    read_by_owner = subprocess.run(["cat", str(config)], user=owner.pw_uid, group=owner.pw_gid, capture_output=True)
    assert read_by_owner.returncode == 0, read_by_owner.stderr
    ran = run_as_jobs_identity(workspace, d)
    assert ran.installed.returncode != 0 and "Permission denied" in ran.installed.stderr
    assert ran.seed is None  # the cluster cannot install the wheel: the run fails before its task
    # with the wheel installed from elsewhere (the copy the deploy uploaded), the seed job cannot read the project
    # either, and says so
    ran = run_as_jobs_identity(workspace, d, wheel=workspace.root / WHEEL)
    assert ran.installed.returncode == 0, ran.installed.stderr
    assert ran.seed is not None and ran.seed.returncode != 0 and ran.tick is None
    said = ran.seed.stdout + ran.seed.stderr
    assert "Traceback" not in said and "ermission denied" in said and str(workspace.path(d.root_path)) in said, said
