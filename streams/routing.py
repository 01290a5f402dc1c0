"""Routing: the first rule whose conditions all hold names the workflow for a mail.

Rules come from ``streams.rules`` in the YAML (see :mod:`streams.config`). A mail that no rule
matches is not dropped silently: the pipeline records it as an ``UNROUTED`` WorkflowEvent.

>>> from streams.config import RoutingRule
>>> rules = [RoutingRule.model_validate({"match": {"recipient": "*@support.example.com"},
...                                      "workflow": "ticket_intake"})]
>>> from streams.mail import MailView
>>> import datetime as dt
>>> mail = MailView.from_record({"key": "k", "account": "a", "source": {"folder": "INBOX"},
...     "to": [{"address": "Help@Support.example.com"}], "guard_headers": {},
...     "observed_at": dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)})
>>> route(mail, rules).workflow
'ticket_intake'
"""

from __future__ import annotations

from collections.abc import Sequence
from fnmatch import fnmatchcase

from streams.config import RoutingRule, RuleMatch
from streams.mail import MailView


def _address_matches(pattern: str, address: str) -> bool:
    return fnmatchcase(address.strip().lower(), pattern.strip().lower())


def rule_matches(match: RuleMatch, mail: MailView) -> bool:
    """True when every condition given in ``match`` holds for ``mail``."""
    if match.account is not None and mail.account != match.account:
        return False
    if match.folder is not None and mail.folder != match.folder:
        return False
    if match.recipient is not None and not any(
        _address_matches(match.recipient, a.address) for a in mail.recipients
    ):
        return False
    if match.sender is not None and (
        mail.sender is None or not _address_matches(match.sender, mail.sender.address)
    ):
        return False
    if match.subject is not None and not match.subject.search(mail.subject or ""):
        return False
    return match.has_attachment is None or match.has_attachment == bool(mail.attachments)


def route(mail: MailView, rules: Sequence[RoutingRule]) -> RoutingRule | None:
    """The first matching rule, or None when the mail is unrouted."""
    for rule in rules:
        if rule_matches(rule.match, mail):
            return rule
    return None
