"""Operator actions from the status page: pause, resume, complete, retry, trigger, reset.

They are off unless the page was started with ``--allow-actions``. When they are on:

- locally (not a Databricks App, and no identity forwarded by a proxy) the operator is the user
  running the page, which binds to 127.0.0.1 unless told otherwise;
- as a Databricks App (``DATABRICKS_APP_NAME`` or ``DATABRICKS_APP_PORT`` in the environment, both
  set by Databricks Apps), or whenever a request carries a forwarded identity, the operator is the
  signed-in user's e-mail address in ``X-Forwarded-Email``. A request without it is refused: the
  page fails closed, it never falls back to the user running it. ``X-Forwarded-User`` is the identity
  provider's user id, not an e-mail, and is never matched. The user may act when the address is
  listed in ``HEARTBEAT_UI_OPERATORS`` (comma-separated e-mail addresses) or belongs to a workspace
  group listed in ``HEARTBEAT_UI_OPERATOR_GROUPS`` (looked up through the workspace's SCIM users
  API); with neither, nobody may.

Each action writes the same events as the CLI command of the same name, with the
operator and ``"via": "ui"`` in the payload: the audit trail.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from heartbeat_runner.core.errors import ForbiddenError, HeartbeatError, InvalidInputError
from heartbeat_runner.core.records import EventType
from heartbeat_runner.core.settings import read_environment
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

#: Headers Databricks Apps sets on every request it forwards to the app: the signed-in user's e-mail
#: address, and the identity provider's user id (not an e-mail: shown, never matched).
EMAIL_HEADER = "X-Forwarded-Email"
USER_HEADER = "X-Forwarded-User"
IDENTITY_HEADERS = (EMAIL_HEADER, USER_HEADER)
#: Set by Databricks Apps in the environment of every app it runs ("Databricks Apps system environment").
APP_VARIABLES = ("DATABRICKS_APP_NAME", "DATABRICKS_APP_PORT")
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


class ActionRefused(ForbiddenError):
    """The request may not perform the action (actions off, or the user is not an operator)."""


class GroupLookup(Protocol):
    """The workspace groups (display names) a user, named by e-mail address, is a member of."""

    def __call__(self, email: str) -> frozenset[str]: ...


@dataclass(frozen=True)
class ActionPolicy:
    """Who may act: nobody unless ``enabled``; behind a proxy or as an App, only a named operator.

    Invariants: ``operators`` are lower-case e-mail addresses; a request that carries a forwarded
    identity, or any request when ``as_app``, acts only as the e-mail in ``X-Forwarded-Email`` and
    only when that address is an operator or a member of one of ``operator_groups``.
    """

    enabled: bool = False
    operators: frozenset[str] = frozenset()
    operator_groups: frozenset[str] = frozenset()
    as_app: bool = False
    groups_of: GroupLookup | None = field(default=None, compare=False)

    @classmethod
    def from_environment(cls, enabled: bool, env: Mapping[str, str],
                         groups_of: GroupLookup | None = None) -> ActionPolicy:
        """The policy of a page started with ``--allow-actions`` (``enabled``) in environment ``env``.

        InvalidInputError when ``HEARTBEAT_UI_OPERATORS`` names something that is not an e-mail address.
        """
        declared = read_environment(env)
        names = list(declared.ui_operators)
        not_emails = sorted(n for n in names if "@" not in n)
        if not_emails:
            raise InvalidInputError(f"HEARTBEAT_UI_OPERATORS: {', '.join(not_emails)} is not an e-mail address; "
                                    "operators are matched on the signed-in user's e-mail (X-Forwarded-Email)")
        groups = frozenset(declared.ui_operator_groups)
        return cls(enabled=enabled, operators=frozenset(n.lower() for n in names), operator_groups=groups,
                   as_app=any(env.get(name) for name in APP_VARIABLES), groups_of=groups_of)

    def operator(self, headers: Headers) -> str:
        """Who the request acts as; ActionRefused when it may not act at all."""
        if not self.enabled:
            raise ActionRefused("operator actions are off: start the page with --allow-actions to enable them")
        email = _header(headers, EMAIL_HEADER)
        if email is None:
            if not self.as_app and _header(headers, USER_HEADER) is None:
                return local_operator()
            raise ActionRefused(f"no signed-in user: the request carries no {EMAIL_HEADER} header (set by "
                                "Databricks Apps); actions are refused without it")
        if email.lower() in self.operators or self._in_operator_group(email):
            return email
        raise ActionRefused(f"{email} is not an operator of this deployment "
                            "(HEARTBEAT_UI_OPERATORS, HEARTBEAT_UI_OPERATOR_GROUPS)")

    def _in_operator_group(self, email: str) -> bool:
        """Whether ``email`` is in an operator group; ActionRefused when the workspace cannot say (fail closed)."""
        if not self.operator_groups or self.groups_of is None:
            return False
        try:
            return bool(self.operator_groups & self.groups_of(email))
        except HeartbeatError as exc:
            raise ActionRefused(f"{email}: could not check membership of HEARTBEAT_UI_OPERATOR_GROUPS: {exc}") from exc

    def can_act(self, headers: Headers) -> bool:
        try:
            self.operator(headers)
        except ActionRefused:
            return False
        return True


def _header(headers: Headers, name: str) -> str | None:
    value = headers.get(name)
    return value.strip() or None if value else None


def forwarded_user(headers: Headers) -> str | None:
    """The user a proxy (Databricks Apps) signed in, if the request came through one (shown, not matched)."""
    for name in IDENTITY_HEADERS:
        value = _header(headers, name)
        if value:
            return value
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
    """A text field of the body, stripped; None when absent or blank. A whole number stands for its digits
    (a job id sent as ``123``: one meaning only); anything else that is not text is refused, naming the field."""
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, str):
        raise InvalidInputError(f"field {name}: expected text (or a whole number), got {_json_kind(value)}")
    return value.strip() or None


def _json_kind(value: object) -> str:
    """What a JSON value is, in JSON's words."""
    if isinstance(value, bool):
        return "true/false"
    return {float: "a number with a fraction", list: "a list", dict: "an object"}.get(type(value), "another kind")


def perform(app: App, request: ActionRequest, by: str) -> str:
    """Carry out one action as ``by``; returns what was done, in one sentence."""
    job = request.job_id
    if request.action is Action.PAUSE:
        record_job_event(app, job, EventType.JOB_PAUSED, by=by, via="ui", reason=request.reason)
        return f"job {job} paused by {by}"
    if request.action is Action.RESUME:
        record_job_event(app, job, EventType.JOB_RESUMED, by=by, via="ui", reason=request.reason)
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
