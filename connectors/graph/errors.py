"""Errors of the Microsoft Graph source. The retry/permanent decision is
:func:`connectors.core.errors.classify`.

:class:`ConnectionLost` also inherits :class:`ConnectionError`, so ``classify`` reads it as RETRY
without knowing this package. :class:`AccessDenied` (consent revoked, a token refused, a mailbox
the application may not read) is an :class:`~connectors.core.errors.AuthenticationError` and
:class:`MailboxNotFound` a :class:`~connectors.core.errors.ConfigError`: both PERMANENT (the
worker waits the backoff cap and shows the state in ``mailtap status`` and ``/healthz``).
:class:`SyncStateGone` is not a failure: the folder is resynchronised at once.
"""

from __future__ import annotations

from connectors.core.errors import AuthenticationError, ConfigError, MailtapError

__all__ = [
    "AccessDenied",
    "ConnectionLost",
    "GraphError",
    "GraphProtocolError",
    "MailboxNotFound",
    "SyncStateGone",
]


class GraphError(MailtapError):
    """Root of the Graph source's own errors."""


class ConnectionLost(GraphError, ConnectionError):
    """The HTTP request failed, timed out, or the service stayed busy (429/503/504) past the
    retries. Try again later; the cursor is safe."""


class SyncStateGone(GraphError):
    """The delta token is dead (``410 Gone``, ``syncStateNotFound``, ``resyncRequired``):
    resynchronise the folder from a fresh delta round."""


class AccessDenied(GraphError, AuthenticationError):
    """Graph or the token endpoint refused the application for this mailbox (401/403,
    ``invalid_client``, revoked consent, a refresh token that no longer works)."""


class MailboxNotFound(GraphError, ConfigError):
    """The user, the mailbox or the folder does not exist (404 on the user or folder):
    deleted, or misnamed in the configuration."""


class GraphProtocolError(GraphError):
    """Graph answered something this source does not understand."""
