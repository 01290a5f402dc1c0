"""One exception root for mailtap, and the single place that decides retry vs permanent vs data.

Modelled on Debezium's ``ErrorHandler``: the decision is made from the cause chain, so a
``socket.timeout`` wrapped three levels deep still reads as retriable.
"""

from __future__ import annotations

import enum
import socket
import ssl


class MailtapError(Exception):
    """Root of every error mailtap raises on purpose."""


class ConfigError(MailtapError, ValueError):
    """The configuration is invalid; the message says which key and what to change."""


class AuthenticationError(MailtapError):
    """The server refused our credentials. Retrying at full speed would only lock the account."""


class TokenRequestRefused(AuthenticationError):
    """The OAuth2 token endpoint refused the client (``invalid_client``, ``invalid_scope``, any
    4xx). ``error`` is the endpoint's RFC 6749 5.2 error code, so a caller can word its own
    sentence naming its own settings."""

    def __init__(self, message: str, token_url: str, client_id: str, error: str) -> None:
        super().__init__(message)
        self.token_url = token_url
        self.client_id = client_id
        self.error = error


class StopRequested(MailtapError):
    """The process was asked to stop while it waited at start (for Kafka, for the schema
    registry); nothing was left half-done (:mod:`connectors.core.stopping`)."""


class DataError(MailtapError):
    """One input item is bad; skip it (with a record of why) and move on."""


class TokenEndpointUnavailable(MailtapError, ConnectionError):
    """The OAuth2 token endpoint could not be reached or failed (5xx): transient."""


class RegistryUnavailable(MailtapError, ConnectionError):
    """The schema registry could not be reached (or failed, 5xx) while decoding a record:
    transient. The record is not bad: decode it again later, never skip it as undecodable."""


class Disposition(enum.Enum):
    """What to do about a failure."""

    RETRY = "retry"
    """Transient: back off and reconnect; the cursor has not moved."""
    PERMANENT = "permanent"
    """Will not heal by retrying (bad credentials, bad config): report loudly, back off to the cap."""
    DATA = "data"
    """One record is bad: record it (DLQ or parse_error) and move the cursor on."""


def _chain(exc: BaseException) -> list[BaseException]:
    seen: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in seen:
        seen.append(current)
        current = current.__cause__ or current.__context__
    return seen


def classify(exc: BaseException) -> Disposition:
    """Decide from the whole cause chain; the most specific known cause wins.

    Certificate failures are permanent: a retry cannot make a bad certificate good, and silently
    downgrading is forbidden by the security rules.
    """
    for cause in _chain(exc):
        if isinstance(cause, (ConfigError, AuthenticationError, ssl.SSLCertVerificationError)):
            return Disposition.PERMANENT
        if isinstance(cause, DataError):
            return Disposition.DATA
    for cause in _chain(exc):
        if isinstance(cause, (OSError, socket.timeout, TimeoutError, EOFError, ConnectionError)):
            return Disposition.RETRY
    return Disposition.RETRY
