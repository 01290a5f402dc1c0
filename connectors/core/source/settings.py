"""Settings rules shared by the source sections (``imap``, ``ews``), so both accept and reject
exactly the same values with the same sentences.

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

__all__ = ["START_DESCRIPTION", "check_section", "start_since", "validate_start"]

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
