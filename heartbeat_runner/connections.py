"""Connection settings for external sources (Kafka, SAP, JDBC), never in the config CSV.

``heartbeat_sources.yml`` (or ``HEARTBEAT_SOURCES_FILE``) maps a connection name to its
settings. Secrets are never written in it: a value ``{env: NAME}`` is read from the
environment variable NAME when the source connects::

    kafka:
      my_product:
        bootstrap.servers: broker:9092
        security.protocol: SASL_SSL
        sasl.password: {env: MY_PRODUCT_KAFKA_PASSWORD}
    sap:
      default: {url: {env: SAP_BW_URL}}
    jdbc:
      warehouse: {url: {env: WAREHOUSE_DB_URL}}
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from heartbeat_runner.errors import ConfigError, SourceError


def load_connections(path: Path | None) -> dict[str, dict[str, Any]]:
    """Read the connections file (missing file: no connections)."""
    if path is None or not Path(path).exists():
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict) or not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError([f"{path}: expected sections (kafka, sap, jdbc) mapping names to settings"])
    return data


def resolve_secrets(settings: dict[str, Any], where: str) -> dict[str, Any]:
    """Replace ``{env: NAME}`` values by the environment variable's value."""
    resolved = {}
    for key, value in settings.items():
        if isinstance(value, dict) and set(value) == {"env"}:
            name = str(value["env"])
            if name not in os.environ:
                raise SourceError(f"{where}: setting {key!r} needs environment variable {name}, which is not set")
            value = os.environ[name]
        resolved[key] = value
    return resolved
