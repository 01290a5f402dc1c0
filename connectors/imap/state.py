"""The per-mailbox state machine (DESIGN.md, reliability rules)::

    DISCONNECTED -> CONNECTING -> AUTHENTICATING -> SELECTING -> SYNCING -> IDLE | POLLING
                                                                  ^            |
                                                                  +------------+
    any state --error--> BACKOFF -> CONNECTING          any state --stop/fenced--> STOPPED

One log line per transition, with account and folder; never one per loop iteration.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable

from connectors.core.source import state
from connectors.core.source.errors import IllegalTransition
from connectors.core.source.location import SourceLocation

__all__ = ["ALLOWED", "IllegalTransition", "StateMachine", "WorkerState"]

log = logging.getLogger(__name__)


class WorkerState(enum.Enum):
    DISCONNECTED = "DISCONNECTED"
    CONNECTING = "CONNECTING"
    AUTHENTICATING = "AUTHENTICATING"
    SELECTING = "SELECTING"
    SYNCING = "SYNCING"
    IDLE = "IDLE"
    POLLING = "POLLING"
    BACKOFF = "BACKOFF"
    STOPPED = "STOPPED"


S = WorkerState
ALLOWED: dict[WorkerState, frozenset[WorkerState]] = {
    S.DISCONNECTED: frozenset({S.CONNECTING}),
    S.CONNECTING: frozenset({S.AUTHENTICATING}),
    S.AUTHENTICATING: frozenset({S.SELECTING}),
    S.SELECTING: frozenset({S.SYNCING}),
    S.SYNCING: frozenset({S.IDLE, S.POLLING}),
    S.IDLE: frozenset({S.SYNCING}),
    S.POLLING: frozenset({S.SYNCING}),
    S.BACKOFF: frozenset({S.CONNECTING}),
    S.STOPPED: frozenset(),
}
# Errors and stops may happen anywhere (except once stopped).
for _state in S:
    if _state is not S.STOPPED:
        ALLOWED[_state] = ALLOWED[_state] | {S.BACKOFF, S.STOPPED}


#: The wait/sync cycle repeats on every new mail: logged at DEBUG so a busy mailbox does not
#: flood the log. The first SYNCING -> IDLE/POLLING after SELECTING is not routine: it says the
#: mailbox caught up (README: ``-v`` shows one line per transition, and "caught up" is the one
#: an operator waits for).
ROUTINE = frozenset(
    {
        (S.SYNCING, S.IDLE),
        (S.IDLE, S.SYNCING),
        (S.SYNCING, S.POLLING),
        (S.POLLING, S.SYNCING),
    }
)


class StateMachine(state.StateMachine[WorkerState]):
    """The IMAP worker's machine: the diagram above, enforced."""

    def __init__(
        self,
        account: str,
        folder: str,
        on_change: Callable[[WorkerState, WorkerState], None] | None = None,
    ) -> None:
        super().__init__(
            SourceLocation("imap", account, folder),
            S.DISCONNECTED,
            transitions=ALLOWED,
            routine=ROUTINE,
            caught_up_from=S.SELECTING,
            on_change=on_change,
            logger=log,
        )
