"""Keeping a ``MailEvent`` under the Kafka record size limit.

Every part of an event is capped on its own (header blocks, bodies, attachment count), but a
hostile mail can combine them: thousands of recipients *and* two full bodies. The budget is
the last line: when the (over-)estimated Avro size of the event exceeds it, the event loses,
in this order, its HTML body, its text body, the tails of its long lists, and the tails of
long header texts. Nothing is lost for good: the complete mail is in ``raw_ref``.

>>> event = {"text_body": "x" * 5000, "html_body": None, "body_truncated": False,
...          "to": [], "cc": [], "reply_to": [], "references": [], "attachments": [],
...          "subject": "s", "guard_headers": {"authentication_results": []}}
>>> fit_event_budget(event, raw_size=5000, budget=1000), event["text_body"], event["body_truncated"]
(True, None, True)
"""

from __future__ import annotations

from typing import Literal, get_args

from connectors.core.mail.event import GuardHeaderName, MailEvent

__all__ = ["approx_size", "fit_event_budget"]

_BODIES: tuple[Literal["html_body", "text_body"], ...] = ("html_body", "text_body")
_SHRINKABLE_LISTS: tuple[Literal["to", "cc", "reply_to", "references", "attachments"], ...] = (
    "to",
    "cc",
    "reply_to",
    "references",
    "attachments",
)
_GUARD_TEXTS: tuple[GuardHeaderName, ...] = get_args(GuardHeaderName)
_SHRUNK_LIST_LENGTH = 100
_SHRUNK_TEXT_CHARS = 4_096


def approx_size(value: object) -> int:
    """An upper bound of the Avro-encoded size: UTF-8 bytes of strings plus room for their
    length prefixes and union indexes, 8 bytes per other scalar."""
    if isinstance(value, str):
        return 4 + (len(value) if value.isascii() else len(value.encode("utf-8", "replace")))
    if isinstance(value, dict):
        return sum(approx_size(item) for item in value.values())
    if isinstance(value, list):
        return 8 + sum(approx_size(item) for item in value)
    return 8


def _shrink(event: MailEvent, budget: int) -> None:
    """Bring a pathological event under budget; the full mail stays in raw_ref."""
    for body in _BODIES:
        if approx_size(event) <= budget:
            return
        if event[body] is not None:
            event[body] = None
            event["body_truncated"] = True
    for name in _SHRINKABLE_LISTS:
        if approx_size(event) <= budget:
            return
        event[name] = event[name][:_SHRUNK_LIST_LENGTH]
    guards = event["guard_headers"]
    guards["authentication_results"] = guards["authentication_results"][:10]
    for header in _GUARD_TEXTS:
        value = guards[header]
        if value is not None:
            guards[header] = value[:_SHRUNK_TEXT_CHARS]
    if event["subject"] is not None:
        event["subject"] = event["subject"][:_SHRUNK_TEXT_CHARS]


def fit_event_budget(event: MailEvent, raw_size: int, budget: int) -> bool:
    """Shrink ``event`` in place to fit ``budget``; True when something had to go."""
    # Decoded text is at most ~3 bytes per raw byte: small mails cannot exceed the budget.
    if 4 * raw_size + 65_536 <= budget or approx_size(event) <= budget:
        return False
    _shrink(event, budget)
    return True
