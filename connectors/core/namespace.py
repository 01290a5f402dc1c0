"""One deployment's names on a shared Kafka cluster: ``kafka.namespace``.

Several mailtap deployments (production next to staging, a second tenant) can share one
cluster. With ``kafka.namespace: prod`` every name mailtap makes up on the cluster starts with
``prod.``: the topics (``prod.mail.events``), the consumer groups (``prod.mailtap-smtp-sink``),
the streams app id and with it faust's internal topics (``prod.mailtap-streams-...``), and the
transactional ids (``prod.mailtap-imap-<account>-<folder>-<hash>``). Two deployments with the
same account names then never fence each other or read each other's records, and the
operator can grant each one *prefixed* ACLs on ``prod.`` alone.

A name the configuration sets explicitly (``kafka.topics.events: orders.mail``,
``smtp.group_id: ...``, ``imap.group.id: ...``) is used as written: explicit names win.

Example::

    >>> qualify("prod", "mail.events"), qualify(None, "mail.events")
    ('prod.mail.events', 'mail.events')
"""

from __future__ import annotations

import re
from typing import Any

#: What a namespace may be: it becomes part of topic names (letters, digits, ``_``, ``-``;
#: Kafka also allows ``.``, left out so that the prefix ends at the first dot), short enough
#: that the longest derived name stays well inside Kafka's 249 characters.
NAMESPACE_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,39}$")
#: The separator between the namespace and a default name.
SEPARATOR = "."
#: The key under which :meth:`MailtapConfig.section` hands the namespace to a section's model.
CONTEXT_KEY = "kafka_namespace"


def qualify(namespace: str | None, name: str) -> str:
    """``name`` inside ``namespace`` (``prod.name``); ``name`` itself without a namespace."""
    return f"{namespace}{SEPARATOR}{name}" if namespace else name


def prefix(namespace: str | None) -> str:
    """What every derived name starts with: the prefix of the deployment's prefixed ACLs."""
    return f"{namespace}{SEPARATOR}" if namespace else ""


def check(namespace: str) -> str:
    if not NAMESPACE_PATTERN.match(namespace):
        raise ValueError(
            f"kafka.namespace {namespace!r} must be 1-40 letters, digits, '_' or '-', starting "
            "with a letter or a digit (it becomes the first part of every topic name)"
        )
    return namespace


def from_context(context: Any) -> str | None:
    """The namespace a section's validation was given (None outside :meth:`section`)."""
    if isinstance(context, dict):
        value = context.get(CONTEXT_KEY)
        return value if isinstance(value, str) else None
    return None
