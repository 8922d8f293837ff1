"""The settings declaration: every HEARTBEAT_* variable declared once, refused with a clear error, and the
README's table generated from it."""

from __future__ import annotations

import inspect
import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from cli_runner import run_cli

from heartbeat_runner.core import settings as settings_module
from heartbeat_runner.core.durations import DurationError, parse_duration, parse_seconds
from heartbeat_runner.core.errors import InvalidInputError
from heartbeat_runner.core.settings import (
    HeartbeatEnvironment,
    SettingsError,
    Target,
    load_settings,
    settings_table,
    with_settings_table,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "heartbeat_runner"


def refusal(**env: str) -> str:
    """The message load_settings refuses ``env`` with."""
    with pytest.raises(SettingsError) as caught:
        load_settings(lakehouse_dir="/tmp/lh", env=env)
    assert isinstance(caught.value, InvalidInputError)
    return str(caught.value)


# -- one test per class of variable ---------------------------------------------------------------

def test_a_number_out_of_range_is_refused_with_its_name_value_and_range():
    message = refusal(HEARTBEAT_MAX_WORKERS="-3")
    assert "HEARTBEAT_MAX_WORKERS='-3'" in message
    assert "at least 1" in message


def test_a_bad_duration_is_refused_with_its_name_and_the_accepted_forms():
    message = refusal(HEARTBEAT_SENSOR_TIMEOUT="abc")
    assert "HEARTBEAT_SENSOR_TIMEOUT='abc'" in message
    assert "90s, 15m, 1.5h, 2d, 1w" in message and "greater than 0" in message


def test_a_bad_boolean_is_refused_with_its_name_and_the_one_dialect():
    message = refusal(HEARTBEAT_CANCEL_OVERDUE_RUNS="maybe")
    assert "HEARTBEAT_CANCEL_OVERDUE_RUNS='maybe'" in message
    assert "true/false, 1/0, yes/no or on/off" in message


def test_a_bad_path_is_refused_with_its_name():
    message = refusal(HEARTBEAT_CONFIG="seeds/\0config.csv")
    assert "HEARTBEAT_CONFIG=" in message and "NUL" in message and "a path" in message


def test_a_value_outside_an_enum_is_refused_with_its_name_and_the_choices():
    message = refusal(HEARTBEAT_TARGET="cloud")
    assert "HEARTBEAT_TARGET='cloud'" in message
    assert "`local`, `spark-local`, `spark` or `databricks`" in message


@pytest.mark.parametrize("target", [Target.LOCAL, Target.SPARK_LOCAL])
def test_a_catalog_on_a_target_of_one_catalog_is_refused_with_its_name(target):
    """A job cluster's environment (HEARTBEAT_CATALOG=main) on a laptop's engine: a clear refusal, not a
    'database not found' from the engine at the first statement."""
    message = refusal(HEARTBEAT_CATALOG="main", HEARTBEAT_TARGET=target.value)
    assert "HEARTBEAT_CATALOG='main'" in message and f"target {target.value!r} has one catalog" in message
    assert load_settings(lakehouse_dir="/tmp/lh", env={"HEARTBEAT_TARGET": target.value}).catalog is None


@pytest.mark.parametrize("target", [Target.SPARK, Target.DATABRICKS])
def test_a_catalog_is_taken_where_catalogs_are_unity_catalogs(target):
    settings = load_settings(lakehouse_dir="/tmp/lh", env={"HEARTBEAT_CATALOG": "main", "HEARTBEAT_TARGET": target.value})
    assert settings.catalog == "main"


def test_every_bad_variable_is_reported_at_once():
    with pytest.raises(SettingsError) as caught:
        load_settings(lakehouse_dir="/tmp/lh", env={"HEARTBEAT_MAX_WORKERS": "-3", "HEARTBEAT_IDLE_FLUSH": "soon",
                                                   "HEARTBEAT_SCHEMA": "my-schema"})
    named = [problem.split("=", 1)[0] for problem in caught.value.problems]
    assert sorted(named) == ["HEARTBEAT_IDLE_FLUSH", "HEARTBEAT_MAX_WORKERS", "HEARTBEAT_SCHEMA"]


# -- the forms accepted ---------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("15m", 900), ("1.5h", 5400), ("2d", 172800),
                                               ("1w", 604800), ("30", 30), (" 2.5 ", 2.5), (45, 45)])
