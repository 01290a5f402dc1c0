"""Errors of the source contract (:mod:`connectors.core.source`), under the one root."""

from __future__ import annotations

from connectors.core.errors import MailtapError

__all__ = ["IllegalTransition"]


class IllegalTransition(MailtapError, RuntimeError):
    """A bug: a worker tried a state transition its diagram does not have."""
