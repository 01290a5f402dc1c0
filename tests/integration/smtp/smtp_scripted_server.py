"""An aiosmtpd relay with scripted answers, driven by the recipient's local part.

=================  ==========================================================================
local part         answer
=================  ==========================================================================
``rcptNNN``        reply NNN to RCPT TO for this recipient (e.g. ``rcpt550``, ``rcpt421``)
``dataNNN``        reply NNN to the final "." (e.g. ``data451``, ``data554``)
``flakyN``         451 to the final "." for the first N deliveries of that Message-ID, then 250
``stall``          wait ``stall_seconds`` after the final "." before answering 250 (once per
                   Message-ID; a resend is answered at once)
``drop``           close the connection when this recipient is given (mid-session)
anything else      250
=================  ==========================================================================

Accepted messages are kept in :attr:`ScriptedHandler.accepted` (thread-safe snapshot via
:meth:`ScriptedHandler.snapshot`); every DATA that reached the server is in ``deliveries``.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections import Counter
from dataclasses import dataclass
from email import message_from_bytes
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

from mailtap.dev.process import free_port

_RCPT = re.compile(r"^rcpt(\d{3})$")
_DATA = re.compile(r"^data(\d{3})$")
_FLAKY = re.compile(r"^flaky(\d+)$")


@dataclass(frozen=True)
class Accepted:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message_id: str
    data: bytes
    mail_options: tuple[str, ...] = ()
    """MAIL FROM parameters, e.g. ("SMTPUTF8", "BODY=8BITMIME")."""


class ScriptedHandler:
    def __init__(self, stall_seconds: float = 5.0) -> None:
        self.stall_seconds = stall_seconds
        self.accepted: list[Accepted] = []
        self.deliveries: Counter[str] = Counter()
        self._lock = threading.Lock()

    def snapshot(self) -> list[Accepted]:
        with self._lock:
            return list(self.accepted)

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        local = address.partition("@")[0].lower()
        if local == "drop":
            assert server.transport is not None
            server.transport.close()
            return "421 4.4.2 closing"
        match = _RCPT.match(local)
        if match:
            return f"{match.group(1)} {match.group(1)[0]}.1.1 scripted refusal of <{address}>"
        envelope.rcpt_tos.append(address)
        return "250 2.1.5 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        data = envelope.original_content or b""
        message_id = str(message_from_bytes(data).get("Message-ID", "")).strip()
        with self._lock:
            self.deliveries[message_id] += 1
            seen = self.deliveries[message_id]
        locals_ = [r.partition("@")[0].lower() for r in envelope.rcpt_tos]
        for local in locals_:
            match = _DATA.match(local)
            if match:
                code = match.group(1)
                return f"{code} {code[0]}.{'3.4' if code == '552' else '7.1' if code == '554' else '3.0'} scripted"
            flaky = _FLAKY.match(local)
            if flaky and seen <= int(flaky.group(1)):
                return "451 4.3.0 scripted temporary failure"
            if local == "stall" and seen == 1:
                await asyncio.sleep(self.stall_seconds)
        with self._lock:
            self.accepted.append(
                Accepted(
                    str(envelope.mail_from),
                    tuple(str(r) for r in envelope.rcpt_tos),
                    message_id,
                    data,
                    tuple(envelope.mail_options),
                )
            )
        return "250 2.0.0 Ok: queued"


class ScriptedRelay:
    """Controller wrapper: a new Controller per start (aiosmtpd cannot restart one, PITFALLS)."""

    def __init__(self, stall_seconds: float = 5.0, *, smtputf8: bool = False) -> None:
        """``smtputf8``: advertise SMTPUTF8 (RFC 6531) and accept non-ASCII addresses."""
        self.handler = ScriptedHandler(stall_seconds)
        self.port = free_port()
        self._controller = Controller(
            self.handler,
            hostname="127.0.0.1",
            port=self.port,
            decode_data=False,
            server_hostname="scripted-relay",
            enable_SMTPUTF8=smtputf8,
        )

    def __enter__(self) -> ScriptedRelay:
        self._controller.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._controller.stop()
