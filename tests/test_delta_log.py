"""The newest version of a Delta table on local disk, read from its ``_delta_log`` (what idle ticks and
the read cache's fingerprint ask of every table, many times a tick): right after every kind of change,
and without listing a log folder that only grows."""

from __future__ import annotations

import os
import shutil

import pandas as pd
from deltalake import DeltaTable, write_deltalake

from heartbeat_runner.engines import delta_log


def _append(path, rows: int = 1, mode: str = "append") -> None:
    write_deltalake(str(path), pd.DataFrame({"id": range(rows)}), mode=mode)


def test_the_newest_version_follows_appends_overwrites_and_a_re_created_table(tmp_path):
    table = tmp_path / "orders"
    assert delta_log.latest_version(table) is None  # not a table yet
    _append(table)
    assert delta_log.latest_version(table) == 0
    for expected in (1, 2, 3):
        _append(table)
        assert delta_log.latest_version(table) == expected == DeltaTable(str(table)).version()
    _append(table, mode="overwrite")
    _append(table)
    _append(table)  # two commits between two looks
    assert delta_log.latest_version(table) == 6 == DeltaTable(str(table)).version()
    assert delta_log.latest_version(table) == 6  # nothing new: the same answer

    shutil.rmtree(table)  # dropped ...
    assert delta_log.latest_version(table) is None
    _append(table)  # ... and made again: its versions start over
    _append(table)
    assert delta_log.latest_version(table) == 1 == DeltaTable(str(table)).version()


def test_a_re_created_table_with_fewer_commits_is_not_mistaken_for_the_old_one(tmp_path):
    table = tmp_path / "orders"
    for _ in range(5):
        _append(table)
    assert delta_log.latest_version(table) == 4
    shutil.rmtree(table)
    _append(table)
    assert delta_log.latest_version(table) == 0


def test_once_known_the_log_folder_is_not_listed_again(tmp_path, monkeypatch):
    """A log keeps every commit file for its retention period; after the first look, finding the newest
    version costs a file check per new commit, not a listing of them all."""
    table = tmp_path / "events"
    for _ in range(40):
        _append(table)
    listed: list[str] = []
    real_listdir = os.listdir

    def counting_listdir(path):
        listed.append(str(path))
        return real_listdir(path)

    monkeypatch.setattr(delta_log.os, "listdir", counting_listdir)
    assert delta_log.latest_version(table) == 39
    first = len(listed)
    for expected in (40, 41):
        _append(table)
        assert delta_log.latest_version(table) == expected
    assert delta_log.latest_version(table) == 41
    assert len(listed) == first, f"listed the log again: {listed[first:]}"
