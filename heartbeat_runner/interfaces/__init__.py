"""Interfaces: what people use — the CLI, operator commands, output, the demo, ``serve``, the page.

The top layer: may import every layer, and nothing imports it (but ``__main__``).
"""