def test_the_duration_grammar(text, seconds):
    assert parse_seconds(text) == seconds
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["-5", "-1h", "1y", "h", "", "1h30m", "nan", True])
def test_the_duration_grammar_refuses_negatives_and_garbage(text):
    with pytest.raises(DurationError, match="is not a duration such as 90s"):
        parse_seconds(text)


def test_zero_is_a_duration_only_where_it_means_off():
    assert load_settings(env={"HEARTBEAT_ENGINE_PARK_AFTER_S": "0"}).memory.engine_park_after_s == 0
    assert "greater than 0" in refusal(HEARTBEAT_LEASE_TTL="0")


@pytest.mark.parametrize(("text", "value"), [("true", True), ("YES", True), ("On", True), ("1", True),
                                             ("false", False), ("No", False), ("OFF", False), ("0", False)])
def test_booleans_have_one_dialect(text, value):
    chosen = load_settings(env={"HEARTBEAT_REPLAY_NEW_SENSORS": text, "HEARTBEAT_MAINTENANCE": text})
    assert chosen.replay_new_sensors is value and chosen.auto_maintenance is value


def test_durations_in_settings_take_units_and_blank_means_unset():
    chosen = load_settings(env={"HEARTBEAT_SENSOR_TIMEOUT": "1.5m", "HEARTBEAT_MAX_RUN_DURATION": "2h",
                                "HEARTBEAT_LEASE_WAIT": "", "HEARTBEAT_TARGET": " "})
    assert chosen.sensor_timeout_s == 90 and chosen.max_run_duration_s == 7200
    assert chosen.lease_wait_s == 30 and chosen.target is Target.LOCAL


def test_flags_win_over_the_environment():
    chosen = load_settings(lakehouse_dir="/tmp/flag", target="spark-local",
                           env={"HEARTBEAT_HOME": "/tmp/env", "HEARTBEAT_TARGET": "databricks"})
    assert chosen.lakehouse_dir == Path("/tmp/flag") and chosen.target is Target.SPARK_LOCAL


# -- the run-policy file's two names --------------------------------------------------------------

def test_the_run_policy_file_is_heartbeat_run_policy():
    chosen = load_settings(env={"HEARTBEAT_RUN_POLICY": "/tmp/policies.yml"})
    assert chosen.run_policy_file == Path("/tmp/policies.yml")
    assert chosen.retry_policy_file == chosen.run_policy_file  # the old attribute name still reads it


def test_the_old_name_still_works_with_one_deprecation_line(monkeypatch, caplog):
    monkeypatch.setattr(settings_module, "_warned", [])
    with caplog.at_level(logging.WARNING, logger=settings_module.__name__):
        first = load_settings(env={"HEARTBEAT_RETRY_POLICY": "/tmp/old.yml"})
        load_settings(env={"HEARTBEAT_RETRY_POLICY": "/tmp/old.yml"})
    assert first.run_policy_file == Path("/tmp/old.yml")
    assert [r.getMessage() for r in caplog.records] == [
        "HEARTBEAT_RETRY_POLICY is deprecated; use HEARTBEAT_RUN_POLICY"]


def test_the_new_name_wins_over_the_old_one(monkeypatch):
    monkeypatch.setattr(settings_module, "_warned", [])
    chosen = load_settings(env={"HEARTBEAT_RETRY_POLICY": "/tmp/old.yml", "HEARTBEAT_RUN_POLICY": "/tmp/new.yml"})
    assert chosen.run_policy_file == Path("/tmp/new.yml")


