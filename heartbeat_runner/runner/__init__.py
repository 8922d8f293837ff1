"""Runner: one tick, the tick lease, and the wiring that builds both from settings.

May import every layer below it: ``core``, ``lakehouse``, ``sensing``, ``jobs``, ``policies``.
"""
