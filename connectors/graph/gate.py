"""The request budget of one mailbox, shared by all its folder workers.

Graph allows an application 4 concurrent requests per mailbox and answers more with ``429``;
a ``429``, ``503`` or ``504`` carries ``Retry-After`` (seconds), and until then every request
to that mailbox is refused again (learn.microsoft.com/graph/throttling). So the wait is the
mailbox's, not the request's: one throttled answer holds back every worker of the mailbox, and
no other mailbox.

    >>> gate = MailboxGate(4)
    >>> with gate.slot():
    ...     pass  # one request
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

__all__ = ["MailboxGate"]


class MailboxGate:
    """At most ``limit`` requests in flight, none before the newest ``Retry-After`` ran out."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._slots = threading.BoundedSemaphore(limit)
        self._lock = threading.Lock()
        self._open_at = 0.0  # time.monotonic() before which no request may start
        #: How often this mailbox was told to wait (429/503/504), for metrics and tests.
        self.throttled = 0

    @contextlib.contextmanager
    def slot(self, stop: threading.Event | None = None) -> Iterator[None]:
        """Hold one of the mailbox's request slots, after any ``Retry-After`` pause."""
        self._slots.acquire()
        try:
            self._wait_open(stop)
            yield
        finally:
            self._slots.release()

    def hold_off(self, seconds: float) -> None:
        """The service said ``Retry-After: seconds`` for this mailbox."""
        with self._lock:
            self.throttled += 1
            self._open_at = max(self._open_at, time.monotonic() + max(seconds, 0.0))

    def _wait_open(self, stop: threading.Event | None) -> None:
        while True:
            with self._lock:
                delay = self._open_at - time.monotonic()
            if delay <= 0:
                return
            if stop is not None:
                if stop.wait(delay):
                    return  # stopping: the request fails fast instead
            else:
                time.sleep(delay)
