"""Log output: readable lines on a terminal, JSON lines for a log pipeline.

``mailtap --log-format json ...`` (or ``MAILTAP_LOG_FORMAT=json``, what the container manifests
set) writes one JSON object per line, with the fields a record carries besides its message: a
state transition has ``account``, ``folder`` and ``state``; a transactional writer its
``transactional_id``. The JSON comes from python-json-logger. No secret is ever passed to a log
call (settings keep them as ``SecretStr``), in either format.

    {"level": "INFO", "logger": "connectors.imap.state", "message": "imap acct/INBOX: SYNCING ->
     IDLE", "account": "acct", "folder": "INBOX", "state": "IDLE", "timestamp": "2026-12-01T..."}
"""

from __future__ import annotations

import logging
import sys
import threading
from typing import Literal

from connectors.core.kafka.clients import stop_requested
from connectors.core.kafka.log import RepeatFilter

LogFormat = Literal["text", "json"]
#: Parent of the loggers a long-running component uses for its start and stop lines
#: (``mailtap.lifecycle.<module>``): logged at INFO, shown at the default WARNING level too.
LIFECYCLE_LOGGER = "mailtap.lifecycle"
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"


def formatter(fmt: LogFormat) -> logging.Formatter:
    if fmt == "json":
        # Imported for JSON logs only: 0.04 s of every component's start otherwise (issue 29).
        from pythonjsonlogger.json import JsonFormatter

        return JsonFormatter(
            "{levelname}{name}{message}",
            style="{",
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp=True,
        )
    return logging.Formatter(TEXT_FORMAT)


def configure(level: int, fmt: LogFormat = "text") -> None:
    """The root logger writes to stderr at ``level`` in ``fmt`` (replacing earlier handlers).

    Kafka clients that log through Python logging themselves (aiokafka under the streams worker)
    log a condition once and then its repeat count, like librdkafka's lines
    (:mod:`connectors.core.kafka.log`).
    """
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(formatter(fmt))
    handler.addFilter(RepeatFilter(("aiokafka",)))
    logging.basicConfig(level=level, handlers=[handler], force=True)
    # A component that logs nothing at the default level cannot be told from one that never
    # started: its start and stop lines show unless the level asked for is above WARNING.
    lifecycle = logging.getLogger(LIFECYCLE_LOGGER)
    lifecycle.setLevel(min(level, logging.INFO) if level <= logging.WARNING else level)


def current_format() -> LogFormat:
    """The format :func:`configure` set on the root logger (text when it was not called)."""
    json_logs = sys.modules.get("pythonjsonlogger.json")
    if json_logs is None:
        return "text"  # never imported: no JSON formatter was made
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, json_logs.JsonFormatter):
            return "json"
    return "text"


def log_thread_exception(args: threading.ExceptHookArgs) -> None:
    """``threading.excepthook``: an exception that ends a thread becomes a log record (one JSON
    line in JSON mode) instead of a raw traceback on stderr. While the process stops (a client
    library's thread cancelled mid-retry, Kafka unreachable) it is one WARNING line."""
    if args.exc_type is SystemExit:
        return
    name = args.thread.name if args.thread is not None else "?"
    logger = logging.getLogger("mailtap.threads")
    if stop_requested():
        logger.warning(
            "thread %s ended while stopping: %s %s", name, args.exc_type.__name__, args.exc_value
        )
        return
    logger.error("thread %s failed", name, exc_info=args.exc_value or True)
