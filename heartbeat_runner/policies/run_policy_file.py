"""The run-policy file (``HEARTBEAT_RUN_POLICY``): reading it once, and the helpers each section's parser
shares (how a problem names the file and the policy, a section's keys, the per-job sections).

The file holds four sections per job or under ``default:`` — ``retry`` settings at the top of a job's
entry, ``catch_up``, ``window`` — and ``alerts:`` at the top; each section's parser lives beside its
rules (``policies/retry.py``, ``catch_up.py``, ``event_windows.py``, ``alerts.py``) and
``policies/run_policies.py`` builds them all from one read.

Invariant: the file is parsed once per content: ``read_policy_file`` reads its bytes (a stat and a small
read) at each call and parses the YAML only when they changed, so every caller of one process sees the
same mapping, and an edited file is seen by the next caller (a running loop keeps the policies it was
started with, as it did before, because it builds them once).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from heartbeat_runner.core.errors import ConfigError
from heartbeat_runner.core.yaml_files import parse_yaml_mapping, read_yaml_mapping

T = TypeVar("T")

#: what the file holds at its top, as the error for another shape says it
TOP_KEYS = "the keys 'default' and 'jobs'"


class _ParsedFiles:
    """Per path: the file's last bytes, their mapping, and what was built from it (keyed by the builder).
    A lock, as the status page reads from threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._parsed: dict[Path, tuple[bytes, dict[str, Any], dict[Callable[..., Any], Any]]] = {}

    def _current(self, path: Path) -> tuple[bytes, dict[str, Any], dict[Callable[..., Any], Any]]:
        content = path.read_bytes()
        known = self._parsed.get(path)
        if known is None or known[0] != content:
            known = (content, parse_yaml_mapping(content.decode("utf-8"), path, TOP_KEYS), {})
            self._parsed[path] = known
        return known

    def mapping(self, path: Path) -> dict[str, Any]:
        with self._lock:
            return copy.deepcopy(self._current(path)[1])  # callers may change their copy

    def built(self, path: Path, build: Callable[[Path, dict[str, Any]], T]) -> T:
        """``build(path, mapping)`` once per content of the file (a failing build is not kept)."""
        with self._lock:
            _, data, built = self._current(path)
            if build not in built:
                built[build] = build(path, copy.deepcopy(data))
            return built[build]


_FILES = _ParsedFiles()


def _readable(path: Path | None) -> Path | None:
    """``path`` when it names a file; None for no path or no file (the file is optional)."""
    return Path(path) if path is not None and Path(path).is_file() else None


def read_policy_file(path: Path | None) -> dict[str, Any]:
    """The run-policy YAML (``default:``, ``jobs:``, ``alerts:``) as a mapping; {} when there is no file.

    ConfigError naming the file when it is not YAML or not a mapping (core/yaml_files.py)."""
    found = _readable(path)
    if found is None:
        return read_yaml_mapping(path, TOP_KEYS)  # {} (or its error for a folder)
    try:
        return _FILES.mapping(found)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot be read: {exc}"]) from exc


def built_from_file(path: Path | None, build: Callable[[Path | None, dict[str, Any]], T]) -> T:
    """``build(path, mapping)`` of the run-policy file, once per content of the file (no file: of {}).

    ``build`` must be a module-level function (it keys the cache) whose result callers do not change."""
    found = _readable(path)
    if found is None:
        return build(path, read_yaml_mapping(path, TOP_KEYS))
    try:
        return _FILES.built(found, build)
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([f"{path}: cannot be read: {exc}"]) from exc


def missing_file_problem(path: Path | None, variable: str = "HEARTBEAT_RUN_POLICY") -> str | None:
    """The problem of a run-policy file that is configured (``variable`` names ``path``) but is no file, or
    None. A configured file that is missing (a typo in the path) is an error, never "no policies": alerts,
    retries, deadlines and windows would be silently off."""
    if path is None or Path(path).is_file():
        return None
    what = "is a folder, not a file" if Path(path).is_dir() else "does not exist"
    return f"{variable} names {path}, which {what}"


def policy_problem(path: Path | None, name: str, detail: object) -> str:
    """How a problem of the ``name`` policy in the run-policy file at ``path`` is reported."""
    return f"{path}: invalid {name} policy: {detail}"


def build_section(data: Mapping[str, Any], path: Path | None, name: str, build: Callable[[Mapping[str, Any]], T]) -> T:
    """``build`` of the run-policy mapping ``data`` read from ``path``; its ValueError is a ConfigError naming
    the file and the policy (``name``)."""
    try:
        return build(data)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ConfigError([policy_problem(path, name, exc)]) from exc


def load_section(path: Path | None, name: str, build: Callable[[Mapping[str, Any]], T]) -> T:
    """``build`` of the run-policy file at ``path`` (see ``build_section``)."""
    return build_section(read_policy_file(path), path, name, build)


def check_section(name: str, values: Mapping[str, Any], allowed: set[str], required: str, example: str) -> None:
    """ValueError when a policy section has keys other than ``allowed`` or lacks ``required``."""
    unknown = set(values) - allowed
    if unknown:
        raise ValueError(f"unknown {name} setting(s): {', '.join(sorted(unknown))}")
    if required not in values:
        raise ValueError(f"{name} needs {required} ({example})")


def policy_sections(data: Mapping[str, Any], key: str, parse: Callable[[Any], T]) -> dict[str, T]:
    """``parse`` of each job's ``key`` section of a run-policy mapping (``"*"``: the one under ``default``)."""
    jobs = data.get("jobs") or {}
    sections = {str(job): values[key] for job, values in jobs.items() if isinstance(values, dict) and values.get(key)}
    default = data.get("default")
    if isinstance(default, dict) and default.get(key):
        sections["*"] = default[key]
    return {job: parse(section) for job, section in sections.items()}
