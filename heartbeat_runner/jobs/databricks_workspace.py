"""The workspace beside the Jobs API: secret scopes and group membership, through the databricks-sdk.

:class:`DatabricksSecrets` is the :class:`~heartbeat_runner.core.secrets.SecretResolver` for
``{secret: scope/key}`` references; :class:`WorkspaceGroups` says which workspace groups a user is in
(the status page's operator groups). Both authenticate with the SDK's unified auth chain
(DATABRICKS_HOST + a token, OAuth M2M, a ~/.databrickscfg profile, or the identity of the Databricks
job or App they run in), and make the client only on first use: a deployment without references
never needs Databricks credentials.

Invariants: a secret's value is decoded and returned, never logged, cached or put into an error;
SDK errors are mapped here, in :func:`_secret_error`, and keep their cause.
"""

from __future__ import annotations

import base64
import binascii
import threading
from collections.abc import Callable
from typing import Any

from heartbeat_runner.core.errors import HeartbeatError, first_line
from heartbeat_runner.core.secrets import SecretAccessError, SecretError, SecretNotFoundError

#: seconds one call may take, and how long the SDK retries a throttled or unavailable workspace
HTTP_TIMEOUT_S = 30.0
RETRY_TIMEOUT_S = 60


def workspace_client() -> Any:
    """A WorkspaceClient from the SDK's auth chain; SecretAccessError when no credentials are found."""
    from databricks.sdk import WorkspaceClient
    from databricks.sdk.config import Config

    try:
        config = Config(product="heartbeat-runner", http_timeout_seconds=HTTP_TIMEOUT_S,
                        retry_timeout_seconds=RETRY_TIMEOUT_S)
    except ValueError as exc:
        raise SecretAccessError(
            "Databricks authentication is not configured. Set DATABRICKS_HOST and DATABRICKS_TOKEN (or "
            "DATABRICKS_CLIENT_ID/DATABRICKS_CLIENT_SECRET), or DATABRICKS_CONFIG_PROFILE, or run on "
            f"Databricks. The SDK said: {first_line(exc)}") from exc
    return WorkspaceClient(config=config)


class _Lazy:
    """One client, made on first use (thread-safe: sources are sensed from several threads)."""

    def __init__(self, client: Any = None, factory: Callable[[], Any] = workspace_client):
        self._client = client
        self._factory = factory
        self._lock = threading.Lock()

    def client(self) -> Any:
        with self._lock:
            if self._client is None:
                self._client = self._factory()
            return self._client


class DatabricksSecrets(_Lazy):
    """Reads ``scope/key`` through ``GET /api/2.0/secrets/get`` (the value comes base64-encoded): the route off
    a cluster (a laptop, ``check``); on a cluster :class:`SessionSecrets` reads through the Spark session."""

    def secret(self, scope: str, key: str) -> str:
        try:
            answer = self.client().secrets.get_secret(scope=scope, key=key)
        except SecretError:
            raise
        except Exception as exc:  # noqa: BLE001 - every SDK and transport error is mapped by _secret_error
            raise _secret_error(scope, key, exc) from exc
        try:
            return base64.b64decode(answer.value or "", validate=True).decode()
        except (binascii.Error, UnicodeDecodeError) as exc:
            raise SecretAccessError(f"secret {scope}/{key}: the workspace's answer is not base64 text") from exc


#: how engines say a SQL function does not exist (Apache Spark, Sail): the session has no ``secret()``
UNKNOWN_FUNCTION = ("UNRESOLVED_ROUTINE", "unknown function", "Undefined function")
#: the query :class:`SessionSecrets` runs; scope and key are bound parameters, never pasted into the text
SECRET_QUERY = "SELECT secret(:scope, :key) AS value"


class SessionSecrets:
    """Reads ``scope/key`` on a Databricks cluster through the session's SQL function ``secret(scope, key)``,
    which reads a secret as the cluster's identity does (the reference's route on a cluster); ``fallback`` (the
    REST route) where the session has no such function (a Spark that is not Databricks').

    ``query(text, args)`` runs one SQL statement with named parameters and returns its rows (the engine's).
    Invariants: scope and key travel as bound parameters; the value is returned, never logged or kept, and an
    error names scope and key only, keeping its cause.
    """

    def __init__(self, query: Callable[[str, dict[str, object]], list[Any]], fallback: Any):
        self._query = query
        self._fallback = fallback
        self._has_function: bool | None = None

    def secret(self, scope: str, key: str) -> str:
        if self._has_function is False:
            return str(self._fallback.secret(scope, key))
        try:
            rows = self._query(SECRET_QUERY, {"scope": scope, "key": key})
        except Exception as exc:  # noqa: BLE001 - every engine error is mapped here
            text = str(exc)
            if any(marker in text for marker in UNKNOWN_FUNCTION):
                self._has_function = False
                return str(self._fallback.secret(scope, key))
            if "does not exist" in text or "NOT_FOUND" in text:
                raise SecretNotFoundError(f"secret scope {scope!r} has no key {key!r}, or the scope does not exist "
                                          f"({type(exc).__name__})") from exc
            raise SecretAccessError(f"secret {scope}/{key}: the session's secret() refused it ({type(exc).__name__}: "
                                    f"{first_line(exc)})") from exc
        self._has_function = True
        value = rows[0][0] if rows else None
        if value is None:
            raise SecretNotFoundError(f"secret scope {scope!r} has no key {key!r} (secret() returned nothing)")
        return str(value)


def _secret_error(scope: str, key: str, exc: Exception) -> SecretError:
    """The SDK's error as a SecretError naming scope and key (the SDK's text never holds the value)."""
    from databricks.sdk.errors import NotFound, PermissionDenied, Unauthenticated

    if isinstance(exc, NotFound):
        return SecretNotFoundError(f"secret scope {scope!r} has no key {key!r}, or the scope does not exist "
                                   f"({first_line(exc)})")
    if isinstance(exc, (PermissionDenied, Unauthenticated)):
        return SecretAccessError(f"secret {scope}/{key}: Databricks refused our credentials or their permission "
                                 f"to read the scope ({first_line(exc)})")
    return SecretAccessError(f"secret {scope}/{key}: the workspace did not answer ({type(exc).__name__}: "
                             f"{first_line(exc)})")


class GroupLookupError(HeartbeatError):
    """The workspace could not say which groups a user is in (the caller refuses: it fails closed)."""


class WorkspaceGroups(_Lazy):
    """The groups (display names) of the workspace user with e-mail ``email`` (SCIM Users, by userName)."""

    def __call__(self, email: str) -> frozenset[str]:
        quoted = email.replace("\\", "\\\\").replace('"', '\\"')
        try:
            users = list(self.client().users.list(filter=f'userName eq "{quoted}"', attributes="userName,groups"))
        except SecretError as exc:
            raise GroupLookupError(f"groups of {email}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - every SDK and transport error means: not known
            raise GroupLookupError(f"groups of {email}: the workspace did not say ({type(exc).__name__}: "
                                   f"{first_line(exc)})") from exc
        return frozenset(group.display for user in users if (user.user_name or "").lower() == email.lower()
                         for group in (user.groups or []) if group.display)
