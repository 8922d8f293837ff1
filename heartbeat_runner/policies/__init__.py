"""Policies: what the tick applies on top of any jobs backend.

Automatic retry and maximum duration (``retry``), bounded catch-up, triggers per
event-time window, the run-policy file as a whole, and the sequences that turn a backlog
into runs. May import ``core``, ``lakehouse``, ``sensing`` and ``jobs``.
"""
