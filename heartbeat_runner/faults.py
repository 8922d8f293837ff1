"""Fault injection for crash tests: ``HEARTBEAT_CRASH_AT=<point>`` kills the process there."""

from __future__ import annotations

import os

#: Named step boundaries of a tick (see tick.py for the order).
CRASH_POINTS = (
    "after_sensing",
    "after_new_data_events",
    "during_dbt_build",
    "after_trigger_requested",
    "after_trigger_call",
    "after_triggered",
)
CRASH_EXIT_CODE = 86


def crash_point(name: str) -> None:
    """Die here, abruptly (no cleanup, like a killed process), when HEARTBEAT_CRASH_AT names this point."""
    if os.environ.get("HEARTBEAT_CRASH_AT") == name:
        os._exit(CRASH_EXIT_CODE)
