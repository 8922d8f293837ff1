"""Reading the optional YAML files of the runner (run policies, connections, local jobs). A leaf module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from heartbeat_runner.core.errors import ConfigError


def read_yaml_mapping(path: Path | None, expected: str) -> dict[str, Any]:
    """The mapping in the YAML file ``path``; {} when there is no path or no file (an empty file too).

    ConfigError naming the file when it is not valid YAML, or holds something else than a mapping
    (``expected`` says what it should hold).
    """
    if path is None or not Path(path).exists():
        return {}
    return parse_yaml_mapping(Path(path).read_text(encoding="utf-8"), path, expected)


def parse_yaml_mapping(text: str, path: Path, expected: str) -> dict[str, Any]:
    """The mapping in ``text``, the content of ``path`` ({} when empty); ConfigError as ``read_yaml_mapping``."""
    try:
        data = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: not valid YAML: {exc}"]) from exc
    if not isinstance(data, dict):
        raise ConfigError([f"{path}: expected {expected}"])
    return data
