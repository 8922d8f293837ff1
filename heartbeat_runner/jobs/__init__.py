"""Jobs backends: where triggered jobs run (local commands, Databricks Jobs).

Each backend implements the small interface in ``base`` (idempotent trigger, run status).
May import ``core``, ``lakehouse`` and ``sensing``; in practice only ``core``.
"""
