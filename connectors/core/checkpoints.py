"""Named points of a batch's life, where a test harness may act (the kill -9 tests).

Every source passes these points for every batch, in this order:

- ``before_write``   the batch is fetched and parsed, nothing produced yet;
- ``in_transaction`` its records are produced and flushed to the broker, not committed
  (:class:`~connectors.core.kafka.transactions.TransactionalSourceWriter`);
- the IMAP source's own ``after_commit`` (committed, mailbox side effect not done) and
  ``after_side_effect`` (side effect done, not yet recorded).

The SMTP sink passes ``after_intent`` (a round's intents committed, their sends not done) and
``after_send`` (every send in flight has its reply, the outcomes not recorded yet).

In production nobody watches and :func:`reached` returns at once. A test names, in
``MAILTAP_CHECKPOINT_OBSERVER``, a module to import (``tests.support.crashpoints``) whose
``observer()`` returns a callable; that callable is then called with the name of each point
reached, from the thread that reached it (the crash-point observer exits the process there).
The product ships no observer: the module lives with the tests.

>>> reached("before_write") is None, watched()
(True, False)
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable

from connectors.core.errors import ConfigError

__all__ = ["ENV", "reached", "watched"]

ENV = "MAILTAP_CHECKPOINT_OBSERVER"

Observer = Callable[[str], None]

_lock = threading.Lock()
_loaded = False
_observer: Observer | None = None


def _load() -> Observer | None:
    global _loaded, _observer
    with _lock:
        if not _loaded:
            name = os.environ.get(ENV, "").strip()
            if name:
                try:
                    module = importlib.import_module(name)
                except ImportError as exc:
                    raise ConfigError(
                        f"{ENV}={name!r} names no importable module ({exc}); it is a test "
                        f"hook: unset it outside the test suite"
                    ) from exc
                _observer = module.observer()
            _loaded = True
        return _observer


def watched() -> bool:
    """True when an observer is installed (a test run); False in production."""
    return (_observer if _loaded else _load()) is not None


def reached(point: str) -> None:
    """The calling thread is at ``point``; an installed observer sees it (it may exit)."""
    observer = _observer if _loaded else _load()
    if observer is not None:
        observer(point)
