"""Secret references and the resolver interface. A leaf: the standard library only.

A setting that holds a secret (a password, a webhook URL, a routing key) is never written in a
file; the file holds a *reference* to it instead:

- ``{env: NAME}``: the environment variable NAME;
- ``{secret: scope/key}``: key ``key`` of the Databricks secret scope ``scope``, read through the
  workspace's secrets API with the SDK's unified auth chain (``jobs/databricks_workspace.py``
  implements :class:`SecretResolver` for it; the runner passes it to the layers that resolve).

Invariants: a resolved value is returned to the one caller that needs it and nothing else; it is
never logged, stored, cached or put into an error message. Errors name the reference (the variable,
or the scope and key) and where it was written (file, row or field), never the value.
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol

from heartbeat_runner.core.errors import HeartbeatError, InvalidInputError, NotFoundError, TerminalError


class SecretError(HeartbeatError):
    """A referenced secret could not be read. The message names the reference and where it was written."""


class SecretNotFoundError(SecretError, NotFoundError):
    """The environment variable is not set, or the scope or key does not exist."""


class SecretAccessError(SecretError, TerminalError):
    """No credentials for the workspace, or they may not read the scope."""


class SecretKind(str, enum.Enum):
    ENV = "env"
    SECRET = "secret"


@dataclass(frozen=True)
class SecretRef:
    """A reference to a secret: an environment variable's name, or a Databricks ``scope/key``."""

    kind: SecretKind
    name: str

    @property
    def scope(self) -> str:
        return self.name.split("/", 1)[0]

    @property
    def key(self) -> str:
        return self.name.split("/", 1)[1]

    def __str__(self) -> str:
        return f"{{{self.kind.value}: {self.name}}}"


class SecretResolver(Protocol):
    """Reads one key of a Databricks secret scope.

    Raises SecretNotFoundError (no such scope or key) or SecretAccessError (no credentials, no
    permission); the message names scope and key and never the value.
    """

    def secret(self, scope: str, key: str) -> str: ...


class NoSecretScopes:
    """The resolver when none was passed in: every ``{secret: ...}`` reference is refused."""

    def secret(self, scope: str, key: str) -> str:
        raise SecretAccessError(f"secret {scope}/{key}: no Databricks secret resolver is configured here")


def is_reference(value: object) -> bool:
    """Whether ``value`` is written as a reference (``{env: ...}`` or ``{secret: ...}``)."""
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)) in {k.value for k in SecretKind}


def parse_reference(value: object, where: str) -> SecretRef | None:
    """The reference ``value`` is written as; None for a plain value. InvalidInputError, naming
    ``where``, for a malformed reference (an empty name, a secret without ``scope/key``)."""
    if not is_reference(value):
        return None
    assert isinstance(value, Mapping)
    ((kind_text, name),) = value.items()
    kind = SecretKind(kind_text)
    text = str(name).strip() if name is not None else ""
    if kind is SecretKind.SECRET:
        scope, _, key = text.partition("/")
        if not scope.strip() or not key.strip():
            raise InvalidInputError(f"{where}: {{secret: {text}}} must name a scope and a key: {{secret: scope/key}}")
        text = f"{scope.strip()}/{key.strip()}"
    elif not text:
        raise InvalidInputError(f"{where}: {{env: ...}} must name an environment variable")
    return SecretRef(kind, text)


def resolve(ref: SecretRef, where: str, resolver: SecretResolver,
            env: Mapping[str, str] | None = None) -> str:
    """The value ``ref`` points at, read now (never cached). SecretError naming ``where`` and the
    reference when it cannot be read; the cause is kept (``raise ... from``)."""
    if ref.kind is SecretKind.ENV:
        value = (os.environ if env is None else env).get(ref.name)
        if not value:
            raise SecretNotFoundError(f"{where}: needs environment variable {ref.name}, which is not set")
        return value
    try:
        return resolver.secret(ref.scope, ref.key)
    except SecretNotFoundError as exc:
        raise SecretNotFoundError(f"{where}: {ref}: {exc}") from exc
    except SecretError as exc:
        raise SecretAccessError(f"{where}: {ref}: {exc}") from exc


#: a URL in a message: its scheme and host are kept, the rest (path, query, user info) is not
_URL = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)(?:[^\s/@'\"<>]*@)?([^\s/?#'\"<>]*)[^\s'\"<>]*")
REDACTED = "***"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` on one line with every secret replaced and every URL cut to its scheme and host."""
    for secret in sorted((s for s in secrets if s), key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _URL.sub(lambda m: f"{m.group(1)}{m.group(2)}" + ("/" + REDACTED if len(m.group(0)) > len(
        m.group(1) + m.group(2)) else ""), text)
    return " ".join(text.split())
