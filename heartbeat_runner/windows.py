"""Windows of source data: how much one run may cover, and one source's part of a run.

A leaf module: the sources cut their pending data into ``SourceWindow`` pieces no larger
than a ``WindowLimit`` (``Source.split``); the run policies plan runs from the pieces.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta

_SPAN = re.compile(r"^\s*(\d+)\s*([smhdw])\s*$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days", "w": "weeks"}


@dataclass(frozen=True)
class WindowLimit:
    """The most one run may cover: a count (Delta versions, Kafka offsets per partition, key units)
    or a time span (a date or timestamp key, SAP load dates)."""

    count: int | None = None
    span: timedelta | None = None

    @classmethod
    def parse(cls, value: object) -> WindowLimit:
        """``10`` (a count) or ``7d`` / ``12h`` / ``30m`` / ``90s`` / ``2w`` (a span); ValueError otherwise."""
        if isinstance(value, bool):
            raise ValueError(f"max_window {value!r}: expected a count such as 10 or a span such as 7d")
        if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
            count = int(value)
            if count < 1:
                raise ValueError(f"max_window {value!r}: a count must be at least 1")
            return cls(count=count)
        match = _SPAN.match(str(value))
        if not match or int(match.group(1)) < 1:
            raise ValueError(f"max_window {value!r}: expected a count such as 10 or a span such as 7d, 12h, 30m")
        return cls(span=timedelta(**{_UNITS[match.group(2)]: int(match.group(1))}))

    def __str__(self) -> str:
        return str(self.count) if self.count is not None else f"{self.span}"


@dataclass(frozen=True)
class SourceWindow:
    """One source's part of one run: its bounds as cursors (machine) and as text (the job's parameters)."""

    sensor_source: str
    sensor_id: str
    cursor_from: str | None
    cursor_to: str | None
    window_from: str | None
    window_to: str | None

    def parameter(self) -> dict[str, str | None]:
        """As the job receives it in ``heartbeat_windows``."""
        return {"sensor_source": self.sensor_source, "sensor_id": self.sensor_id,
                "from": self.window_from, "to": self.window_to}


