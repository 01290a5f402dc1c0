"""Test-only crash points, switched on by ``MAILTAP_TEST_CRASH_AT`` (never set in production).

``MAILTAP_TEST_CRASH_AT=in_transaction:3`` makes the process ``os._exit(137)`` (what a SIGKILL
looks like to the outside) the 3rd time it reaches that point. The sources share the points
that every batch passes, in this order:

- ``before_write``   a batch is fetched and parsed, nothing produced yet;
- ``in_transaction`` the batch's records are produced and flushed to the broker, not committed
  (:class:`CrashingWriter`).

A source may name its own further points (the IMAP source: ``after_commit``,
``after_side_effect``).

>>> CrashPoints("in_transaction:2").point, CrashPoints(None).active
('in_transaction', False)
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from connectors.core.kafka.transactions import TransactionalSourceWriter

__all__ = ["ENV", "EXIT_CODE", "CrashPoints", "CrashingWriter"]

ENV = "MAILTAP_TEST_CRASH_AT"
#: What a SIGKILL looks like to a parent process.
EXIT_CODE = 137


class CrashPoints:
    """``"in_transaction:3"`` -> crash the 3rd time that point is reached; ``None`` -> never."""

    def __init__(self, spec: str | None) -> None:
        self._point: str | None = None
        self._at = 0
        if spec:
            name, _, count = spec.partition(":")
            self._point, self._at = name.strip(), int(count or 1)
        self._seen = 0
        self._lock = threading.Lock()

    @classmethod
    def from_env(cls) -> CrashPoints:
        return cls(os.environ.get(ENV))

    @property
    def point(self) -> str | None:
        return self._point

    @property
    def active(self) -> bool:
        return self._point is not None

    def reached(self, point: str) -> None:
        if point != self._point:
            return
        with self._lock:
            self._seen += 1
            if self._seen == self._at:
                sys.stderr.write(f"{ENV}: crashing at {point}:{self._at}\n")
                sys.stderr.flush()
                os._exit(EXIT_CODE)


class CrashingWriter(TransactionalSourceWriter):
    """A writer that can die between produce and commit (records on the broker, uncommitted)."""

    def __init__(self, *args: Any, crash: CrashPoints, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._crash = crash

    def _commit(self) -> None:
        self._producer.flush(30)
        self._crash.reached("in_transaction")
        super()._commit()
