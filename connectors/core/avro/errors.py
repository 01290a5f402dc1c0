"""Errors of the Avro package (:mod:`connectors.core.avro`), under the one root.

Neither reaches a caller of the serde: both say "fastavro decides" (writer.py).
"""

from __future__ import annotations

from connectors.core.errors import MailtapError

__all__ = ["UnexpectedValue", "UnsupportedSchema"]


class UnexpectedValue(MailtapError):
    """The value is not one the compiled writer takes; the serde writes it with fastavro."""


class UnsupportedSchema(MailtapError):
    """A schema construct the writer compiler does not take; the serde keeps fastavro."""
