"""Exception types shared across the runner."""

from __future__ import annotations


class HeartbeatError(Exception):
    """Base class for errors the CLI reports without a traceback.

    The kinds below say what a caller can do about an error; the layer that knows raises the
    kind (``raise ... from exc``), and the CLI and the status page map kinds to exit codes and
    HTTP statuses in one table (``interfaces/outcomes.py``). Nothing tells errors apart by text.
    """


class NotFoundError(HeartbeatError):
    """What was asked for does not exist (a job, a run, a table)."""


class ConflictError(HeartbeatError):
    """Someone else holds or changed what the request needs (the tick lease, a concurrent write)."""


class InvalidInputError(HeartbeatError):
    """The user's input is wrong (a flag, a file, a field): fix it and ask again; nothing was changed."""


class ForbiddenError(HeartbeatError):
    """The asker may not do this (actions are off, or the user is not an operator): nothing was changed."""


class TransientError(HeartbeatError):
    """It may work if tried again as it is (a timeout, an unavailable service)."""


class TerminalError(HeartbeatError):
    """It will not work as it is (bad credentials, an unsupported request)."""


class ConfigError(InvalidInputError):
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


class JobNotFoundError(JobsBackendError, NotFoundError):
    """The backend does not know the job id."""


class AuthError(JobsBackendError, TerminalError):
    """The backend rejected our credentials."""


class TickFailedError(HeartbeatError):
    """A one-shot tick raised before it changed anything (no event recorded): exit code 1. Its cause is the
    tick's own error (``__cause__``); its FAILED row is recorded under ``run_id``."""

    def __init__(self, message: str, run_id: str):
        self.run_id = run_id
        super().__init__(message)


class TickFailedAfterChangesError(TickFailedError):
    """A one-shot tick raised after it recorded events (new data, a trigger request, a started job): its own
    exit code (README: 4), since what it did stands and the next tick goes on from there."""


#: an error's kind as a record shows it: the first class it is an instance of (most specific first)
ERROR_KINDS: tuple[tuple[type[BaseException], str], ...] = (
    (NotFoundError, "not found"),
    (InvalidInputError, "invalid input"),
    (ConflictError, "conflict"),
    (TransientError, "transient"),
    (TerminalError, "terminal"),
    (HeartbeatError, "error"),
)
#: the kind of any error that is not a HeartbeatError (an engine or library failure, or a bug)
UNEXPECTED_KIND = "unexpected"


def kind_of(exc: BaseException) -> str:
    """``exc``'s kind (ERROR_KINDS), by its class; nothing reads its text."""
    return next((name for kind, name in ERROR_KINDS if isinstance(exc, kind)), UNEXPECTED_KIND)


def first_line(exc: BaseException) -> str:
    """The first non-blank line of an exception's text (its type name when it has none)."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[0] if lines else type(exc).__name__


def describe(exc: BaseException, label: str | None = None) -> str:
    """``<label or type>: <first line>``, short enough for a report cell (engine errors run to pages)."""
    return f"{label or type(exc).__name__}: {first_line(exc)}"[:2000]
