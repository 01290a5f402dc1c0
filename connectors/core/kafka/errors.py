"""Errors of the Kafka layer, all under :class:`connectors.core.errors.MailtapError`."""

from __future__ import annotations

from connectors.core.errors import MailtapError


class KafkaTimeout(MailtapError, TimeoutError):
    """A Kafka wait did not end by its deadline: a call kept failing with retriable errors, or a
    read did not reach the end of its topic. The message names the topic or the call."""


class TopicReadError(MailtapError, RuntimeError):
    """Reading a topic failed with an error that a retry would not cure."""
