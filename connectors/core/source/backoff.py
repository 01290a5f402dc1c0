"""Exponential backoff with full jitter, capped (AWS architecture blog, "Exponential Backoff And Jitter")."""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delay before the next reconnect.

    >>> b = Backoff(initial=1.0, cap=60.0, rng=random.Random(0))
    >>> 0 <= b.next_delay() <= 1.0
    True
    >>> b.reset(); b.attempt
    0
    """

    initial: float = 1.0
    cap: float = 60.0
    multiplier: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    attempt: int = 0

    def next_delay(self) -> float:
        """Full jitter: uniform in [0, min(cap, initial * multiplier**attempt)]."""
        ceiling = min(self.cap, self.initial * self.multiplier**self.attempt)
        self.attempt += 1
        return self.rng.uniform(0, ceiling)

    def at_cap(self) -> float:
        """Delay used after a permanent error: the cap, so a bad password does not spin."""
        self.attempt += 1
        return self.cap

    def reset(self) -> None:
        self.attempt = 0
