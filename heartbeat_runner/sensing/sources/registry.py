"""Which module senses which ``sensor_source``. Add a source type here."""

from __future__ import annotations

from functools import lru_cache

from heartbeat_runner.sensing.sources.base import Source


@lru_cache(maxsize=1)
def _registry() -> dict[str, Source]:
    # Imported here so that loading the config validator does not import every client library.
    from heartbeat_runner.sensing.sources import (
        delta_table,
        jdbc,
        kafka,
        sap_chain,
        trigger_file,
        upstream_sensor_table,
    )

    modules: list[Source] = [
        delta_table.DeltaTableSource(),
        trigger_file.TriggerFileSource(),
        kafka.KafkaSource(),
        sap_chain.SapChainSource(),
        jdbc.JdbcSource(),
        upstream_sensor_table.UpstreamSensorTableSource(),
    ]
    return {name: module for module in modules for name in module.source_types}


def source_types() -> tuple[str, ...]:
    return tuple(sorted(_registry()))


def source_for(sensor_source: str) -> Source:
    try:
        return _registry()[sensor_source]
    except KeyError:
        raise KeyError(f"unknown sensor_source {sensor_source!r}") from None
