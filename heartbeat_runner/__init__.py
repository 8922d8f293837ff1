"""Heartbeat: a pull-based orchestrator for lakehouses.

Sense upstream sources cheaply, decide readiness in SQL (dbt models), trigger
downstream jobs exactly once and track them to completion.
"""

import os

__version__ = "0.1.0"

# gRPC (the Spark Connect client: Sail, a Connect server, Databricks Connect) runs fork handlers
# around every fork() of this process unless told not to. PySpark starts a classic session's JVM
# with fork() + preexec_fn, and a child forked while those handlers pause and restart gRPC's
# threads can die before it execs (CI saw "Java gateway process exited before sending its port
# number" right after Spark Connect tests). The handlers only serve children that go on using
# gRPC; every child here execs at once. Set before any channel exists (gRPC reads it once);
# an explicit GRPC_ENABLE_FORK_SUPPORT in the environment wins.
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
