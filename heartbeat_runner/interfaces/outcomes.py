"""What each kind of error means to the people who see it: the CLI's exit code and the status page's
HTTP status, in one table (the kinds are in ``core.errors``; nothing here reads an error's text)."""

from __future__ import annotations

from dataclasses import dataclass
from http import HTTPStatus

from heartbeat_runner.core.errors import (
    ConflictError,
    ForbiddenError,
    HeartbeatError,
    InvalidInputError,
    NotFoundError,
    TerminalError,
    TickFailedAfterChangesError,
    TickFailedError,
    TransientError,
)

#: the exit code of a command that failed (README, "Commands"): nothing was changed
EXIT_ERROR = 1
#: the exit code of a one-shot ``run`` whose tick failed after it recorded something (README, "Commands")
EXIT_FAILED_AFTER_CHANGES = 4


@dataclass(frozen=True)
class Outcome:
    exit_code: int
    http_status: HTTPStatus


#: the first class an error is an instance of decides (most specific first); any other error is a bug: 500
ERROR_OUTCOMES: tuple[tuple[type[BaseException], Outcome], ...] = (
    (TickFailedAfterChangesError, Outcome(EXIT_FAILED_AFTER_CHANGES, HTTPStatus.INTERNAL_SERVER_ERROR)),
    (TickFailedError, Outcome(EXIT_ERROR, HTTPStatus.INTERNAL_SERVER_ERROR)),
    (ForbiddenError, Outcome(EXIT_ERROR, HTTPStatus.FORBIDDEN)),
    (NotFoundError, Outcome(EXIT_ERROR, HTTPStatus.NOT_FOUND)),
    (InvalidInputError, Outcome(EXIT_ERROR, HTTPStatus.BAD_REQUEST)),
    (ValueError, Outcome(EXIT_ERROR, HTTPStatus.BAD_REQUEST)),
    (ConflictError, Outcome(EXIT_ERROR, HTTPStatus.CONFLICT)),
    (TransientError, Outcome(EXIT_ERROR, HTTPStatus.SERVICE_UNAVAILABLE)),
    (TerminalError, Outcome(EXIT_ERROR, HTTPStatus.BAD_REQUEST)),
    (HeartbeatError, Outcome(EXIT_ERROR, HTTPStatus.BAD_REQUEST)),
)
UNEXPECTED = Outcome(EXIT_ERROR, HTTPStatus.INTERNAL_SERVER_ERROR)


def outcome_of(exc: BaseException) -> Outcome:
    """The exit code and HTTP status of ``exc``, by its class."""
    return next((outcome for kind, outcome in ERROR_OUTCOMES if isinstance(exc, kind)), UNEXPECTED)
