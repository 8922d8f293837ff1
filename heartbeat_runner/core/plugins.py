"""Extension points: the built-ins of one table and the plugins installed packages declare.

A registry (the source types, the jobs backends) names each extension once, in the form of
a Python entry point ``name = module:attribute``. The built-ins are listed in a table in the
package; a plugin is an entry point of an installed distribution in the registry's group
(``heartbeat.sources``, ``heartbeat.jobs_backends``; see docs/plugins.md). Both are loaded
the same way, on first use, so naming them (``validate``) imports no client library.

Invariants: a name is a lower-case identifier; a plugin never replaces a built-in or another
plugin (a clash is a PluginError naming both); a plugin that cannot be loaded is a PluginError
naming its distribution, never a traceback.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points

from heartbeat_runner.core.errors import TerminalError, describe

#: the entry-point group of source types (the ``sensor_source`` values they sense)
SOURCES_GROUP = "heartbeat.sources"
#: the entry-point group of jobs backends (the ``--jobs-backend`` values they serve)
JOBS_BACKENDS_GROUP = "heartbeat.jobs_backends"
BUILT_IN = "built-in"
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")


class PluginError(TerminalError):
    """A plugin is declared wrongly, clashes with another extension, or cannot be loaded."""


@dataclass(frozen=True)
class Extension:
    """One extension of a registry: its name, where it is (``module:attribute``) and who provides it."""

    name: str
    group: str
    entry_point: EntryPoint
    #: ``built-in``, or the distribution (name and version) that declared the plugin
    origin: str

    @property
    def is_plugin(self) -> bool:
        return self.origin != BUILT_IN

    def load(self) -> object:
        """The object the entry point names; PluginError (from the import error) when it cannot be imported."""
        try:
            return self.entry_point.load()
        except Exception as exc:  # noqa: BLE001 - any error of foreign code while importing it
            raise PluginError(f"{self.describe()} cannot be loaded: {describe(exc)}") from exc

    def describe(self) -> str:
        where = "built into Heartbeat" if not self.is_plugin else f"from the package {self.origin}"
        return f"{self.group} {self.name!r} ({self.entry_point.value}, {where})"


def discover(group: str, built_ins: Mapping[str, str]) -> dict[str, Extension]:
    """The built-ins (name -> ``module:attribute``) and the installed plugins of ``group``, by name.

    PluginError when a plugin's name is not a lower-case identifier, or is taken by a built-in or by
    another plugin (both are named, so the user knows which package to remove)."""
    found = {name: Extension(name, group, EntryPoint(name, value, group), BUILT_IN) for name, value in built_ins.items()}
    for entry_point in entry_points(group=group):
        plugin = Extension(entry_point.name, group, entry_point, _origin(entry_point))
        if not _NAME.match(plugin.name):
            raise PluginError(f"{plugin.describe()}: the name must be lower-case letters, digits and '_'")
        taken = found.get(plugin.name)
        if taken is not None and taken.entry_point.value != entry_point.value:
            raise PluginError(f"{plugin.describe()} clashes with {taken.describe()}; rename it or uninstall one")
        found.setdefault(plugin.name, plugin)
    return found


def _origin(entry_point: EntryPoint) -> str:
    dist = entry_point.dist
    return f"{dist.name} {dist.version}" if dist is not None else "an unnamed package"


def unknown_name(what: str, name: str, known: Mapping[str, Extension]) -> str:
    """The message for a name no extension has: the built-ins and plugins there are."""
    built_in = sorted(n for n, e in known.items() if not e.is_plugin)
    plugins = sorted(n for n, e in known.items() if e.is_plugin)
    installed = f"; installed plugins: {', '.join(plugins)}" if plugins else " (no plugin is installed)"
    return f"unknown {what} {name!r}; expected one of {', '.join(built_in)}{installed}"
