"""Errors of the IMAP source. The retry/permanent decision is :func:`connectors.core.errors.classify`.

:class:`ConnectionLost` also inherits :class:`ConnectionError`, so ``classify`` reads it as RETRY
without knowing this package; authentication failures raise the core ``AuthenticationError``
(PERMANENT: back off to the cap, never spin on a bad password).
"""

from __future__ import annotations

from connectors.core.errors import AuthenticationError, ConfigError, MailtapError

__all__ = [
    "AuthenticationError",
    "ConfigError",
    "ConnectionLost",
    "FolderMissing",
    "ImapError",
    "ImapProtocolError",
    "ParsePoolClosed",
    "UidValidityChanged",
]


class ImapError(MailtapError):
    """Root of the IMAP source's own errors."""


class ConnectionLost(ImapError, ConnectionError):
    """The connection is dead or silent (timeout, EOF, BYE, reset). Reconnect; the cursor is safe."""


class ImapProtocolError(ImapError):
    """The server answered NO or BAD to a command we expected to succeed."""


class FolderMissing(ImapProtocolError):
    """A watched folder does not exist on the server (deleted or renamed under the source, or
    never created): its worker waits for it; the account's other folders go on."""


class ParsePoolClosed(ImapError, RuntimeError):
    """The parse pool was closed: no process starts again (a warm-up that outlived a refused
    start asks too late)."""


class UidValidityChanged(ConnectionLost):
    """UIDVALIDITY changed under a selected folder: reconnect, the SELECT starts a new epoch."""
