"""Errors of the Avro package (:mod:`connectors.core.avro`), under the one root.

The first two never reach a caller of the serde: both say "fastavro decides" (writer.py).
"""

from __future__ import annotations

from connectors.core.errors import ConfigError, MailtapError

__all__ = ["RegistryNotAnswering", "UnexpectedValue", "UnsupportedSchema"]


class UnexpectedValue(MailtapError):
    """The value is not one the compiled writer takes; the serde writes it with fastavro."""


class UnsupportedSchema(MailtapError):
    """A schema construct the writer compiler does not take; the serde keeps fastavro."""


class RegistryNotAnswering(ConfigError):
    """The registry gave no answer, or a 5xx after the retries, while subjects were prepared:
    a ConfigError at start (the sentence says what to check), a transient outage once running
    (`AvroSerde.encode` raises RegistryUnavailable for it, so a mail is not dead-lettered)."""
