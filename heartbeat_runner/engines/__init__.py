"""Engines: starting, sharing, recycling and talking to the SQL engine Heartbeat's tables live in.

The engine adapter (``engine``: Sail in a child process, Apache Spark + Delta local or over Spark Connect,
Databricks' own session), the engine processes (``sail_process``, ``spark_local``, ``spark_share``,
``spark_jars``), the one table of foreign errors (``engine_errors``) and the Delta log read as files
(``delta_log``). May import ``core`` only; knows nothing of Heartbeat's own tables.
"""
