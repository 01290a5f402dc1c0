"""Errors of the Exchange source. The retry/permanent decision is :func:`connectors.core.errors.classify`.

:class:`ConnectionLost` also inherits :class:`ConnectionError`, so ``classify`` reads it as RETRY
without knowing this package; bad credentials raise the core ``AuthenticationError`` and an
untrusted certificate the core ``ConfigError`` (both PERMANENT: back off to the cap).
:class:`SubscriptionGone` is not a failure of the connection: the source subscribes again at once
and catches up with FindItem.
"""

from __future__ import annotations

from connectors.core.errors import AuthenticationError, ConfigError, MailtapError

__all__ = [
    "AuthenticationError",
    "ConfigError",
    "ConnectionLost",
    "EwsError",
    "EwsProtocolError",
    "SubscriptionGone",
]


class EwsError(MailtapError):
    """Root of the Exchange source's own errors."""


class ConnectionLost(EwsError, ConnectionError):
    """The HTTP connection failed, stalled or the server is busy. Reconnect; the cursor is safe."""


class SubscriptionGone(EwsError):
    """The streaming subscription expired, was not found or is invalid: subscribe again."""


class EwsProtocolError(EwsError):
    """Exchange answered an error we did not expect for this request."""
