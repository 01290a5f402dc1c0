"""Errors of the stream processors, under :class:`connectors.core.errors.MailtapError`."""

from __future__ import annotations

from connectors.core.errors import MailtapError


class HeaderInjectionError(MailtapError, ValueError):
    """A value meant for a mail header contains CR or LF."""


class DnsTempError(MailtapError):
    """The answer could not be had now (timeout, SERVFAIL, no server reachable)."""


class OutputLost(MailtapError):
    """A command, workflow event or re-keyed record was not acknowledged by Kafka: the worker
    stops without committing past it (:mod:`streams.acks`)."""
