"""Which engine and layout made a lakehouse folder, recorded in it; another engine refuses it.

The embedded engine (target ``local``) keeps Heartbeat's tables at fixed paths under
``<lakehouse>/warehouse/<schema>/``; local Apache Spark (``spark-local``) keeps them as managed
tables of the Hive metastore in its Spark folder. Neither sees the other's tables, so opening
one's lakehouse with the other would look empty and create empty tables beside the real ones.
``<lakehouse>/heartbeat_lakehouse.json`` records the engine and layout at the first open; a
later open with another one stops with a message before anything starts or is written.
Lakehouses made before the record existed are recognised by their files. Remote targets
(``spark``, ``databricks``) keep no tables in the folder and are not checked.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from heartbeat_runner.core.errors import ConflictError
from heartbeat_runner.core.settings import Settings, Target

RECORD_FILE = "heartbeat_lakehouse.json"
MIGRATE_DOC = "docs/engines.md#one-lakehouse-one-engine"


class EngineMismatch(ConflictError):
    """The lakehouse was made by another engine or layout than the one asked for."""


@dataclass(frozen=True)
class MadeBy:
    """An engine (a target) and where it keeps the catalog and tables (``layout``)."""

    engine: str
    layout: str

    @classmethod
    def of(cls, settings: Settings) -> MadeBy:
        if settings.target is Target.SPARK_LOCAL:
            return cls(Target.SPARK_LOCAL.value, f"hive metastore in {_relative(settings.effective_spark_dir, settings)}")
        return cls(Target.LOCAL.value, f"delta folders in {_relative(settings.warehouse_dir, settings)}")


def _relative(path: Path, settings: Settings) -> str:
    """``path`` as ``<lakehouse>/...`` when inside the lakehouse (a moved lakehouse stays the same)."""
    path, home = path.resolve(), settings.lakehouse_dir.resolve()
    return f"<lakehouse>/{path.relative_to(home)}" if path.is_relative_to(home) else str(path)


def check_and_record(settings: Settings) -> None:
    """Refuse a lakehouse another engine or layout made (EngineMismatch); record ours on a new one."""
    if not settings.lakehouse_in_folder:
        return
    wanted = MadeBy.of(settings)
    found = recorded(settings) or _recognised(settings)
    if found is None:
        settings.lakehouse_dir.mkdir(parents=True, exist_ok=True)
        (settings.lakehouse_dir / RECORD_FILE).write_text(json.dumps(asdict(wanted), indent=2) + "\n")
        return
    if found != wanted:
        raise EngineMismatch(
            f"{settings.lakehouse_dir} was made by target {found.engine!r} ({found.layout}); target "
            f"{wanted.engine!r} ({wanted.layout}) cannot read its tables and would start an empty lakehouse "
            f"beside them. Use --target {found.engine} (and its HEARTBEAT_SPARK_DIR), or another "
            f"--lakehouse-dir for the new engine; to move, see {MIGRATE_DOC}")


def recorded(settings: Settings) -> MadeBy | None:
    """The record in the lakehouse folder, None when there is none (or it is unreadable)."""
    try:
        data = json.loads((settings.lakehouse_dir / RECORD_FILE).read_text())
        return MadeBy(engine=str(data["engine"]), layout=str(data["layout"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _recognised(settings: Settings) -> MadeBy | None:
    """A lakehouse made before records existed, by its files: Sail's tables, or the default Spark folder."""
    if (settings.warehouse_dir / settings.schema / "heartbeat_events" / "_delta_log").is_dir():
        return MadeBy.of(settings.with_(target="local"))
    if (settings.lakehouse_dir / "spark" / "metastore_db").is_dir():
        return MadeBy.of(settings.with_(target="spark-local", spark_dir=settings.lakehouse_dir / "spark"))
    return None
