"""Errors of the claim-check stores, under :class:`connectors.core.errors.MailtapError`."""

from __future__ import annotations

from connectors.core.errors import MailtapError


class ClaimCheckError(MailtapError):
    """A blob could not be stored or read. Chained to the OSError when there is one, so
    :func:`connectors.core.errors.classify` reads a full disk as retriable."""
