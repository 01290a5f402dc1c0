"""Settings shared by the source sections (``imap``, ``ews`` and any later source): the fields
every source has (:class:`SourceSettings`) and the rules they follow, so every source accepts
and rejects exactly the same values with the same sentences.

``start`` says where a folder without a stored cursor starts: ``all`` (everything in the
folder), ``latest`` (only mail that arrives from now on) or ``since:YYYY-MM-DD`` (mail received
on or after that day).

>>> validate_start("since:2026-01-31"), start_since("since:2026-01-31")
('since:2026-01-31', datetime.date(2026, 1, 31))
>>> start_since("latest") is None
True
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any, ClassVar

from pydantic import Field, ValidationInfo, model_validator

from connectors.core import namespace as ns
from connectors.core.config import ParseLimitSettings, StrictModel
from connectors.core.source.ownership.group import GroupSettings

__all__ = ["START_DESCRIPTION", "SourceSettings", "check_section", "start_since", "validate_start"]

START_DESCRIPTION = "where a folder without a cursor starts: all | latest | since:YYYY-MM-DD"
_SINCE = "since:"


def validate_start(value: str) -> str:
    """``value`` unchanged, or ValueError with a sentence saying what to write instead."""
    if value in ("all", "latest"):
        return value
    if value.startswith(_SINCE):
        try:
            dt.date.fromisoformat(value.removeprefix(_SINCE).strip())
        except ValueError:
            raise ValueError("since: needs an ISO date, e.g. since:2026-01-31") from None
        return value
    raise ValueError("expected all, latest or since:YYYY-MM-DD")


def start_since(start: str) -> dt.date | None:
    """The day of a (validated) ``since:`` start, else None."""
    if start.startswith(_SINCE):
        return dt.date.fromisoformat(start.removeprefix(_SINCE).strip())
    return None


def check_section(
    account_names: Sequence[str], backoff_initial: float, backoff_cap: float, accounts_key: str
) -> None:
    """The whole-section rules: at least one account (listed under ``accounts_key``), unique
    account names, a backoff cap not below the first delay. Raises ValueError."""
    if not account_names:
        raise ValueError(f"list at least one account under {accounts_key}")
    if len(set(account_names)) != len(account_names):
        raise ValueError("account names must be unique")
    if backoff_cap < backoff_initial:
        raise ValueError("backoff_cap_seconds must be >= backoff_initial_seconds")


class SourceSettings(StrictModel):
    """The fields of a source section that every source has, with the same defaults and rules.

    A source's section subclasses it with its own ``accounts`` (a tuple of account models, each
    with a ``name``) and names where they are listed in :attr:`ACCOUNTS_KEY`.
    """

    #: Where the accounts are listed, as an error message names it (``imap.accounts``).
    ACCOUNTS_KEY: ClassVar[str] = "accounts"
    #: The source's kind (``imap``, ``ews``): its group id is ``mailtap-<kind>`` when unset.
    SOURCE_KIND: ClassVar[str] = "source"

    backoff_initial_seconds: float = Field(
        default=1.0, gt=0, description="first reconnect delay; doubles (with jitter) per failure"
    )
    backoff_cap_seconds: float = Field(
        default=300.0,
        gt=0,
        description="longest reconnect delay; also the delay after an auth error",
    )
    #: Records above this size cannot be produced (broker message.max.bytes is 1 MB by default).
    max_record_bytes: int = Field(
        default=900_000,
        gt=1024,
        description="largest Kafka record the source writes; bigger events shed bodies first",
    )
    limits: ParseLimitSettings = Field(
        default=ParseLimitSettings(), description="caps applied before parsing"
    )
    group: GroupSettings | None = Field(
        default=None,
        description="share the mailboxes among the instances with the same group id "
        "(connectors.core.source.ownership.group); without it this instance runs every mailbox",
    )

    @model_validator(mode="before")
    @classmethod
    def _default_group_id(cls, data: Any, info: ValidationInfo) -> Any:
        """``group: {}`` joins ``mailtap-<kind>`` inside kafka.namespace: two deployments that
        share a cluster must never divide each other's mailboxes."""
        group = data.get("group") if isinstance(data, dict) else None
        if isinstance(group, dict) and "id" not in group:
            name = ns.qualify(ns.from_context(info.context), f"mailtap-{cls.SOURCE_KIND}")
            return {**data, "group": {**group, "id": name}}
        return data

    @model_validator(mode="after")
    def _section_rules(self) -> Any:
        accounts: Sequence[Any] = getattr(self, "accounts", ())
        check_section(
            [a.name for a in accounts],
            self.backoff_initial_seconds,
            self.backoff_cap_seconds,
            accounts_key=self.ACCOUNTS_KEY,
        )
        return self
