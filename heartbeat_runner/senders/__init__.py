"""Senders: outbound adapters for alert messages (webhook, PagerDuty, email), beside ``jobs``, the outbound
adapters for triggered runs. May import ``core`` only (a sibling of ``jobs``: neither imports the other)."""
