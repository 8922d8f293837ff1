"""Config CSV validation: every bad row is named by file, line and column; nothing is written."""

import pytest
from harness import HEADER
from harness import config_row as row

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.sensing.config import load_config


def write(tmp_path, *rows, header=HEADER):
    path = tmp_path / "cfg.csv"
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


def problems(tmp_path, *rows, header=HEADER):
    path = write(tmp_path, *rows, header=header)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return info.value.problems


def test_messy_values_are_normalised(tmp_path):
    path = write(tmp_path, "delta_table, db.t ,Streaming,desc,,,J1,name, unpaused ,TRUE ",
                 "DELTA_TABLE,db.u,,,,,J1,name,,false")
    rows = load_config(path).rows
    assert [(r.sensor_id, r.sensor_read_type, r.job_state, r.dependency_flag) for r in rows] == [
        ("db.t", "streaming", "UNPAUSED", True), ("db.u", "batch", "UNPAUSED", False)]
    assert rows[1].sensor_source == "delta_table" and rows[1].asset_description is None


@pytest.mark.parametrize("bad_row, line_col, words", [
    ("nosuch,db.t,batch,,,,J1,n,UNPAUSED,TRUE", "line 2, column sensor_source", "unknown source 'nosuch'"),
    ("delta_table,db.t,batch,,,,J1,n,STOPPED,TRUE", "line 2, column job_state", "'STOPPED'"),
    ("delta_table,db.t,batch,,,,J1,n,UNPAUSED,maybe", "line 2, column dependency_flag", "'maybe'"),
    ("delta_table,db.t,batch,,,,,n,UNPAUSED,TRUE", "line 2, column trigger_job_id", "is empty"),
    ("delta_table,db.t,sometimes,,,,J1,n,UNPAUSED,TRUE", "line 2, column sensor_read_type", "'sometimes'"),
    ("delta_table,db.t;drop table x,batch,,,,J1,n,UNPAUSED,TRUE", "line 2, column sensor_id", "neither a table name"),
    ("delta_table,db.t,batch,,,select * from sensor_new_data where ?upstream_key > 1,J1,n,UNPAUSED,TRUE",
     "line 2, column preprocess_query", "?upstream_key but upstream_key is empty"),
    ("delta_table,db.t,batch,,bad key,,J1,n,UNPAUSED,TRUE", "line 2, column upstream_key", "not a valid column"),
    ("trigger_file,../etc,batch,,,,J1,n,UNPAUSED,TRUE", "line 2, column sensor_id", "no '..'"),
])
def test_bad_rows_name_file_line_and_column(tmp_path, bad_row, line_col, words):
    (problem,) = problems(tmp_path, bad_row)
    assert str(tmp_path / "cfg.csv") in problem and line_col in problem and words in problem


def test_duplicate_key_names_both_lines(tmp_path):
    (problem,) = problems(tmp_path, row("delta_table", "db.t", "J1"), row("delta_table", "db.u", "J1"),
                          row("delta_table", "db.t", "J1", hard="FALSE"))
    assert "line 4, column sensor_id: duplicate of line 2" in problem


def test_job_without_hard_dependency(tmp_path):
    (problem,) = problems(tmp_path, row("delta_table", "db.t", "J1", hard="FALSE"),
                          row("delta_table", "db.u", "J1", hard="false"))
    assert "line 2, column dependency_flag" in problem and "job 'J1' has no hard dependency" in problem


def test_every_problem_is_reported_at_once(tmp_path):
    found = problems(tmp_path, "nosuch,db.t,batch,,,,J1,n,UNPAUSED,TRUE", "delta_table,db.t,batch,,,,J2,n,NOPE,TRUE")
    assert len(found) == 2 and "line 2" in found[0] and "line 3" in found[1]


def test_unknown_and_missing_columns(tmp_path):
    (problem,) = problems(tmp_path, "x", header=HEADER + ",colour")
    assert "line 1" in problem and "unknown column(s) 'colour'" in problem
    (problem,) = problems(tmp_path, "x", header="sensor_source,sensor_id")
    assert "missing required column(s) trigger_job_id" in problem


def test_optional_columns_may_be_missing_and_spec_spelling_is_accepted(tmp_path):
    path = write(tmp_path, "delta_table,db.t,J1,TRUE", header="sensor_source,sensor_id,trigger_job_id,dependancy_flag")
    config = load_config(path)
    assert config.rows[0].job_state == "UNPAUSED"
    assert "job_state" in config.defaulted_columns and "dependency_flag" not in config.defaulted_columns


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.csv")


def test_the_shipped_example_config_is_valid():
    from heartbeat_runner.core.settings import package_project_dir

    config = load_config(package_project_dir() / "seeds" / "heartbeat_sensor_config.csv")
    assert len(config.rows) == 6


def test_the_readme_worked_example_is_valid(tmp_path):
    from heartbeat_runner.core.settings import package_project_dir

    readme = (package_project_dir() / "README.md").read_text()
    block = readme.split("Worked example, one row per source")[1].split("```csv\n")[1].split("```")[0]
    path = tmp_path / "example.csv"
    path.write_text(block)
    config = load_config(path)
    assert {r.sensor_source for r in config.rows} >= {"kafka", "sap_bw", "sap_b4", "jdbc", "delta_table",
                                                       "lmu_delta_table", "trigger_file",
                                                       "delta_upstream_sensor_table"}
