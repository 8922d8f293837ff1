"""Lakehouse: the engine and Heartbeat's own tables.

The engine adapter (Sail, Apache Spark + Delta, Databricks), the table store (events, run
reports, sensor state), the dbt project the runner invokes, table maintenance and fast
Delta-log reads. May import ``core`` only.
"""
