"""The folder where the development SMTP server keeps what it received.

Each message is two files sharing a stem: ``<stem>.eml`` (the DATA exactly as received) and
``<stem>.json`` (the envelope). The sidecar is written last, by rename, so a message is listed
only once it is complete. Stems sort in arrival order::

    000001-1764430000123456789.eml
    000001-1764430000123456789.json   {"mail_from": "a@x", "rcpt_tos": ["b@y"], "received_at": ...}
"""

from __future__ import annotations

import email
import email.policy
import json
import os
import time
from collections.abc import Container
from dataclasses import dataclass
from datetime import UTC, datetime
from email.message import EmailMessage
from pathlib import Path


@dataclass(frozen=True)
class ReceivedMessage:
    """One message accepted by the development SMTP server."""

    path: Path
    mail_from: str
    rcpt_tos: tuple[str, ...]
    received_at: datetime
    raw: bytes

    @property
    def message(self) -> EmailMessage:
        """The message parsed with ``email.policy.default``."""
        return email.message_from_bytes(self.raw, policy=email.policy.default)


def store(folder: Path, sequence: int, mail_from: str, rcpt_tos: list[str], raw: bytes) -> Path:
    """Write one received message (used by the server; tests only read)."""
    folder.mkdir(parents=True, exist_ok=True)
    stem = f"{sequence:06d}-{time.time_ns()}"
    eml = folder / f"{stem}.eml"
    eml.write_bytes(raw)
    envelope = {
        "mail_from": mail_from,
        "rcpt_tos": rcpt_tos,
        "received_at": datetime.now(UTC).isoformat(),
    }
    tmp = folder / f".{stem}.json.tmp"
    tmp.write_text(json.dumps(envelope))
    os.replace(tmp, folder / f"{stem}.json")
    return eml


def received_names(folder: Path) -> set[str]:
    """The ``.eml`` names of the complete messages in ``folder``, without reading them."""
    if not folder.exists():
        return set()
    with os.scandir(folder) as entries:
        return {e.name[:-5] + ".eml" for e in entries if e.name.endswith(".json")}


def received_messages(folder: Path, skip: Container[str] = frozenset()) -> list[ReceivedMessage]:
    """Every complete message in ``folder`` whose ``.eml`` name is not in ``skip``, oldest
    first. A folder used for long holds many thousands: pass what you have read already."""
    if not folder.exists():
        return []
    messages = []
    for name in sorted(received_names(folder)):
        if name in skip:
            continue
        eml = folder / name
        envelope = json.loads(eml.with_suffix(".json").read_text())
        messages.append(
            ReceivedMessage(
                path=eml,
                mail_from=envelope["mail_from"],
                rcpt_tos=tuple(envelope["rcpt_tos"]),
                received_at=datetime.fromisoformat(envelope["received_at"]),
                raw=eml.read_bytes(),
            )
        )
    return messages
