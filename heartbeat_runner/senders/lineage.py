"""OpenLineage run events of the runs Heartbeat triggers, sent with the ``openlineage-python`` client.

Lineage is on when OpenLineage is configured the client's own way (:func:`lineage_configured`): the client
finds its transport (HTTP, file, console, Kafka, ...) in ``OPENLINEAGE_CONFIG``, ``openlineage.yml`` (the
working folder, then ``~/.openlineage``), ``OPENLINEAGE__TRANSPORT__*`` or ``OPENLINEAGE_URL``. Off, nothing of
the client is imported.

A run's events are built from plain records (:class:`LineageRecord`): START names the job and, as inputs,
the datasets whose data the run consumes with the consumed window as an input facet (``heartbeatWindow``);
COMPLETE / FAIL close it. The OpenLineage run id is derived from the job namespace, the job and the jobs
backend's run id, so every process (and a replay after a crash) gives one run the same id; the backend's run
id (a Databricks run's) is in the ``heartbeatRun`` run facet. Free text (a failure's message) is redacted.
"""

from __future__ import annotations

import enum
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from heartbeat_runner import __version__
from heartbeat_runner.core.secrets import redact
from heartbeat_runner.senders.send import DeliveryError

if TYPE_CHECKING:  # pragma: no cover
    from openlineage.client import OpenLineageClient
    from openlineage.client.event_v2 import RunEvent

#: the ``producer`` of every event (and of Heartbeat's own facets): the project and its version
PRODUCER = f"urn:heartbeat-runner:{__version__}"
#: the namespace of the OpenLineage run ids Heartbeat derives (uuid5)
_RUN_IDS = uuid.UUID("6f1c1d2e-5b0a-4e57-9d2b-8a4a0c9b3e71")


class LineageKind(str, enum.Enum):
    """The OpenLineage event types Heartbeat sends (the spec's ``eventType`` values)."""

    START = "START"
    COMPLETE = "COMPLETE"
    FAIL = "FAIL"


def lineage_configured(environ: Mapping[str, str] | None = None, cwd: Path | None = None,
                       home: Path | None = None) -> bool:
    """Whether the OpenLineage client has a transport configured (and is not disabled): ``OPENLINEAGE_URL``,
    ``OPENLINEAGE_CONFIG``, ``OPENLINEAGE__TRANSPORT__*``, or an ``openlineage.yml`` where the client looks.
    Without one the client would print to the console; Heartbeat then sends nothing at all."""
    env = os.environ if environ is None else environ
    if env.get("OPENLINEAGE_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OPENLINEAGE_URL") or env.get("OPENLINEAGE_CONFIG"):
        return True
    if any(name.startswith("OPENLINEAGE__TRANSPORT__") for name in env):
        return True
    folders = [cwd or Path.cwd(), (home or Path.home()) / ".openlineage"]
    return any((folder / "openlineage.yml").is_file() for folder in folders)


def lineage_run_id(job_namespace: str, job_id: str, job_run_id: str) -> str:
    """The OpenLineage run id (a UUID) of the backend's run ``job_run_id`` of ``job_id``: the same in every process."""
    return str(uuid.uuid5(_RUN_IDS, f"{job_namespace}\x1f{job_id}\x1f{job_run_id}"))


@dataclass(frozen=True)
class ConsumedInput:
    """One input of a run: the dataset (OpenLineage's naming) and the window of it the run consumes
    (``window``: the fields of the ``heartbeatWindow`` facet, senders/lineage_facets.py)."""

    namespace: str
    name: str
    sensor_source: str
    sensor_id: str
    window: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class LineageRecord:
    """One OpenLineage event to send: which run, which transition, when, and (START) its inputs."""

    kind: LineageKind
    job_namespace: str
    job_id: str
    job_run_id: str
    event_time: datetime
    inputs: tuple[ConsumedInput, ...] = ()
    #: a failed run's error (redacted before it is sent)
    message: str | None = None
    #: the jobs backend's name (``local``, ``databricks``, a plugin's)
    backend: str | None = None

    @property
    def run_id(self) -> str:
        return lineage_run_id(self.job_namespace, self.job_id, self.job_run_id)


def build_event(record: LineageRecord) -> RunEvent:
    """The client's RunEvent of ``record`` (imports the client: call only when lineage is on)."""
    from openlineage.client.event_v2 import InputDataset, Job, Run, RunEvent, RunState
    from openlineage.client.facet_v2 import error_message_run, job_type_job

    from heartbeat_runner.senders.lineage_facets import HeartbeatRunRunFacet, HeartbeatWindowInputDatasetFacet

    run_facets: dict[str, Any] = {"heartbeatRun": HeartbeatRunRunFacet(
        jobRunId=record.job_run_id, jobsBackend=record.backend, producer=PRODUCER)}
    if record.kind is LineageKind.FAIL and record.message:
        run_facets["errorMessage"] = error_message_run.ErrorMessageRunFacet(
            message=redact(record.message), programmingLanguage="unknown", producer=PRODUCER)
    job_facets: dict[str, Any] = {"jobType": job_type_job.JobTypeJobFacet(processingType="BATCH", integration="HEARTBEAT",
                                                          jobType="JOB", producer=PRODUCER)}
    inputs = [InputDataset(namespace=i.namespace, name=i.name, inputFacets={
        "heartbeatWindow": HeartbeatWindowInputDatasetFacet(sensorSource=i.sensor_source, sensorId=i.sensor_id,
                                                            producer=PRODUCER, **i.window)})
              for i in record.inputs]
    return RunEvent(eventType=RunState(record.kind.value), eventTime=record.event_time.isoformat(),
                    run=Run(runId=record.run_id, facets=run_facets),
                    job=Job(namespace=record.job_namespace, name=record.job_id, facets=job_facets),
                    producer=PRODUCER, inputs=inputs, outputs=[])


class LineageSender:
    """Emits RunEvents through the client's configured transport; every failure one redacted line."""

    def __init__(self, client: OpenLineageClient | None = None):
        if client is None:
            from openlineage.client import OpenLineageClient

            client = OpenLineageClient()
        self.client = client

    def emit(self, record: LineageRecord) -> None:
        """Send one event; DeliveryError (retryable by the caller) when the transport refuses it."""
        try:
            self.client.emit(build_event(record))
        except Exception as exc:  # noqa: BLE001 - foreign code: any transport error is one refused delivery
            raise DeliveryError(f"OpenLineage {record.kind.value} of {record.job_id} run {record.job_run_id}: "
                                f"{type(exc).__name__}: {redact(str(exc))}") from exc

    def close(self) -> None:
        try:
            self.client.close(1.0)
        except Exception:  # noqa: BLE001, S110 - closing a transport must not hide the command's outcome
            pass
