"""Alert destinations as the senders see them: where a message goes and which of its settings are secrets.

The run-policy file's ``alerts.destinations`` section (``policies/alerts.py``) is parsed into these records; the
senders (``senders/send.py``) deliver to them. Secrets are references (:class:`SecretRef`), never values: a
record can be logged or printed whole.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from heartbeat_runner.core.secrets import SecretRef


class DestinationKind(str, enum.Enum):
    WEBHOOK = "webhook"
    PAGERDUTY = "pagerduty"
    EMAIL = "email"


PAGERDUTY_URL = "https://events.pagerduty.com/v2/enqueue"

@dataclass(frozen=True)
class Destination:
    """Where alerts go. Secrets (URLs of webhooks, routing keys, SMTP user and password) are references
    (:class:`SecretRef`: an environment variable or a Databricks ``scope/key``), read at send time only."""

    name: str
    kind: DestinationKind
    url_secret: SecretRef | None = None          # webhook: the URL (a secret)
    url: str = PAGERDUTY_URL                     # pagerduty: the Events API endpoint
    routing_key_secret: SecretRef | None = None
    host: str = ""                               # email
    port: int = 587
    sender: str = ""
    to: tuple[str, ...] = ()
    username_secret: SecretRef | None = None
    password_secret: SecretRef | None = None
    starttls: bool = True
    ca_file: str | None = None



#: a PagerDuty Events API v2 routing (integration) key: 32 letters and digits
_ROUTING_KEY = re.compile(r"^[A-Za-z0-9]{32}$")
#: the secret settings of a destination, each held as ``<setting>_secret``
SECRET_SETTINGS = ("url", "routing_key", "username", "password")


def is_web_url(value: object) -> bool:
    """An ``http``/``https`` URL with a host and no whitespace (what a webhook or the Events API needs)."""
    if not isinstance(value, str) or not value or any(c.isspace() for c in value):
        return False
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - a port that is no number raises here, as urllib would at delivery
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def secret_shape_problem(setting: str, value: str) -> str | None:
    """What is wrong with the shape of a secret's value for ``setting`` (None: nothing that can be seen without
    sending): a webhook URL must be http(s) with a host, a routing key 32 letters and digits. Never quotes it."""
    if setting == "url" and not is_web_url(value):
        return "does not hold an http or https URL with a host"
    if setting == "routing_key" and not _ROUTING_KEY.match(value):
        return "does not hold a PagerDuty routing key of 32 letters and digits"
    return None
