"""A process-level bound on librdkafka calls that ignore their own timeout.

``send_offsets_to_transaction`` can block past its timeout, forever, when the consumer group's
coordinator went away and came back (a broker restart): librdkafka never checks the
coordinator request's deadline (confluentinc/librdkafka#5456) and does not look the
coordinator up again once its broker was decommissioned (#5511); both open in 2.14. The soak
found an SMTP sink stuck there for minutes after a broker kill -9, ``/healthz`` still ok and
nothing delivered.

Nothing can cancel a blocked librdkafka call, and the producer is unusable while it blocks,
so :func:`bounded` gives up on the process: it logs one sentence and exits with
:data:`EXIT_KAFKA_HUNG`. That is the kill -9 case the sink and the sources are built for —
the open transaction is aborted by the broker (or fenced by the restart's
``init_transactions``), the consumer's offsets were not committed, and the restart (the
orchestrator's, or the soak harness's) reads the same records again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable
from typing import TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Exit status of a process that gave up on a hung librdkafka call (EX_TEMPFAIL: try again).
EXIT_KAFKA_HUNG = 75
#: How long past its own timeout a call may block before the process gives up.
GRACE_S = 5.0
#: The timeout given to ``send_offsets_to_transaction``, shorter than the other transactional
#: calls': it is the call that hangs (#5456/#5511), and the process gives up on it at this plus
#: ``GRACE_S``. At 60 + 5 s a hang that began after a broker restart outlasted the soak's 60 s
#: recovery limit (seed 4); on a healthy cluster the call takes milliseconds, and a
#: coordinator still loading after 20 s ends in the restart that a hang would have anyway.
SEND_OFFSETS_TIMEOUT_S = 20.0


def bounded(call: Callable[[], T], timeout_s: float, what: str) -> T:
    """``call()``, which was given ``timeout_s`` as its own timeout; if it has not returned
    ``GRACE_S`` after that, log and exit the process (see the module docstring)."""
    timer = threading.Timer(timeout_s + GRACE_S, _give_up, args=(what, timeout_s + GRACE_S))
    timer.daemon = True
    timer.start()
    try:
        return call()
    finally:
        timer.cancel()


def _give_up(what: str, waited_s: float) -> None:
    log.critical(
        "kafka: %s did not return within %.0f s, past its own timeout (librdkafka "
        "#5456/#5511: a group coordinator lost in a broker restart); exiting with status %d "
        "so that a restart aborts the open transaction and reads the records again",
        what,
        waited_s,
        EXIT_KAFKA_HUNG,
    )
    for handler in logging.getLogger().handlers:
        with contextlib.suppress(Exception):  # the exit matters more than a handler's error
            handler.flush()
    os._exit(EXIT_KAFKA_HUNG)
