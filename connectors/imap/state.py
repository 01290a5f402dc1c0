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
#: flood the log; every other transition is an event worth an INFO line. The first SYNCING ->
#: IDLE/POLLING after SELECTING is not routine: it says the mailbox caught up (README: ``-v``
#: shows one line per transition, and "caught up" is the one an operator waits for).
_ROUTINE = {
    (S.SYNCING, S.IDLE),
    (S.IDLE, S.SYNCING),
    (S.SYNCING, S.POLLING),
    (S.POLLING, S.SYNCING),
}


class IllegalTransition(RuntimeError):
    """A bug: the worker tried a transition the diagram does not have."""


class StateMachine:
    """Holds the current state, enforces the diagram, logs each transition once."""

    def __init__(
        self,
        account: str,
        folder: str,
        on_change: Callable[[WorkerState, WorkerState], None] | None = None,
    ) -> None:
        self.account = account
        self.folder = folder
        self.state = S.DISCONNECTED
        self.history: list[WorkerState] = [S.DISCONNECTED]
        self._on_change = on_change

    def to(self, new: WorkerState, reason: str = "") -> None:
        old = self.state
        if new is old:
            return
        if new not in ALLOWED[old]:
            raise IllegalTransition(f"{old.value} -> {new.value}")
        caught_up = (
            old is S.SYNCING
            and new in (S.IDLE, S.POLLING)
            and len(self.history) >= 2
            and self.history[-2] is S.SELECTING
        )
        self.state = new
        self.history.append(new)
        level = (
            logging.WARNING
            if new is S.BACKOFF
            else logging.DEBUG
            if (old, new) in _ROUTINE and not caught_up
            else logging.INFO
        )
        if caught_up and not reason:
            reason = "caught up"
        log.log(
            level,
            "imap %s/%s: %s -> %s%s",
            self.account,
            self.folder,
            old.value,
            new.value,
            f" ({reason})" if reason else "",
            extra={"account": self.account, "folder": self.folder, "state": new.value},
        )
        if self._on_change is not None:
            self._on_change(old, new)
