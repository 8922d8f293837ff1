"""Heartbeat's own OpenLineage facets (docs/lineage.md, "Facets"), as the client's facet classes.

Imported only when lineage is on (``senders/lineage.py`` imports it in ``build_event``): it imports the client.
Field names are the spec's camelCase, as OpenLineage's own facets write them.
"""

from __future__ import annotations

from typing import Any

import attr
from openlineage.client.facet_v2 import InputDatasetFacet, RunFacet

#: where the facets' schemas are described: the project's docs of this version
SCHEMA_BASE = "urn:heartbeat-runner:facets"


@attr.define
class HeartbeatWindowInputDatasetFacet(InputDatasetFacet):
    """The window of an input a run consumes: the sensor, the bounds as text (``windowFrom`` exclusive,
    ``windowUntil`` inclusive, e.g. Delta versions or key values), the same as the source's structured bounds
    (``boundsKind``: ``delta_version``, ``key``, ``offsets``, ``cursor``, ``event_time``...), the new rows when
    known, and the event-time window of a windowed job."""

    sensorSource: str  # noqa: N815
    sensorId: str  # noqa: N815
    windowFrom: str | None = attr.field(default=None)  # noqa: N815
    windowUntil: str | None = attr.field(default=None)  # noqa: N815
    boundsKind: str | None = attr.field(default=None)  # noqa: N815
    boundsFrom: Any = attr.field(default=None)  # noqa: N815
    boundsUntil: Any = attr.field(default=None)  # noqa: N815
    rows: int | None = attr.field(default=None)
    eventTimeWindow: dict[str, Any] | None = attr.field(default=None)  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_BASE}:HeartbeatWindowInputDatasetFacet"


@attr.define
class HeartbeatRunRunFacet(RunFacet):
    """The run as the jobs backend knows it: its run id there (a Databricks run's ``run_id``) and the backend."""

    jobRunId: str  # noqa: N815
    jobsBackend: str | None = attr.field(default=None)  # noqa: N815

    @staticmethod
    def _get_schema() -> str:
        return f"{SCHEMA_BASE}:HeartbeatRunRunFacet"
