"""Which module senses which ``sensor_source``. Add a source type here."""

from __future__ import annotations

from functools import lru_cache

from heartbeat_runner.sources.base import Source


@lru_cache(maxsize=1)
def _registry() -> dict[str, Source]:
    from heartbeat_runner.sources import delta_table, trigger_file

    modules: list[Source] = [delta_table.DeltaTableSource(), trigger_file.TriggerFileSource()]
    for optional in _optional_sources():
        modules.append(optional)
    return {name: module for module in modules for name in module.source_types}


def _optional_sources() -> list[Source]:
    """Sources added by later modules; each import is cheap (clients load lazily)."""
    found: list[Source] = []
    for module_name, class_name in (
        ("kafka", "KafkaSource"),
        ("sap_chain", "SapChainSource"),
        ("jdbc", "JdbcSource"),
        ("upstream_sensor_table", "UpstreamSensorTableSource"),
    ):
        try:
            module = __import__(f"heartbeat_runner.sources.{module_name}", fromlist=[class_name])
        except ModuleNotFoundError as exc:
            if exc.name == f"heartbeat_runner.sources.{module_name}":
                continue
            raise
        found.append(getattr(module, class_name)())
    return found


def source_types() -> tuple[str, ...]:
    return tuple(sorted(_registry()))


def source_for(sensor_source: str) -> Source:
    try:
        return _registry()[sensor_source]
    except KeyError:
        raise KeyError(f"unknown sensor_source {sensor_source!r}") from None
