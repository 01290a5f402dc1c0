"""Errors of the Kafka layer, all under :class:`connectors.core.errors.MailtapError`."""

from __future__ import annotations

from connectors.core.errors import ConfigError, MailtapError, StopRequested

__all__ = ["StopRequested"]  # defined with the stop request below this layer (core.stopping)


class KafkaUnavailable(ConfigError):
    """The cluster did not answer within the wait; the message names the setting to check."""


class KafkaTimeout(MailtapError, TimeoutError):
    """A Kafka wait did not end by its deadline: a call kept failing with retriable errors, or a
    read did not reach the end of its topic. The message names the topic or the call."""


class TopicReadError(MailtapError, RuntimeError):
    """Reading a topic failed with an error that a retry would not cure."""


class FencedError(MailtapError):
    """Another instance took over this source partition; this one must stop, not retry."""


class TransactionAborted(MailtapError):
    """The batch was aborted; nothing of it is visible. Re-read from the last committed cursor."""


class KafkaSecurityRefused(ConfigError):
    """The cluster answered, but the login or the TLS handshake failed: waiting longer or
    retrying will not help; the message says which setting to change."""


class PermissionDenied(ConfigError):
    """The broker does not let this principal perform an operation on a resource it needs
    (:func:`connectors.core.kafka.permissions.permission_denied` says which, and how to grant it)."""

    def __init__(self, message: str, *, principal: str, acl: object, error: str) -> None:
        super().__init__(message)
        self.principal = principal
        #: The missing :class:`connectors.core.kafka.acls.Acl`.
        self.acl = acl
        self.error = error
