"""Connection settings for external sources (Kafka, SAP, JDBC), never in the config CSV.

``heartbeat_sources.yml`` (or ``HEARTBEAT_SOURCES_FILE``) maps a connection name to its
settings. Secrets are never written in it: a value ``{env: NAME}`` is read from the
environment variable NAME, a value ``{secret: scope/key}`` from the Databricks secret scope
(``core/secrets.py``; the runner passes the resolver in ``SenseContext.secrets``), each time the
source connects; the value is never kept::

    kafka:
      my_product:
        bootstrap.servers: broker:9092
        security.protocol: SASL_SSL
        sasl.password: {secret: heartbeat/kafka-password}
    sap:
      default: {url: {env: SAP_BW_URL}}
    jdbc:
      warehouse: {url: {env: WAREHOUSE_DB_URL}}

Without a file entry, ``HEARTBEAT_<SECTION>_<NAME>_<SETTING>`` environment variables give
the main settings (e.g. ``HEARTBEAT_KAFKA_MY_PRODUCT_BOOTSTRAP_SERVERS``,
``HEARTBEAT_JDBC_WAREHOUSE_URL``); see ``connection_settings``. docs/sources.md has the details.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from heartbeat_runner.core.errors import ConfigError, HeartbeatError, SourceError
from heartbeat_runner.core.secrets import NoSecretScopes, SecretResolver, parse_reference, resolve
from heartbeat_runner.core.yaml_files import read_yaml_mapping

#: how errors name the connections file (its path is HEARTBEAT_SOURCES_FILE's, if set)
CONNECTIONS_FILE = "heartbeat_sources.yml:"


def load_connections(path: Path | None) -> dict[str, dict[str, Any]]:
    """Read the connections file (missing file: no connections)."""
    expected = "sections (kafka, sap, jdbc) mapping names to settings"
    data = read_yaml_mapping(path, expected)
    if not all(isinstance(v, dict) for v in data.values()):
        raise ConfigError([f"{path}: expected {expected}"])
    return data


def resolve_secrets(settings: dict[str, Any], where: str, secrets: SecretResolver | None = None) -> dict[str, Any]:
    """Replace each reference (``{env: NAME}``, ``{secret: scope/key}``) by the value it names, read now.

    SourceError names the connection, the setting and the reference, never a value.
    """
    resolved = {}
    for key, value in settings.items():
        field = f"{CONNECTIONS_FILE} {where}, setting {key!r}"
        try:
            ref = parse_reference(value, field)
            if ref is not None:
                value = resolve(ref, field, secrets or NoSecretScopes())
        except HeartbeatError as exc:
            raise SourceError(str(exc)) from exc
        resolved[key] = value
    return resolved


def connection_settings(connections: dict[str, dict[str, Any]], section: str, name: str,
                        env_settings: dict[str, str], secrets: SecretResolver | None = None) -> dict[str, Any]:
    """Settings of connection ``name`` in ``section``, secrets resolved.

    The file's entry wins; ``HEARTBEAT_<SECTION>_<NAME>_<SETTING>`` environment variables
    fill the settings listed in ``env_settings`` (variable suffix -> setting key) that the
    file does not give. Raise SourceError when neither knows the connection.
    """
    configured = connections.get(section, {}).get(name)
    if configured is not None and not isinstance(configured, dict):
        raise SourceError(f"connections file: {section}.{name} must be a mapping of settings")
    prefix = f"HEARTBEAT_{env_name(section)}_{env_name(name)}_"
    from_env = {key: os.environ[prefix + suffix] for suffix, key in env_settings.items()
                if prefix + suffix in os.environ}
    if configured is None and not from_env:
        hints = " or ".join(prefix + suffix for suffix in env_settings)
        raise SourceError(f"no connection settings for {section} {name!r}: add {section}.{name} to "
                          f"heartbeat_sources.yml or set {hints}")
    return resolve_secrets({**from_env, **(configured or {})}, f"{section}.{name}", secrets)


def env_name(name: str) -> str:
    """``my-product.eu`` -> ``MY_PRODUCT_EU`` (a name usable in an environment variable)."""
    return "".join(ch if ch.isalnum() else "_" for ch in name).upper()
