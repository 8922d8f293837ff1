"""What the CLI prints: rich tables (plain off a terminal, coloured on one unless NO_COLOR), unchanged
JSON, progress only on a terminal, ``status --watch`` and the status line of ``run --loop``.

Most tests drive heartbeat_runner.interfaces.output and the CLI's loop without an engine; the last two run the
real CLI against a small lakehouse."""

from __future__ import annotations

import argparse
import faulthandler
import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime

import pytest
from harness import HEADER, CliLakehouse, marker_jobs_file, ticks
from harness import config_row as row

from heartbeat_runner.core.errors import HeartbeatError
from heartbeat_runner.core.records import utcnow
from heartbeat_runner.interfaces import cli
from heartbeat_runner.interfaces.output import (
    STATUS_COLUMNS,
    LiveLine,
    Steps,
    _json_default,
    console_for,
    emit,
    emit_json,
    rows_table,
    watch,
)
from heartbeat_runner.runner.loop import RunConfig, run_loop
from heartbeat_runner.runner.tick_result import TickResult

ANSI = re.compile(r"\x1b\[")
ANSI_SEQUENCE = re.compile(r"\x1b\[[0-9;]*m")
#: an SGR sequence that sets a foreground colour (30-37, 90-97, 38;5;n / 38;2;r;g;b)
COLOUR = re.compile(r"\x1b\[(?:[0-9]+;)*(?:3[0-8]|9[0-7])(?:;[0-9]+)*m")

ROWS = [
    {"trigger_job_id": "101", "trigger_job_name": "daily_sales_report", "sensor_source": "delta_table",
     "sensor_id": "demo_sales.orders", "dependency_flag": "TRUE", "job_state": "UNPAUSED", "status": "COMPLETED",
     "status_change_timestamp": datetime(2026, 5, 1, 8, 30), "job_run_id": "local-7", "last_error": None},
    {"trigger_job_id": "102", "trigger_job_name": "inventory_sync", "sensor_source": "trigger_file",
     "sensor_id": "inventory_drop", "dependency_flag": "TRUE", "job_state": "PAUSED", "status": "FAILED",
     "status_change_timestamp": datetime(2026, 5, 1, 9, 0), "job_run_id": "local-8",
     "last_error": "exit code 1 [bold]not markup[/bold] " + "x" * 80},
]


class Tty(io.StringIO):
    """A stream that says it is a terminal."""

    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def plain_environment(monkeypatch):
    """No colour or terminal overrides from the environment the tests run in."""
    for name in ("NO_COLOR", "FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE", "COLUMNS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")


def table_text(rows=ROWS, columns=STATUS_COLUMNS, out=None, **options) -> str:
    out = out if out is not None else io.StringIO()
    emit(rows, columns, as_json=False, out=out, **options)
    return out.getvalue()


# -- tables --------------------------------------------------------------------------------------

def test_a_table_off_a_terminal_is_plain_text_one_line_per_row():
    text = table_text()
    assert not ANSI.search(text)
    lines = text.splitlines()
    assert lines[0].split() == [c.upper() for c in STATUS_COLUMNS]
    (orders,) = [line for line in lines if line.startswith("101")]
    assert orders.split() == ["101", "daily_sales_report", "delta_table", "demo_sales.orders", "TRUE", "UNPAUSED",
                              "COMPLETED", "2026-05-01", "08:30:00", "UTC", "local-7", "-"]
    assert "[bold]not markup[/bold]" in text  # cells are data, not rich markup
    assert all(line == line.rstrip() for line in lines)


def test_a_wide_table_off_a_terminal_is_not_squeezed():
    columns = [f"column_{i}" for i in range(8)]
    text = table_text([{c: "v" * 30 for c in columns}], columns)
    assert len(text.splitlines()) == 3 and len(text.splitlines()[2]) > 160
    assert text.count("v" * 30) == 8


def test_off_a_terminal_every_value_is_whole():
    text = table_text()
    assert "exit code 1 [bold]not markup[/bold] " + "x" * 80 in text and "…" not in text


def test_on_a_terminal_ids_and_states_stay_whole_and_long_text_is_folded_and_clipped(monkeypatch):
    monkeypatch.setenv("COLUMNS", "140")
    rows = [dict(ROWS[0], job_run_id="local-1234", status="IN_PROGRESS"), ROWS[1]]
    text = ANSI_SEQUENCE.sub("", table_text(rows, out=Tty()))
    assert "-[ 1 ]" not in text  # a table, not the rows one after another
    for whole in ("local-1234", "IN_PROGRESS", "FAILED", "UNPAUSED", "2026-05-01 08:30:00 UTC", "demo_sales.orders"):
        assert whole in text, whole
    assert "x" * 60 not in text  # free text is folded / clipped to fit
    assert max(len(line.rstrip()) for line in text.splitlines()) <= 140


