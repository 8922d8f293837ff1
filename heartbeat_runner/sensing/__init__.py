"""Sensing: the sensor config, the source types and sensing many sources in parallel.

``config`` loads and validates the config CSV, ``sources`` holds one module per source
type behind one interface, ``parallel`` senses every due source once with a timeout.
May import ``core`` and ``lakehouse``.
"""
