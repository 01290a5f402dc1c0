"""Crash points for the kill -9 tests: ``MAILTAP_TEST_CRASH_AT=in_transaction:3`` exits the
source process with code 137 (what a SIGKILL looks like to the outside) the 3rd time it reaches
that point of :mod:`connectors.core.checkpoints`.

A test spawns the source with :func:`crash_env`, which also names this module as the product's
checkpoint observer; without it the product never imports anything from the tests.

>>> CrashPoints("in_transaction:2").point, CrashPoints(None).active
('in_transaction', False)
>>> sorted(crash_env("before_write:2"))
['MAILTAP_CHECKPOINT_OBSERVER', 'MAILTAP_TEST_CRASH_AT']
"""

from __future__ import annotations

import os
import sys
import threading

from connectors.core import checkpoints

ENV = "MAILTAP_TEST_CRASH_AT"
#: What a SIGKILL looks like to a parent process.
EXIT_CODE = 137


def crash_env(spec: str) -> dict[str, str]:
    """The environment that makes a spawned source crash at ``spec`` (``"point:N"``)."""
    return {checkpoints.ENV: __name__, ENV: spec}


def observer() -> checkpoints.Observer:
    """Called by :mod:`connectors.core.checkpoints` when the environment names this module."""
    return CrashPoints.from_env().reached


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