def test_with_still_takes_the_old_keyword():
    chosen = load_settings(env={}).with_(retry_policy_file=Path("/tmp/p.yml"))
    assert chosen.run_policy_file == Path("/tmp/p.yml")


# -- the README's table ---------------------------------------------------------------------------

def test_the_readme_settings_table_is_the_generated_one():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert with_settings_table(readme) == readme, (
        "README.md's settings table differs from the declaration in heartbeat_runner/core/settings.py; "
        "regenerate it: python -c 'from pathlib import Path; from heartbeat_runner.core.settings import "
        "rewrite_settings_table; rewrite_settings_table(Path(\"README.md\"))'")


def test_every_declared_variable_has_a_row_and_a_help():
    table = settings_table()
    for info in HeartbeatEnvironment.model_fields.values():
        assert info.description, info.validation_alias
        assert f"| `{info.validation_alias}` |" in table


# -- no other module reads a HEARTBEAT_* variable -------------------------------------------------

#: a read of a HEARTBEAT_* variable: os.environ.get("HEARTBEAT_…"), env["HEARTBEAT_…"], getenv(f"HEARTBEAT_…")
_READ = re.compile(r"""(?:environ|env|getenv)\s*(?:\.get\(|\[|\()\s*f?["']HEARTBEAT_\w*["'{]""")
#: a module constant naming one (read elsewhere in the module through the constant)
_CONSTANT = re.compile(r"""^[A-Z_]+\s*=\s*["']HEARTBEAT_\w+["']""", re.MULTILINE)
#: modules that read HEARTBEAT_* variables outside the declaration, and why that is right
ALLOWED = {
    # fault points for the crash, failure and hang tests: read at each point (a test changes them while the
    # process runs), never a setting of the product
    "core/faults.py",
    # HEARTBEAT_LOOP_RESTARTS: the count a restarting loop passes to its own exec'd successor
    "runner/memory.py",
    # HEARTBEAT_<SECTION>_<NAME>_<SETTING>: names built from the connection names of heartbeat_sources.yml
    # (docs/sources.md), which no static declaration can list
    "sensing/connections.py",
    "sensing/sources/jdbc.py",
    # the demo job's command line (JOB): Python run by the local jobs backend in the job's own process, which
    # reads the variables that backend sets for it
    "interfaces/demo.py",
}


def _reads(text: str) -> list[str]:
    found = [m.group(0) for m in _READ.finditer(text)
             if not re.match(r"[^\n]*\]\s*=[^=]", text[m.end():])]  # env["HEARTBEAT_X"] = …: set for a child
    return found + _CONSTANT.findall(text)


def test_no_module_reads_a_heartbeat_variable_outside_the_declaration():
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative == "core/settings.py" or relative in ALLOWED:
            continue
        reads = _reads(path.read_text(encoding="utf-8"))
        if reads:
            offenders[relative] = reads
    assert not offenders, f"declare these in core/settings.py (HeartbeatEnvironment) and pass the value in: {offenders}"


def test_every_default_is_declared_once_with_its_variable():
    """``Settings`` declares no default of its own (they would drift from the variables'), and only
    ``settings_from`` makes one: a setting added to one but not the other fails here, not at run time."""
    import dataclasses

    module = settings_module
    with_defaults = [f.name for f in dataclasses.fields(module.Settings)
                     if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING]
    assert with_defaults == []
    makers = [path.relative_to(PACKAGE).as_posix() for path in sorted(PACKAGE.rglob("*.py"))
              if re.search(r"(?<![A-Za-z_.])Settings\(", path.read_text(encoding="utf-8"))]
    assert makers == ["core/settings.py"]
    assert inspect.getsource(module).count("return Settings(") == 1


def test_the_source_check_sees_reads_and_ignores_writes():
    assert _reads('x = os.environ.get("HEARTBEAT_LEASE_TTL", 600)')
    assert _reads("y = env['HEARTBEAT_HOME']")
    assert _reads('GRACE_VARIABLE = "HEARTBEAT_SHUTDOWN_GRACE_S"')
    assert not _reads('env["HEARTBEAT_HOME"] = str(home)')
    assert not _reads('{"HEARTBEAT_HOME": str(home)}')


