"""librdkafka's log lines and client errors through Python logging, once per distinct condition.

Left alone, librdkafka prints every line to stderr itself (``%3|...|FAIL|rdkafka#producer-1| ...
Connection refused``): one per reconnect attempt, ~20 a second per client while a broker is
unreachable, and outside ``--log-format json``. Every client mailtap builds gets a
:class:`ClientLog` as its ``logger`` and :meth:`ClientLog.client_error` as its ``error_cb``
(:func:`connectors.core.kafka.clients.client_config`), so that:

- each line goes to the ``librdkafka`` logger, with ``facility`` and ``client`` fields;
- a condition librdkafka retries by itself (a refused connection, a broker that went away, a
  coordinator still loading) is a WARNING or INFO, not an ERROR: the component says ERROR itself
  when it gives up;
- the same condition is logged once, then again at most every ``repeat_interval`` seconds with the
  number of times it happened in between (``repeated``), from whichever client reports it.

confluent-kafka hands these lines over only while the client is polled (``log.queue``): consumers
in ``poll``/``consume``, producers in ``poll``/``flush``/``commit_transaction``; the waits in
:mod:`connectors.core.kafka.clients` poll admin clients and producers between their short slices.

    >>> import logging
    >>> logger = logging.getLogger("doctest.kafka")
    >>> logger.setLevel(logging.INFO)
    >>> log = ClientLog(logger, clock=iter(range(0, 1000, 10)).__next__)
    >>> for _ in range(3):
    ...     log.log(20, "%s [%s] %s", "FAIL", "rdkafka#producer-1",
    ...             "[thrd:b:9/bootstrap]: b:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: "
    ...             "Connection refused (after 0ms in state CONNECT)")
    >>> log.pending()
    {('FAIL', 'b:9/bootstrap: Connect to ipv4#127.0.0.1:9 failed: Connection refused (after Nms in state CONNECT)'): 2}
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import KafkaError

#: One line per condition per minute at most: a 30 s outage is one line per condition, a long
#: one a line a minute with the count, so the log still says the condition lasts.
REPEAT_INTERVAL_S = 60.0

#: Client errors kept for :meth:`ClientLog.errors_since`: a few seconds' worth while a cluster
#: refuses every client of a process.
RECENT_ERRORS = 64

#: Conditions librdkafka retries by itself. Connection trouble is worth a WARNING (the operator
#: may have to act); a coordinator that is loading or moving settles in seconds (INFO).
_CONNECTION = re.compile(
    r"Connection refused|Connect to .* failed|Disconnected|transport failure|timed out|"
    r"brokers are down|Failed to resolve|Connection reset|No route to host|Network is unreachable|"
    r"KafkaConnectionError|NodeNotReady|CoordinatorNotAvailable|Connect call failed",
    re.IGNORECASE,
)
_SETTLING = re.compile(
    r"load in progress|not coordinator|coordinator not available|leader not available",
    re.IGNORECASE,
)
#: Parts of a line that change between repeats of one condition.
_VARYING = (
    (re.compile(r"^\[thrd:[^\]]*\]:\s*"), ""),
    (re.compile(r"\s*\(\d+ identical error\(s\) suppressed\)"), ""),
    (re.compile(r",\s*\d+ identical error\(s\) suppressed"), ""),
    (re.compile(r"\d+ms"), "Nms"),
    (re.compile(r"\d+/\d+ brokers"), "N/N brokers"),
)


def condition_of(text: str) -> str:
    """The line without what varies between repeats (thread name, durations, suppressed counts).

    >>> condition_of("[thrd:main]: b:9/1: Disconnected (after 5012ms in state UP, 3 identical "
    ...              "error(s) suppressed)")
    'b:9/1: Disconnected (after Nms in state UP)'
    >>> condition_of("[thrd:x]: b:9/1: Connect failed (after 3ms in state CONNECT) "
    ...              "(7 identical error(s) suppressed)")
    'b:9/1: Connect failed (after Nms in state CONNECT)'
    """
    for pattern, replacement in _VARYING:
        text = pattern.sub(replacement, text)
    return text.strip()


def level_of(level: int, text: str) -> int:
    """librdkafka's level (already mapped to Python's by confluent-kafka), lowered for conditions
    the client retries by itself."""
    if _SETTLING.search(text):
        return min(level, logging.INFO)
    if _CONNECTION.search(text):
        return min(level, logging.WARNING)
    return level


@dataclass
class _Seen:
    last_logged: float
    repeats: int = 0


class _Repeats:
    """Which occurrences of a condition to log: the first, then one per interval with a count."""

    def __init__(self, interval: float, clock: Callable[[], float]) -> None:
        self.interval = interval
        self._clock = clock
        self._seen: dict[tuple[str, str], _Seen] = {}
        self._lock = threading.Lock()

    def admit(self, key: tuple[str, str]) -> int | None:
        """None: suppress this occurrence; else log it, saying it repeated that many times."""
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is None:
                self._seen[key] = _Seen(last_logged=now)
                return 0
            if now - seen.last_logged < self.interval:
                seen.repeats += 1
                return None
            repeats, seen.repeats, seen.last_logged = seen.repeats, 0, now
            return repeats

    def pending(self) -> dict[tuple[str, str], int]:
        with self._lock:
            return {key: s.repeats for key, s in self._seen.items() if s.repeats}

    def take_pending(self) -> dict[tuple[str, str], int]:
        with self._lock:
            out = {key: s.repeats for key, s in self._seen.items() if s.repeats}
            for seen in self._seen.values():
                seen.repeats = 0
            return out


class ClientLog:
    """The ``logger`` of every confluent-kafka client (it calls :meth:`log`), shared by all."""

    def __init__(
        self,
        logger: logging.Logger | None = None,
        *,
        repeat_interval: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.logger = logger or logging.getLogger("librdkafka")
        self.repeat_interval = repeat_interval
        self._repeats = _Repeats(repeat_interval, clock)
        self._clock = clock
        # The latest client errors with when they came: a wait for the cluster ends early on an
        # authentication or TLS failure among them (connectors.core.kafka.cluster_metadata).
        self._recent: deque[tuple[float, KafkaError]] = deque(maxlen=RECENT_ERRORS)

    def log(self, level: int, fmt: str, *args: object) -> None:
        """What confluent-kafka calls: ``log(level, "%s [%s] %s", facility, client, text)``."""
        if len(args) == 3:
            facility, client, text = (str(a) for a in args)
        else:  # a format we do not know: keep the line whole
            facility, client, text = "LOG", "", fmt % args if args else fmt
        self.report(level_of(level, text), facility, client, text)

    def client_error(self, error: KafkaError) -> None:
        """The ``error_cb``: errors librdkafka reports besides its log lines (all retried by the
        client; fatal ones raise from the call that hit them instead).

        A transport error repeats the FAIL line logged for the same attempt: DEBUG.
        """
        self._recent.append((self._clock(), error))
        text = f"{error.name()}: {error.str()}"
        if error.code() == KafkaError._TRANSPORT:
            level = logging.DEBUG
        else:
            level = level_of(logging.ERROR, error.str())
        self.report(level, "ERROR", "", text)

    def report(self, level: int, facility: str, client: str, text: str) -> None:
        if not self.logger.isEnabledFor(level):
            return
        key = (facility, condition_of(text))
        repeats = self._repeats.admit(key)
        if repeats is None:
            return
        shown = _VARYING[0][0].sub("", text).strip()  # without librdkafka's thread name
        self._emit(level, facility, client, shown, repeats)

    def _emit(self, level: int, facility: str, client: str, text: str, repeats: int) -> None:
        suffix = f" (and {repeats} more times in the last {self.repeat_interval:.0f}s)"
        self.logger.log(
            level,
            "kafka %s%s: %s%s",
            facility,
            f" [{client}]" if client else "",
            text,
            suffix if repeats else "",
            extra={"facility": facility, "client": client, "repeated": repeats},
        )

    def errors_since(self, since: float) -> list[KafkaError]:
        """Client errors reported at or after ``since`` (this log's clock), oldest first."""
        return [error for at, error in list(self._recent) if at >= since]

    def pending(self) -> dict[tuple[str, str], int]:
        """Repeats seen since each condition was last logged (not yet reported)."""
        return self._repeats.pending()

    def flush(self) -> None:
        """Log the repeat counts not yet reported (at the end of a run)."""
        for (facility, text), repeats in self._repeats.take_pending().items():
            self.logger.info(
                "kafka %s: %s (repeated %d more times before the end)",
                facility,
                text,
                repeats,
                extra={"facility": facility, "client": "", "repeated": repeats},
            )


class RepeatFilter(logging.Filter):
    """The same treatment for Kafka clients that log through Python logging themselves
    (aiokafka, under the streams worker: ~50 ERROR lines a second while a broker is down).

    Installed on a handler, it applies to records of loggers under ``prefixes``: the first
    occurrence of a message passes (at :func:`level_of`'s level), repeats within
    ``repeat_interval`` are dropped, the next one after it carries the count (``repeated``).
    """

    def __init__(
        self,
        prefixes: tuple[str, ...] = ("aiokafka",),
        *,
        repeat_interval: float = REPEAT_INTERVAL_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__()
        self.prefixes = prefixes
        self.repeat_interval = repeat_interval
        self._repeats = _Repeats(repeat_interval, clock)

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith(self.prefixes):
            return True
        message = record.getMessage()
        repeats = self._repeats.admit((record.name, condition_of(message)))
        if repeats is None:
            return False
        level = level_of(record.levelno, message)
        if level != record.levelno:
            record.levelno, record.levelname = level, logging.getLevelName(level)
        if repeats:
            record.msg = f"{message} (and {repeats} more times in the last "
            record.msg += f"{self.repeat_interval:.0f}s)"
            record.args = None
        record.repeated = repeats
        return True
