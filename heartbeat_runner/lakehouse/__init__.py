"""Lakehouse: Heartbeat's own tables, on whatever engine ``engines`` opened.

The table store (events, run reports, sensor state, the lease), the dbt project the runner invokes, table
maintenance and migrations. May import ``core`` and ``engines``.
"""