# -- the CLI ------------------------------------------------------------------------------------------

def _cli(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("HEARTBEAT_")}
    environ.update(HEARTBEAT_HOME=str(tmp_path / "lh"), **env)
    return run_cli(list(args), env=environ, cwd=tmp_path, timeout=120)


def test_the_cli_refuses_a_bad_variable_in_one_clear_error(tmp_path):
    proc = _cli(tmp_path, "status", HEARTBEAT_MAX_WORKERS="-3", HEARTBEAT_LEASE_TTL="later")
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "HEARTBEAT_MAX_WORKERS='-3'" in proc.stderr and "at least 1" in proc.stderr
    assert "HEARTBEAT_LEASE_TTL='later'" in proc.stderr


def test_a_seed_with_a_clusters_catalog_on_the_local_target_is_refused_and_makes_no_lakehouse(tmp_path):
    config = tmp_path / "cfg.csv"
    config.write_text((ROOT / "seeds" / "heartbeat_sensor_config.csv").read_text())
    proc = _cli(tmp_path, "seed", "--config", str(config), HEARTBEAT_CATALOG="main", HEARTBEAT_SCHEMA="heartbeat_dev")
    assert proc.returncode != 0 and "Traceback" not in proc.stderr + proc.stdout
    assert "HEARTBEAT_CATALOG='main'" in proc.stderr and "Database not found" not in proc.stderr
    assert not (tmp_path / "lh").exists()


def test_the_cli_says_once_that_the_old_policy_name_is_deprecated(tmp_path):
    proc = _cli(tmp_path, "status", HEARTBEAT_RETRY_POLICY=str(tmp_path / "policies.yml"))
    assert proc.stderr.count("HEARTBEAT_RETRY_POLICY is deprecated; use HEARTBEAT_RUN_POLICY") == 1, proc.stderr
    assert "Traceback" not in proc.stderr


def test_lists_are_comma_separated():
    chosen = load_settings(env={"HEARTBEAT_UI_OPERATORS": "ops@example.com, svc-ops", "HEARTBEAT_UI_OPERATOR_GROUPS": ""})
    assert chosen.ui_operators == ("ops@example.com", "svc-ops") and chosen.ui_operator_groups == ()


# -- files a job cluster finds in the deployed project --------------------------------------------

def test_a_deployed_project_brings_its_sources_and_run_policy_files(tmp_path, monkeypatch):
    """On a job cluster HEARTBEAT_PROJECT_DIR is the bundle's synced files: heartbeat_sources.yml and
    heartbeat_run_policy.yml there are used without HEARTBEAT_SOURCES_FILE / HEARTBEAT_RUN_POLICY; the variables
    still win, and without the files (or without the variable) nothing is turned on."""
    monkeypatch.chdir(tmp_path)
    project = tmp_path / "workspace_files"
    project.mkdir()
    env = {"HEARTBEAT_PROJECT_DIR": str(project), "HEARTBEAT_HOME": str(tmp_path / "lh")}
    bare = load_settings(env=env)
    assert bare.run_policy_file is None and bare.effective_sources_file is None
    (project / "heartbeat_sources.yml").write_text("{}\n")
    (project / "heartbeat_run_policy.yml").write_text("{}\n")
    found = load_settings(env=env)
    assert found.run_policy_file == project / "heartbeat_run_policy.yml"
    assert found.effective_sources_file == project / "heartbeat_sources.yml"
    chosen = load_settings(env={**env, "HEARTBEAT_RUN_POLICY": str(tmp_path / "mine.yml"),
                                "HEARTBEAT_SOURCES_FILE": str(tmp_path / "src.yml")})
    assert chosen.run_policy_file == tmp_path / "mine.yml" and chosen.effective_sources_file == tmp_path / "src.yml"
    assert load_settings(env={"HEARTBEAT_HOME": str(tmp_path / "lh")}).run_policy_file is None
