"""Which class senses which ``sensor_source``: the built-ins of ``BUILT_IN_SOURCES`` and the plugins
of the entry-point group ``heartbeat.sources`` (docs/plugins.md). Add a built-in source type here.

A class is imported on first use (so validating a config imports no client library) and made
once; every source type is a subclass of ``sources.base.Source`` with a constructor that takes
no argument.
"""

from __future__ import annotations

import threading
from functools import lru_cache

from heartbeat_runner.core.errors import describe
from heartbeat_runner.core.plugins import SOURCES_GROUP, Extension, PluginError, discover, unknown_name
from heartbeat_runner.sensing.sources.base import Source

_PACKAGE = "heartbeat_runner.sensing.sources"
#: sensor_source -> the class that senses it (``module:class``, as an entry point names it)
BUILT_IN_SOURCES = {
    "delta_table": f"{_PACKAGE}.delta_table:DeltaTableSource",
    "lmu_delta_table": f"{_PACKAGE}.delta_table:DeltaTableSource",
    "trigger_file": f"{_PACKAGE}.trigger_file:TriggerFileSource",
    "kafka": f"{_PACKAGE}.kafka:KafkaSource",
    "sap_bw": f"{_PACKAGE}.sap_chain:SapChainSource",
    "sap_b4": f"{_PACKAGE}.sap_chain:SapChainSource",
    "jdbc": f"{_PACKAGE}.jdbc:JdbcSource",
    "delta_upstream_sensor_table": f"{_PACKAGE}.upstream_sensor_table:UpstreamSensorTableSource",
}
_made: dict[str, Source] = {}
_lock = threading.Lock()


@lru_cache(maxsize=1)
def extensions() -> dict[str, Extension]:
    """Every source type by ``sensor_source``: the built-ins and the installed plugins (PluginError on a clash)."""
    return discover(SOURCES_GROUP, BUILT_IN_SOURCES)


def source_types() -> tuple[str, ...]:
    return tuple(sorted(extensions()))


def unknown_source(sensor_source: str) -> str:
    return unknown_name("source", sensor_source, extensions())


def source_for(sensor_source: str) -> Source:
    """The source that senses ``sensor_source`` (one instance per class); KeyError when there is none,
    PluginError when its plugin cannot be loaded or is no Source."""
    extension = extensions().get(sensor_source)
    if extension is None:
        raise KeyError(unknown_source(sensor_source))
    with _lock:
        value = extension.entry_point.value
        if value not in _made:
            _made[value] = _make(extension)
        return _made[value]


def _make(extension: Extension) -> Source:
    found = extension.load()
    if not (isinstance(found, type) and issubclass(found, Source)):
        raise PluginError(f"{extension.describe()} must name a subclass of {Source.__module__}.Source")
    try:
        return found()
    except Exception as exc:  # noqa: BLE001 - foreign code
        raise PluginError(f"{extension.describe()} cannot be made: {describe(exc)}") from exc
