"""Which class serves which ``--jobs-backend``: the built-ins of ``BUILT_IN_BACKENDS`` and the plugins of
the entry-point group ``heartbeat.jobs_backends`` (docs/plugins.md).

A class is imported when a backend is built (``databricks-sdk`` only for Databricks); each is a
subclass of ``jobs.base.JobsBackend`` built by its ``from_settings``.
"""

from __future__ import annotations

from functools import lru_cache

from heartbeat_runner.core.errors import HeartbeatError, describe
from heartbeat_runner.core.plugins import JOBS_BACKENDS_GROUP, Extension, PluginError, discover, unknown_name
from heartbeat_runner.core.settings import JobsBackendKind, Settings
from heartbeat_runner.jobs.base import JobsBackend

#: backend name -> the class that serves it (``module:class``, as an entry point names it)
BUILT_IN_BACKENDS = {
    JobsBackendKind.LOCAL.value: "heartbeat_runner.jobs.local:LocalJobsBackend",
    JobsBackendKind.DATABRICKS.value: "heartbeat_runner.jobs.databricks:DatabricksJobsBackend",
}


@lru_cache(maxsize=1)
def extensions() -> dict[str, Extension]:
    """Every jobs backend by name: the built-ins and the installed plugins (PluginError on a clash)."""
    return discover(JOBS_BACKENDS_GROUP, BUILT_IN_BACKENDS)


def backend_names() -> tuple[str, ...]:
    return tuple(sorted(extensions()))


def build_backend(settings: Settings) -> JobsBackend:
    """The jobs backend ``settings`` name, built by its class's ``from_settings``. PluginError when the name
    is unknown, or its plugin cannot be loaded, is no JobsBackend or fails to build."""
    name = settings.effective_jobs_backend
    extension = extensions().get(name)
    if extension is None:
        raise PluginError(unknown_name("jobs backend", name, extensions()))
    found = extension.load()
    if not (isinstance(found, type) and issubclass(found, JobsBackend)):
        raise PluginError(f"{extension.describe()} must name a subclass of {JobsBackend.__module__}.JobsBackend")
    try:
        return found.from_settings(settings)
    except HeartbeatError:
        raise
    except Exception as exc:  # noqa: BLE001 - a plugin's own failure is reported, a built-in's is a bug shown whole
        if not extension.is_plugin:
            raise
        raise PluginError(f"{extension.describe()} cannot be built: {describe(exc)}") from exc
