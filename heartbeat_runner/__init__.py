"""Heartbeat: a pull-based orchestrator for lakehouses.

Sense upstream sources cheaply, decide readiness in SQL (dbt models), trigger
downstream jobs exactly once and track them to completion.
"""

__version__ = "0.1.0"
