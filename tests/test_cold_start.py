"""A cold tick starts from what the last process left: dbt's parsed manifest, saved under the digest of
everything the parse read, is used only when nothing changed; a broken or foreign file means "parse"."""

from __future__ import annotations

import pickle
import shutil
import subprocess
import sys
from pathlib import Path

from harness import HEADER, CliLakehouse, Harness, marker_jobs_file, project_copy
from harness import config_row as row

from heartbeat_runner.lakehouse.dbt_invoke import MANIFEST_CACHE, ManifestCache

REPO = Path(__file__).resolve().parents[1]


def test_a_saved_manifest_is_served_only_for_the_inputs_it_was_parsed_from(tmp_path):
    path = tmp_path / MANIFEST_CACHE
    ManifestCache(path, "a" * 64).save({"nodes": ["m"]})
    assert ManifestCache(path, "a" * 64).load() == {"nodes": ["m"]}
    assert ManifestCache(path, "b" * 64).load() is None, "other inputs: not cached"
    assert ManifestCache(tmp_path / "missing.pickle", "a" * 64).load() is None


def test_a_corrupt_or_partial_saved_manifest_is_not_cached(tmp_path):
    path = tmp_path / MANIFEST_CACHE
    cache = ManifestCache(path, "a" * 64)
    cache.save({"nodes": ["m"]})
    whole = path.read_bytes()
    for broken in (whole[: len(whole) - 5], b"", b"not a manifest", whole.split(b"\n", 1)[0] + b"\ngarbage"):
        path.write_bytes(broken)
        assert cache.load() is None
    path.write_bytes(whole.split(b"\n", 1)[0] + b"\n" + pickle.dumps(None))
    assert cache.load() is None


def test_a_saved_manifest_others_may_write_is_never_loaded(tmp_path):
    """The cache is a pickle: in a lakehouse folder shared with other users, a file they could have written
    is not loaded (the next parse replaces it)."""
    path = tmp_path / MANIFEST_CACHE
    cache = ManifestCache(path, "a" * 64)
    cache.save({"nodes": ["m"]})
    assert path.stat().st_mode & 0o777 == 0o600 and cache.load() == {"nodes": ["m"]}
    for mode in (0o620, 0o602, 0o666):
        path.chmod(mode)
        assert cache.load() is None, oct(mode)


def _columns(hb: Harness, view: str) -> list[str]:
    return hb.spark.table(f"heartbeat.{view}").columns


def test_a_new_process_reuses_the_parse_until_a_model_changes_and_survives_a_corrupt_cache(tmp_path):
    project = project_copy(tmp_path)
    env = {"HEARTBEAT_PROJECT_DIR": str(project)}
    with Harness(tmp_path, **env) as hb:
        hb.seed(row("trigger_file", "drops", "J"))
        saved = hb.app.dbt.work_dir / MANIFEST_CACHE
        written = saved.stat().st_mtime_ns
        before = _columns(hb, "heartbeat_sensing_errors")
    with Harness(tmp_path, **env) as hb:
        hb.app.dbt.build_all()  # a build in a new process: served from the saved parse, not parsed again
        assert saved.stat().st_mtime_ns == written
        assert _columns(hb, "heartbeat_sensing_errors") == before

    view = project / "models" / "heartbeat_sensing_errors.sql"
    view.write_text(view.read_text().replace("r.error as sensing_error\n",
                                             "r.error as sensing_error,\n  'new' as added_by_the_change\n"))
    with Harness(tmp_path, **env) as hb:
        hb.app.dbt.build_all()  # the model changed: parsed again, and the build has the change
        assert _columns(hb, "heartbeat_sensing_errors") == [*before, "added_by_the_change"]
    assert saved.stat().st_mtime_ns != written, "the new parse is saved for the next process"

    saved.write_bytes(b"heartbeat-dbt-manifest " + b"0" * 10)
    with Harness(tmp_path, **env) as hb:
        hb.app.dbt.build_all()  # a corrupt file: parsed again
        assert _columns(hb, "heartbeat_sensing_errors") == [*before, "added_by_the_change"]
    assert ManifestCache(saved, saved.read_bytes().split(b"\n", 1)[0].split(b" ")[1].decode()).load() is not None


def _modules_after(*argv: str, tmp_path: Path, env: dict[str, str] | None = None) -> set[str]:
    """The modules ``python -m heartbeat_runner ARGV`` has loaded when it exits (it must exit 0)."""
    probe = ("import runpy, sys, atexit\n"
             "out = sys.argv[1]\n"
             "atexit.register(lambda: open(out, 'w').write('\\n'.join(sys.modules)))\n"
             f"sys.argv = ['heartbeat', *{list(argv)!r}]\n"
             "runpy.run_module('heartbeat_runner', run_name='__main__')\n")
    out = tmp_path / "modules.txt"
    done = subprocess.run([sys.executable, "-c", probe, str(out)], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env=env, check=False)
    assert done.returncode == 0, done.stderr
    return set(out.read_text().split())


def test_the_version_and_the_command_line_load_no_engine_dbt_or_dataframe_library(tmp_path):
    loaded = _modules_after("--version", tmp_path=tmp_path)
    assert "heartbeat_runner.interfaces.cli" in loaded, "the probe ran the command line"
    heavy = {"dbt.cli.main", "pyspark", "pyspark.sql.connect.session", "pandas", "pyarrow", "databricks.sdk",
             "deltalake"}
    assert not heavy & loaded


def test_a_tick_with_nothing_new_loads_no_dbt(tmp_path):
    config = tmp_path / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drops", "J1")]) + "\n")
    lake = CliLakehouse(tmp_path / "lakehouse", config=config, jobs_file=marker_jobs_file(tmp_path / "jobs.yml", "J1"))
    lake.home.mkdir(parents=True)
    lake.cli("seed")
    lake.cli("run")  # the first tick sets the baseline
    loaded = _modules_after("run", tmp_path=tmp_path, env=lake.env)
    assert "heartbeat_runner.runner.tick" in loaded, "the probe ran a tick"
    assert "dbt.cli.main" not in loaded, "nothing moved: no build, so dbt is not even imported"
