"""Core: the leaf vocabulary every layer shares.

Errors, records (events, statuses, run reports), names, settings, windows, YAML reading,
process checks, fault points and stop handling. Standard library and small third-party
packages only: nothing here imports another ``heartbeat_runner`` layer.
"""