def test_a_terminal_too_narrow_for_whole_ids_shows_the_rows_one_after_another(monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    run_id = "run-" + "9f3a2c71" * 8
    text = ANSI_SEQUENCE.sub("", table_text([dict(ROWS[0], job_run_id=run_id), ROWS[1]], out=Tty()))
    assert f"JOB_RUN_ID               {run_id}" in text and "-[ 2 ]" in text
    assert "STATUS                   COMPLETED" in text and "STATUS                   FAILED" in text


def test_no_rows_print_none_under_the_title():
    assert table_text([]) == "(none)\n"
    assert table_text([], title="\nControl table") == "\nControl table\n(none)\n"
    titled = table_text(title="\nControl table")
    assert titled.startswith("\nControl table\n") and "TRIGGER_JOB_ID" in titled


#: few enough columns for the 80 columns a terminal without a size has
STATES = ["trigger_job_id", "job_state", "status"]


def test_states_are_coloured_on_a_terminal():
    text = table_text(columns=STATES, out=Tty())
    assert "\x1b[32mCOMPLETED" in text and "\x1b[1;31mFAILED" in text
    assert COLOUR.search(text)


def test_no_color_keeps_a_terminal_colourless(monkeypatch):
    monkeypatch.setenv("NO_COLOR", "1")
    text = table_text(columns=STATES, out=Tty())
    assert not COLOUR.search(text)
    assert "COMPLETED" in text and "FAILED" in text


def test_columns_sets_the_width_off_a_terminal(monkeypatch):
    assert console_for(io.StringIO()).width == 160
    monkeypatch.setenv("COLUMNS", "100")
    assert console_for(io.StringIO()).width == 100


def test_json_is_unchanged():
    out = io.StringIO()
    emit(ROWS, STATUS_COLUMNS, as_json=True, out=out)
    expected = json.dumps([{c: r.get(c) for c in STATUS_COLUMNS} for r in ROWS], default=_json_default, indent=2)
    assert out.getvalue() == expected + "\n"
    assert json.loads(out.getvalue())[0]["status_change_timestamp"] == "2026-05-01T08:30:00"
    out = io.StringIO()
    emit_json({"when": datetime(2026, 5, 1), "n": 1}, out)
    assert out.getvalue() == '{\n  "when": "2026-05-01T00:00:00",\n  "n": 1\n}\n'


# -- progress and live lines ---------------------------------------------------------------------

def test_steps_off_a_terminal_are_plain_lines_and_quiet_prints_none():
    out = io.StringIO()
    with Steps(2, stream=out) as step:
        step("loading 3 config row(s)")
        step("a detail", plain=False)
        step("building the control table and views")
    assert out.getvalue() == "  … loading 3 config row(s)\n  … building the control table and views\n"
    quiet = io.StringIO()
    with Steps(2, stream=quiet, quiet=True) as step:
        step("loading")
    assert quiet.getvalue() == ""


def test_steps_on_a_terminal_draw_a_bar_that_goes_away():
    out = Tty()
    with Steps(2, stream=out) as step:
        step("loading")
        step("building")
    assert "  … " not in out.getvalue() and ANSI.search(out.getvalue())


def test_a_live_line_off_a_terminal_prints_each_shown_line_once():
    out = io.StringIO()
    with LiveLine(stream=out) as line:
        line.show(lambda: "tick 1 · OK")
        line.show(lambda: "running", plain=False)
    assert out.getvalue() == "tick 1 · OK\n"


# -- status --watch --------------------------------------------------------------------------------

def reader(*snapshots):
    """A watch ``read`` returning the snapshots in turn (KeyboardInterrupt when one is that)."""
    pending = list(snapshots)

    def read():
        snapshot = pending.pop(0)
        if snapshot is KeyboardInterrupt:
            raise KeyboardInterrupt
        return snapshot
    return read


def test_watch_off_a_terminal_appends_a_fresh_table_each_time():
    out = io.StringIO()
    shown = watch(reader((ROWS, STATUS_COLUMNS, None), (ROWS[:1], STATUS_COLUMNS, "a runner is ticking")),
                  title="Control table", interval=0.01, count=2, out=out)
    text = out.getvalue()
    assert shown == 2 and text.count("TRIGGER_JOB_ID") == 2 and text.count("Control table at ") == 2
    assert "(a runner is ticking)" in text and not ANSI.search(text)


def test_watch_as_json_prints_one_array_per_reading():
    out = io.StringIO()
    watch(reader((ROWS, ["trigger_job_id"], None), ([], ["trigger_job_id"], None)), title="Control table",
          interval=0.01, count=2, as_json=True, out=out)
    decoder, text, arrays = json.JSONDecoder(), out.getvalue(), []
    while text.strip():
        value, end = decoder.raw_decode(text.lstrip())
        arrays.append(value)
        text = text.lstrip()[end:]
    assert arrays == [[{"trigger_job_id": "101"}, {"trigger_job_id": "102"}], []]


def test_watch_on_a_terminal_redraws_in_place_and_ctrl_c_ends_it():
    out = Tty()
    shown = watch(reader((ROWS, STATES, None), KeyboardInterrupt), title="Control table", interval=0.01, out=out)
    assert shown == 1
    assert "Ctrl-C to stop" in out.getvalue() and "\x1b[32mCOMPLETED" in out.getvalue()


def test_the_watch_options():
    parser = cli.build_parser()
    assert parser.parse_args(["status"]).watch is None
    assert parser.parse_args(["status", "--watch", "--json"]).watch == cli.DEFAULT_WATCH_S
    args = parser.parse_args(["status", "--watch", "0.5", "--watch-count", "2"])
    assert (args.watch, args.watch_count) == (0.5, 2)
    with pytest.raises(SystemExit):
        parser.parse_args(["status", "--watch", "0"])


# -- the status line of run --loop -----------------------------------------------------------------

def loop_of(tick, args: argparse.Namespace) -> int:
    """The loop of ``run --loop`` over ``tick``, showing what the CLI shows for ``args``."""
    return run_loop(tick, RunConfig(interval_s=args.interval, lease_wait_s=0.0), cli._LoopStatus(args))




def tick_result(**figures) -> TickResult:
    return TickResult(run_id="r", snapshot_ts=utcnow(), duration_s=0.25, completed=["J1"], **figures)


def test_the_loop_prints_one_status_line_per_tick_off_a_terminal(restore_signals, capsys):
    args = argparse.Namespace(interval=0.01, json=False)
    code = loop_of(ticks(tick_result(), None, HeartbeatError("engine gone")), args)
    out, err = capsys.readouterr()
    assert code == 0 and "stopped after 3 tick(s)" in out
    lines = [line for line in err.splitlines() if re.match(r"tick \d", line)]
    assert re.fullmatch(r"tick 1 · OK · 0\.2 s · sensed 0 · new 0 · triggered 0 · completed 1 · failed 0 · "
                        r"next in \d+\.\d s", lines[0]), lines[0]
    assert lines[1].startswith("tick 2 · SKIPPED (another runner is ticking) · next in ")
    assert lines[2].startswith("tick 3 · FAILED (1 in a row) · ") and lines[2].endswith("(backing off)")
    assert err.count("tick failed: ") == 1 and "engine gone" in err and not ANSI.search(err)


def test_the_loop_prints_nothing_on_stderr_with_json(restore_signals, capsys):
    loop_of(ticks(tick_result()), argparse.Namespace(interval=0.01, json=True))
    out, err = capsys.readouterr()
    assert err == "" and json.loads(out)["completed"] == ["J1"]


def test_the_loop_redraws_its_status_line_on_a_terminal(restore_signals, capsys, monkeypatch):
    terminal = Tty()
    monkeypatch.setattr(sys, "stderr", terminal)
    loop_of(ticks(tick_result(), tick_result()), argparse.Namespace(interval=0.01, json=False))
    drawn = terminal.getvalue()
    assert "tick 2 · \x1b[32mOK\x1b[0m · 0.2 s" in drawn and "\x1b[2K" in drawn  # erased and drawn again


# -- the real CLI on a small lakehouse -------------------------------------------------------------

@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> CliLakehouse:
    root = tmp_path_factory.mktemp("cli_output")
    config = root / "config.csv"
    config.write_text("\n".join([HEADER, row("trigger_file", "drop", "J1")]) + "\n")
    lake = CliLakehouse(root / "lakehouse", config=config, jobs_file=marker_jobs_file(root / "jobs.yml", "J1"),
                        env={"FORCE_COLOR": "", "TTY_COMPATIBLE": "", "NO_COLOR": ""})
    lake.cli("seed")
    return lake


def test_status_watch_when_piped_prints_a_fresh_table_each_interval(lake):
    view = lake.cli("status", "--watch", "0.5", "--watch-count", "2").stdout
    assert view.count("every 0.5 s") == 2 and view.count("1 job(s): ") == 2 and not ANSI.search(view)
    assert [line.split()[:3] for line in view.splitlines() if line.startswith("J1")] == [["J1", "job_J1", "idle"]] * 2
    text = lake.cli("status", "--wide", "--watch", "0.5", "--watch-count", "2").stdout
    assert text.count("TRIGGER_JOB_ID") == 2 and text.count("Control table at ") == 2 and not ANSI.search(text)
    assert [line.split()[:4] for line in text.splitlines() if line.startswith("J1")] == \
        [["J1", "job_J1", "trigger_file", "drop"]] * 2
    began = time.monotonic()
    arrays = lake.cli("status", "--json", "--watch", "0.5", "--watch-count", "2").stdout
    assert time.monotonic() - began < 60
    assert arrays.count('"trigger_job_id": "J1"') == 2 and arrays.count("[\n") == 2


def test_run_loop_when_piped_logs_one_status_line_per_tick(lake):
    loop = lake.start("run", "--loop", "--interval", "0.5")
    lines: list[str] = []

    def read_stderr() -> None:
        for line in loop.stderr:
            lines.append(line)

    reading = threading.Thread(target=read_stderr, daemon=True)
    reading.start()
    try:
        deadline = time.monotonic() + 120
        while sum(bool(re.match(r"tick \d", line)) for line in lines) < 2 and loop.poll() is None:
            assert time.monotonic() < deadline, "".join(lines)
            time.sleep(0.2)
    finally:
        loop.send_signal(signal.SIGTERM)
        try:
            out = loop.stdout.read()
            loop.wait(timeout=60)
        except subprocess.TimeoutExpired:
            loop.kill()
            raise
    reading.join(timeout=10)
    assert loop.returncode == 0, "".join(lines)
    assert "stopped after" in out and out.count("run ") >= 2
    status = [line.rstrip("\n") for line in lines if re.match(r"tick \d", line)]
    assert all(re.fullmatch(r"tick \d+ · OK · \d+\.\d s · sensed 1 · new 0 · triggered 0 · completed 0 · failed 0"
                            r" · next in \d+\.\d s", line) for line in status), status
    assert not ANSI.search("".join(lines))


#: every command that prints to stdout, as a user runs it piped into ``head -1``
PRINTING_COMMANDS = [("--help",), ("--version",), ("validate",), ("seed",), ("run",), ("status",), ("status", "--json"),
                     ("runs",), ("runs", "--json"), ("explain", "--job-id", "J1"),
                     ("explain", "--job-id", "J1", "--json"), ("alerts",), ("alerts", "--json"), ("check",),
                     ("pause", "--job-id", "J1"), ("resume", "--job-id", "J1"),
                     ("trigger", "--job-id", "J1", "--reason", "pipe"), ("complete", "--job-id", "J1"),
                     ("reset", "--job-id", "J1", "--reason", "pipe"), ("maintain",), ("rebuild",)]


def closed_pipe() -> int:
    """The write end of a pipe whose reader has already gone, like ``head -1`` after its line."""
    read, write = os.pipe()
    os.close(read)
    return write


@pytest.mark.slow  # 21 real processes (a closed pipe is the process's own stdout)
def test_no_command_prints_a_traceback_when_its_reader_goes_away(lake):
    """`explain … | head -1`, `status | head -1` and every other printing command: the reader closing the pipe
    ends the command quietly with exit status 0, no BrokenPipeError traceback, nothing printed about it."""
    for args in PRINTING_COMMANDS:
        write = closed_pipe()
        try:
            proc = subprocess.run(lake.command(*args), env=lake.env, stdout=write, stderr=subprocess.PIPE, text=True,
                                  timeout=300, cwd=lake.home.parent)
        finally:
            os.close(write)
        assert proc.returncode == 0, (args, proc.stderr)
        assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr \
            and "Exception ignored" not in proc.stderr, (args, proc.stderr)


def test_a_loop_whose_reader_went_away_stops_quietly(lake):
    write = closed_pipe()
    try:
        loop = subprocess.Popen(lake.command("run", "--loop", "--interval", "0.5"), env=lake.env, stdout=write,
                                stderr=subprocess.PIPE, text=True, cwd=lake.home.parent)
    finally:
        os.close(write)
    lines: list[str] = []
    reading = threading.Thread(target=lambda: lines.extend(loop.stderr), daemon=True)
    reading.start()
    deadline = time.monotonic() + 120
    while not any(re.match(r"tick \d", line) for line in lines) and loop.poll() is None:
        assert time.monotonic() < deadline, "".join(lines)
        time.sleep(0.2)
    loop.send_signal(signal.SIGTERM)                                # "stopped after N tick(s)" finds the pipe closed
    assert loop.wait(60) == 0
    reading.join(10)
    text = "".join(lines)
    assert "Traceback" not in text and "BrokenPipe" not in text and "Exception ignored" not in text, text
