"""Errors of the operator actions (``mailtap dlq``, ``mailboxes``, ``suppressions``) that the
CLI and the web console share: each front end says them its own way (a ClickException, an HTTP
status), under :class:`connectors.core.errors.MailtapError`."""

from __future__ import annotations

from connectors.core.errors import MailtapError


class ActionError(MailtapError):
    """An operator action could not be done; the message says why, nothing was changed."""


class UnknownTarget(ActionError, LookupError):
    """The record, mailbox or address the action names does not exist."""


class InvalidInput(ActionError, ValueError):
    """The action's input is malformed (an address that is not one, an unknown reason)."""


class NotApplicable(ActionError):
    """The target exists but the action does not apply to it now (a source dead letter cannot
    be replayed; a command already SENT is not sent again; a running mailbox cannot be
    rewound)."""


class NotAcknowledged(ActionError, ConnectionError):
    """Kafka did not acknowledge the write in time; running the action again is safe."""
