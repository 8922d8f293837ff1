"""Exception types shared across the runner."""

from __future__ import annotations


class HeartbeatError(Exception):
    """Base class for errors the CLI reports without a traceback."""


class ConfigError(HeartbeatError):
    """Invalid sensor configuration. Carries every problem found, each naming file, line and column."""

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))


class SourceError(HeartbeatError):
    """A source could not be sensed (unreachable, bad credentials, missing object, bad sensor_id)."""


class JobsBackendError(HeartbeatError):
    """A jobs API call failed. `retryable` says whether the same call may succeed later."""

    def __init__(self, message: str, *, retryable: bool = False):
        self.retryable = retryable
        super().__init__(message)


class JobNotFoundError(JobsBackendError):
    """The backend does not know the job id."""


class AuthError(JobsBackendError):
    """The backend rejected our credentials."""


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's text (its type name when it has none)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def describe(exc: BaseException, label: str | None = None) -> str:
    """``<label or type>: <first line>``, short enough for a report cell (engine errors run to pages)."""
    return f"{label or type(exc).__name__}: {first_line(exc)}"[:2000]
