"""The sink's way out: a relay over SMTP (:mod:`connectors.smtp.transport`) or Microsoft Graph's
``sendMail`` (:mod:`connectors.smtp.graphtransport`), chosen by ``smtp.transport``.

The sink loop (rounds, intents, outcomes, retries) is written once; a transport only turns a
rendered message into outcomes per recipient, never raising for the message's fate:

1. :meth:`MailTransport.start` once, before the sink reads a command (a misconfiguration it can
   see stops the start with a sentence);
2. :meth:`MailTransport.deliver` per message, concurrently up to ``smtp.pool_size``: it may
   prepare everything at once but must not let the server accept the message before ``ready``
   is set (the command's INTENT is committed then);
3. :meth:`MailTransport.reset_breaker` once per batch; :meth:`MailTransport.close` at the end.
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from connectors.core.errors import ConfigError
from connectors.smtp.classify import RecipientOutcome
from connectors.smtp.config import SmtpSinkSettings
from connectors.smtp.render import RenderedMessage

__all__ = ["MailTransport", "open_transport"]


class MailTransport(Protocol):
    description: str
    """Where mail goes, for the log: ``host:port`` or ``graph:<user>``."""
    opened: int
    """Connections (SMTP sessions, Graph HTTP clients) opened so far: a metric."""

    def start(self) -> None: ...

    def reset_breaker(self) -> None: ...

    async def deliver(
        self, message: RenderedMessage, ready: asyncio.Event | None = None
    ) -> list[RecipientOutcome]: ...

    async def close(self) -> None: ...


def open_transport(settings: SmtpSinkSettings) -> MailTransport:
    """The transport ``settings.transport`` names (Graph's needs the ``graph`` extra)."""
    if settings.transport == "graph":
        try:
            from connectors.smtp.graphtransport import GraphTransport
        except ModuleNotFoundError as exc:
            raise ConfigError(
                f"smtp.transport graph needs {exc.name!r}: install mailtap with the graph "
                f"extra (pip install 'mailtap[smtp,graph]')"
            ) from None
        return GraphTransport(settings)
    from connectors.smtp.transport import SmtpConnectionPool

    return SmtpConnectionPool(settings)
