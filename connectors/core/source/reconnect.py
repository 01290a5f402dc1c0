"""How a source worker backs off after an error, before it reconnects.

DESIGN.md: the connection is disposable, the cursor is an asset; any error -> BACKOFF ->
reconnect, with capped exponential backoff and jitter, and authentication errors loud. Both
source workers (IMAP, EWS) run the same decision, here; each keeps its own state machine and
what it drops (the connection, a cursor to re-read).

The decision, from :func:`~connectors.core.errors.classify`:

- PERMANENT (bad credentials, a configuration the server refuses): wait the backoff cap, count
  ``auth_failures`` for an :class:`~connectors.core.errors.AuthenticationError`, log an error
  that says to fix the configuration;
- anything else: the next jittered delay; an error that is not the connector's own
  "connection lost" is unexpected and logged with its traceback.

``transaction_aborts`` and ``connect_failures`` are counted on the way.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from connectors.core.errors import AuthenticationError, Disposition, classify
from connectors.core.kafka.errors import TransactionAborted
from connectors.core.metrics import SourceMetrics
from connectors.core.source.backoff import Backoff

__all__ = ["backoff_delay"]


def backoff_delay(
    exc: Exception,
    *,
    backoff: Backoff,
    metrics: SourceMetrics,
    labels: Sequence[str],
    connecting: bool,
    connection_lost: type[Exception],
    logger: logging.Logger,
) -> float:
    """Seconds to wait before the next attempt after ``exc``; counts and logs it.

    ``labels`` are the metric labels ``(source kind, account, folder)``; the log lines start
    with them as ``"<kind> <account>/<folder>: ..."``. ``connecting`` says the error came
    while connecting or logging in.
    """
    kind, account, folder = labels
    if isinstance(exc, TransactionAborted):
        metrics.transaction_aborts.labels(*labels).inc()
    if connecting:
        metrics.connect_failures.labels(*labels).inc()
    if classify(exc) is Disposition.PERMANENT:
        delay = backoff.at_cap()
        if isinstance(exc, AuthenticationError):
            metrics.auth_failures.labels(*labels).inc()
        logger.error(
            "%s %s/%s: %s; will retry in %.0fs (fix the configuration or the account)",
            kind,
            account,
            folder,
            exc,
            delay,
        )
        return delay
    delay = backoff.next_delay()
    if not isinstance(exc, connection_lost):
        logger.warning("%s %s/%s: unexpected error", kind, account, folder, exc_info=exc)
    return delay
