"""The OpenLineage JSON schema a received event is validated against (with ``jsonschema``).

No package on the registries CI reaches ships the spec's schema files (``spec/OpenLineage.json`` and the
facets' ``*.json``): the ``openlineage-java`` jar on Maven Central (1.54.0) holds classes generated from
them but not the files, no sources jar is published, and ``openlineage-python`` / ``openlineage-integration-
common`` on PyPI ship only integration facets. So the schema is built here from the client's generated
classes (``openlineage.client.generated``), which the OpenLineage project generates from those same files:
every attrs field is a property of its type, the fields without a default are required, enums are enums,
facets keep ``_producer`` and ``_schemaURL`` required and allow more properties (as the spec's BaseFacet),
and the spec's formats (``uuid`` of ``runId``, ``date-time`` of ``eventTime``, ``uri`` of the producers)
are checked. Optional fields are not nullable: the client leaves them out, as the spec wants.
"""

from __future__ import annotations

import enum
import types
import typing
from typing import Any

#: the spec's formats by field name (OpenLineage.json: RunEvent.eventTime, Run.runId, BaseEvent.producer,
#: BaseEvent.schemaURL, BaseFacet._producer, BaseFacet._schemaURL)
FORMATS = {"eventTime": "date-time", "runId": "uuid", "producer": "uri", "schemaURL": "uri", "_producer": "uri",
           "_schemaURL": "uri"}


def run_event_schema() -> dict[str, Any]:
    """The JSON schema of a RunEvent as the client's generated classes define it, with the schema of each
    standard facet Heartbeat sends under its key (a facet map's values are otherwise any BaseFacet)."""
    from openlineage.client.generated.base import RunEvent
    from openlineage.client.generated.error_message_run import ErrorMessageRunFacet
    from openlineage.client.generated.job_type_job import JobTypeJobFacet

    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **_schema(RunEvent, set())}
    standard = {("run", "errorMessage"): ErrorMessageRunFacet, ("job", "jobType"): JobTypeJobFacet}
    for (part, key), facet in standard.items():
        schema["properties"][part]["properties"]["facets"].setdefault("properties", {})[key] = _schema(facet, set())
    return schema


def _schema(kind: Any, seen: set[type]) -> dict[str, Any]:
    import attr

    origin = typing.get_origin(kind)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(kind) if a is not type(None)]
        return _schema(options[0], seen) if len(options) == 1 else {"anyOf": [_schema(a, seen) for a in options]}
    if origin in (list, tuple):
        return {"type": "array", "items": _schema(typing.get_args(kind)[0], seen)}
    if origin is dict:
        return {"type": "object", "additionalProperties": _schema(typing.get_args(kind)[1], seen)}
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return {"enum": [m.value for m in kind]}
    if kind is str:
        return {"type": "string"}
    if kind is int:
        return {"type": "integer"}
    if kind is float:
        return {"type": "number"}
    if kind is bool:
        return {"type": "boolean"}
    if isinstance(kind, type) and attr.has(kind):
        return _object(kind, seen)
    return {}  # Any


def _object(kind: type, seen: set[type]) -> dict[str, Any]:
    import attr
    from openlineage.client.generated.base import BaseFacet

    if kind in seen:
        return {"type": "object"}
    hints = typing.get_type_hints(kind)
    properties, required = {}, []
    for field in attr.fields(kind):
        name = field.name
        prop = _schema(hints.get(name, Any), seen | {kind})
        if name in FORMATS:
            prop = {**prop, "format": FORMATS[name]}
        properties[name] = prop
        if field.default is attr.NOTHING or name in FORMATS:  # the spec requires these; the client defaults them
            required.append(name)
    facet = issubclass(kind, BaseFacet)
    return {"type": "object", "properties": properties, "required": sorted(required),
            # a facet may carry more (custom facets); the event and its parts are closed, as in the spec
            "additionalProperties": facet or kind.__name__ in ("Run", "Job", "InputDataset", "OutputDataset")}


def validator():
    """A validator of RunEvents with format checks (``uuid`` always; ``date-time`` and ``uri`` when
    jsonschema's optional checkers are installed)."""
    import jsonschema

    schema = run_event_schema()
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema, format_checker=cls.FORMAT_CHECKER)
