"""Operator actions from the status page: pause, resume, complete, retry, trigger, reset.

They are off unless the page was started with ``--allow-actions``. When they are on:

- locally (no identity forwarded by a proxy) the operator is the user running the page,
  which binds to 127.0.0.1 unless told otherwise;
- as a Databricks App, the user is the one Databricks Apps forwards in
  ``X-Forwarded-Email`` (or ``X-Forwarded-User``), and only the users listed in
  ``HEARTBEAT_UI_OPERATORS`` (comma-separated) may act; with no list, nobody may.

Each action writes the same events as the CLI command of the same name, with the
operator and ``"via": "ui"`` in the payload: the audit trail.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

from heartbeat_runner.core.errors import HeartbeatError, InvalidInputError
from heartbeat_runner.core.records import EventType
from heartbeat_runner.interfaces.operations import (
    ask_retry,
    ask_trigger,
    local_operator,
    parse_since,
    record_job_event,
    reset_job,
)
from heartbeat_runner.runner.app import App
from heartbeat_runner.runner.lease import tick_lease

#: Headers Databricks Apps sets on every request it forwards to the app, with the signed-in user.
IDENTITY_HEADERS = ("X-Forwarded-Email", "X-Forwarded-User")
#: Seconds a reset from the page waits for a ticking runner to let go of the tick lease.
RESET_LEASE_WAIT_S = 30.0


class Headers(Protocol):
    """What is read of a request's headers (a plain dict, or http.server's message)."""

    def get(self, name: str, default: None = None) -> str | None: ...


class Action(str, enum.Enum):
    PAUSE = "pause"
    RESUME = "resume"
    COMPLETE = "complete"
    RETRY = "retry"
    TRIGGER = "trigger"
    RESET = "reset"


class ActionRefused(HeartbeatError):
    """The request may not perform the action (actions off, or the user is not an operator)."""


@dataclass(frozen=True)
class ActionPolicy:
    """Who may act: nobody unless ``enabled``; behind a proxy, only the named operators."""

    enabled: bool = False
    operators: frozenset[str] = frozenset()

    @classmethod
    def from_environment(cls, enabled: bool, env: Mapping[str, str]) -> ActionPolicy:
        names = {n.strip().lower() for n in env.get("HEARTBEAT_UI_OPERATORS", "").split(",") if n.strip()}
        return cls(enabled=enabled, operators=frozenset(names))

    def operator(self, headers: Headers) -> str:
        """Who the request acts as; ActionRefused when it may not act at all."""
        if not self.enabled:
            raise ActionRefused("operator actions are off: start the page with --allow-actions to enable them")
        forwarded = forwarded_user(headers)
        if forwarded is None:
            return local_operator()
        if forwarded.lower() not in self.operators:
            raise ActionRefused(f"{forwarded} is not an operator of this deployment (HEARTBEAT_UI_OPERATORS)")
        return forwarded

    def can_act(self, headers: Headers) -> bool:
        try:
            self.operator(headers)
        except ActionRefused:
            return False
        return True


def forwarded_user(headers: Headers) -> str | None:
    """The user a proxy (Databricks Apps) signed in, if the request came through one."""
    for name in IDENTITY_HEADERS:
        value = headers.get(name)
        if value:
            return value.strip()
    return None


@dataclass(frozen=True)
class ActionRequest:
    action: Action
    job_id: str
    message: str | None = None
    failed: bool = False
    since: str | None = None
    reason: str | None = None

    @classmethod
    def parse(cls, action: str, body: Mapping[str, object]) -> ActionRequest:
        """From the page's JSON body; HeartbeatError naming the field that is wrong."""
        try:
            kind = Action(action)
        except ValueError as exc:
            raise InvalidInputError(f"unknown action {action!r}; expected one of "
                                 f"{', '.join(a.value for a in Action)}") from exc
        job_id = _text(body, "job_id")
        if not job_id:
            raise InvalidInputError("field job_id: a job id is required")
        reason = _text(body, "reason")
        if kind is Action.RESET and not reason:
            raise InvalidInputError("field reason: a reset needs a reason (it goes into the audit trail)")
        return cls(kind, job_id, message=_text(body, "message"), failed=bool(body.get("failed")),
                   since=_text(body, "since"), reason=reason)


def _text(body: Mapping[str, object], name: str) -> str | None:
    """A text field of the body, stripped; None when absent or blank; HeartbeatError when not text."""
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInputError(f"field {name}: expected text")
    return value.strip() or None


def perform(app: App, request: ActionRequest, by: str) -> str:
    """Carry out one action as ``by``; returns what was done, in one sentence."""
    job = request.job_id
    if request.action is Action.PAUSE:
        record_job_event(app, job, EventType.JOB_PAUSED, by=by, via="ui")
        return f"job {job} paused by {by}"
    if request.action is Action.RESUME:
        record_job_event(app, job, EventType.JOB_RESUMED, by=by, via="ui")
        return f"job {job} resumed by {by}"
    if request.action is Action.COMPLETE:
        kind = EventType.FAILED if request.failed else EventType.COMPLETED
        record_job_event(app, job, kind, by=by, via="ui", message=request.message)
        return f"job {job}: {kind.value} recorded by {by}"
    if request.action is Action.RETRY:
        ask_retry(app, job, by=by, via="ui", reason=request.reason)
        return f"job {job}: retry asked by {by}; the next tick re-runs it"
    if request.action is Action.TRIGGER:
        ask_trigger(app, job, by=by, via="ui", reason=request.reason)
        return f"job {job}: manual run asked by {by}; the next tick requests it"
    since = parse_since(request.since) if request.since else None
    with tick_lease(app.store).held(RESET_LEASE_WAIT_S):
        done = reset_job(app, job, since, request.reason or "", by=f"{by} (ui)")
    return f"job {job} reset by {by}; {len(done.plan.moves)} source cursor(s) moved back"
