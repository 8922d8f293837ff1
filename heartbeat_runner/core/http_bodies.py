"""Reading an HTTP request's body by its ``Content-Length``, for the servers Heartbeat runs (the status page,
``POST /wake``): one rule, so a bad length gets the same one-line refusal everywhere.

Invariant: nothing is read unless the header is a whole number of bytes from 0 to ``max_bytes``; otherwise
InvalidInputError (a client's mistake: HTTP 400), or its subclass BodyTooLarge past ``max_bytes``.
"""

from __future__ import annotations

from typing import Protocol

from heartbeat_runner.core.errors import InvalidInputError

#: how much of a bad header value a refusal repeats
SHOWN_CHARS = 120


class Headers(Protocol):
    def get(self, name: str) -> str | None: ...


class Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


class BodyTooLarge(InvalidInputError):
    """The declared body is longer than the server reads."""


def read_body(headers: Headers, stream: Readable, max_bytes: int) -> bytes:
    """The request's body (empty without a ``Content-Length``)."""
    declared = (headers.get("Content-Length") or "0").strip()
    if not declared.isdigit():
        shown = declared if len(declared) <= SHOWN_CHARS else declared[:SHOWN_CHARS - 1] + "…"
        raise InvalidInputError(f"header Content-Length: expected a whole number of bytes, got {shown!r}")
    length = int(declared)
    if length > max_bytes:
        raise BodyTooLarge(f"request body over {max_bytes} bytes")
    return stream.read(length) if length else b""
