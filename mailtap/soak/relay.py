"""The soak's SMTP relay: an aiosmtpd server in the harness that records every mail it accepts
and can be told to answer 421 or 451 for a while (a relay that is overloaded or greylisting).

Recorded per accepted mail: when, the envelope recipients and the threading headers. The
verifier counts copies per Message-ID (the sink's Message-ID carries the command id) and checks
the threading; the workload reads the forwards to the approver from it.
"""

from __future__ import annotations

import email
import email.policy
import threading
import time
from dataclasses import dataclass
from typing import Literal

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, Envelope, Session

RelayMode = Literal["accept", "421", "451"]


@dataclass(frozen=True)
class RelayedMail:
    at: float
    rcpt_tos: tuple[str, ...]
    message_id: str
    in_reply_to: str
    references: tuple[str, ...]
    subject: str
    body: str


def _ids(value: str) -> tuple[str, ...]:
    return tuple(part.strip("<>") for part in value.split() if part.strip("<>"))


class _Handler:
    def __init__(self, relay: SoakRelay) -> None:
        self.relay = relay

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list[str]
    ) -> str:
        if self.relay.mode == "421":
            self.relay.refused += 1
            return "421 4.3.2 soak: service not available, closing channel"
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        if self.relay.mode == "451":
            self.relay.refused += 1
            return "451 4.3.0 soak: try again later"
        raw = envelope.original_content or b""
        if not raw and isinstance(envelope.content, bytes):
            raw = envelope.content
        parsed = email.message_from_bytes(raw, policy=email.policy.compat32)
        body = parsed.get_payload(decode=True) if not parsed.is_multipart() else b""
        mail = RelayedMail(
            at=time.time(),
            rcpt_tos=tuple(str(r).lower() for r in envelope.rcpt_tos),
            message_id=str(parsed["Message-ID"] or "").strip().strip("<>"),
            in_reply_to=str(parsed["In-Reply-To"] or "").strip().strip("<>"),
            references=_ids(str(parsed["References"] or "")),
            subject=str(parsed["Subject"] or ""),
            body=(body or b"").decode("utf-8", "replace") if isinstance(body, bytes) else "",
        )
        with self.relay.lock:
            self.relay.mails.append(mail)
        return "250 2.0.0 OK: queued"


class SoakRelay:
    def __init__(self, host: str, port: int) -> None:
        self.mode: RelayMode = "accept"
        self.refused = 0
        self.lock = threading.Lock()
        self.mails: list[RelayedMail] = []
        self._controller = Controller(_Handler(self), hostname=host, port=port)

    def start(self) -> SoakRelay:
        self._controller.start()
        return self

    @property
    def host(self) -> str:
        return str(self._controller.hostname)

    @property
    def port(self) -> int:
        return int(self._controller.port)

    def stop(self) -> None:
        self._controller.stop()

    def snapshot(self, since: int = 0) -> list[RelayedMail]:
        with self.lock:
            return self.mails[since:]
