"""A source worker's state: the current one, the diagram it may move along, one log line per
transition (DESIGN.md, reliability rules: "one line per state transition, not per loop").

Each source names its own states (an :class:`enum.Enum` with at least ``BACKOFF`` and
``STOPPED``) and, if it wants the diagram enforced, the transitions it allows. The machine logs
``"<kind> <account>/<folder>: OLD -> NEW (reason)"`` with the fields ``account``, ``folder`` and
``state``: WARNING into BACKOFF, DEBUG for the routine wait/sync cycle that repeats with every
new mail, INFO for everything else. The first routine transition after ``caught_up_from`` (the
end of the first sync after a connect) is logged at INFO as "caught up": the line an operator
waits for after a start.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Collection, Mapping
from typing import Generic, TypeVar

from connectors.core.source.errors import IllegalTransition
from connectors.core.source.location import SourceLocation

__all__ = ["IllegalTransition", "StateMachine"]

log = logging.getLogger(__name__)

E = TypeVar("E", bound=enum.Enum)


class StateMachine(Generic[E]):
    """Holds the current state, enforces the diagram (when given), logs each transition once."""

    def __init__(
        self,
        where: SourceLocation,
        initial: E,
        *,
        transitions: Mapping[E, Collection[E]] | None = None,
        routine: Collection[tuple[E, E]] = (),
        caught_up_from: E | None = None,
        on_change: Callable[[E, E], None] | None = None,
        logger: logging.Logger = log,
    ) -> None:
        self.where = where
        self.state: E = initial
        self.history: list[E] = [initial]
        self._transitions = transitions
        self._routine = frozenset(routine)
        self._caught_up_from = caught_up_from
        self._on_change = on_change
        self._log = logger

    @property
    def account(self) -> str:
        return self.where.account

    @property
    def folder(self) -> str:
        return self.where.folder

    def to(self, new: E, reason: str = "") -> None:
        old = self.state
        if new is old:
            return
        if self._transitions is not None and new not in self._transitions[old]:
            raise IllegalTransition(f"{old.value} -> {new.value}")
        routine = (old, new) in self._routine
        caught_up = (
            routine
            and self._caught_up_from is not None
            and len(self.history) >= 2
            and self.history[-2] is self._caught_up_from
        )
        self.state = new
        self.history.append(new)
        if new.name == "BACKOFF":
            level = logging.WARNING
        elif routine and not caught_up:
            level = logging.DEBUG
        else:
            level = logging.INFO
        if caught_up and not reason:
            reason = "caught up"
        where = self.where
        self._log.log(
            level,
            "%s %s/%s: %s -> %s%s",
            where.kind,
            where.account,
            where.folder,
            old.value,
            new.value,
            f" ({reason})" if reason else "",
            extra={"account": where.account, "folder": where.folder, "state": new.value},
        )
        if self._on_change is not None:
            self._on_change(old, new)
