"""The one duration grammar: settings (``HEARTBEAT_*``) and the run-policy file both use it.

A duration is a plain number of seconds (``90``, ``1.5``) or a number with one unit: ``s``, ``m``,
``h``, ``d``, ``w`` (``90s``, ``15m``, ``1.5h``, ``2d``, ``1w``). Negative values and anything
else are refused with a ``DurationError`` that says what was expected.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta

from heartbeat_runner.core.errors import InvalidInputError

#: seconds per unit
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
#: how the grammar is shown in error messages and in the settings table
DURATION_FORM = "a duration such as 90s, 15m, 1.5h, 2d, 1w or a number of seconds"
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([smhdw]?)\s*$")


class DurationError(InvalidInputError, ValueError):
    """A value is not a duration (also a ValueError, so that pydantic reports it as a field's problem)."""


def parse_seconds(value: object, *, allow_zero: bool = True) -> float:
    """``value`` as a finite number of seconds >= 0 (> 0 when not ``allow_zero``); DurationError otherwise.

    Invariant: every duration Heartbeat reads goes through here, so every place accepts the same forms.
    """
    seconds = _seconds(value)
    if seconds is None or (seconds == 0 and not allow_zero):
        bound = "at least 0" if allow_zero else "greater than 0"
        raise DurationError(f"{value!r} is not {DURATION_FORM} ({bound})")
    return seconds


def parse_duration(value: object, *, allow_zero: bool = True) -> timedelta:
    """``parse_seconds`` as a timedelta."""
    return timedelta(seconds=parse_seconds(value, allow_zero=allow_zero))


def _seconds(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        number = float(value)
        return number if math.isfinite(number) and number >= 0 else None
    if isinstance(value, timedelta):
        return value.total_seconds() if value >= timedelta(0) else None
    found = _DURATION.match(str(value))
    if not found:
        return None
    return float(found.group(1)) * UNIT_SECONDS[found.group(2) or "s"]
