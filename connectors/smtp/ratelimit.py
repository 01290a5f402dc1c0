"""Token buckets for the relay and per recipient domain, so a backlog does not get us blocked.

Concurrency per relay is the pool size (:class:`~connectors.smtp.transport.SmtpConnectionPool`);
these buckets bound the message *rate*. A message takes one token from the relay bucket and one
from the bucket of each distinct recipient domain.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable, Mapping

from connectors.smtp.config import RateLimit


class TokenBucket:
    """``rate`` tokens per second, at most ``capacity`` saved up.

    >>> b = TokenBucket(rate=1.0, capacity=2, clock=lambda: 0.0)
    >>> b.try_take(), b.try_take(), b.try_take()
    (0.0, 0.0, 1.0)
    """

    def __init__(
        self, rate: float, capacity: int, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.rate = rate
        self.capacity = float(capacity)
        self._clock = clock
        self._tokens = float(capacity)
        self._stamp = clock()

    @classmethod
    def from_limit(cls, limit: RateLimit) -> TokenBucket:
        per_second = limit.per_minute / 60.0
        return cls(per_second, limit.burst or max(1, int(limit.per_minute / 6)))

    def try_take(self) -> float:
        """Take a token if there is one (returns 0), else return the seconds until there is one.

        A token is reserved even when the caller has to wait, so waiters queue fairly.
        """
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate

    async def take(self) -> None:
        wait = self.try_take()
        if wait > 0:
            await asyncio.sleep(wait)


class SendRateLimiter:
    """Relay bucket plus per-domain buckets (``'*'`` is the template for every domain)."""

    def __init__(self, relay: RateLimit | None, domains: Mapping[str, RateLimit]) -> None:
        self._relay = TokenBucket.from_limit(relay) if relay else None
        self._domain_limits = {k.lower(): v for k, v in domains.items()}
        self._domains: dict[str, TokenBucket] = {}

    def _bucket(self, domain: str) -> TokenBucket | None:
        bucket = self._domains.get(domain)
        if bucket is None:
            limit = self._domain_limits.get(domain) or self._domain_limits.get("*")
            if limit is None:
                return None
            bucket = self._domains[domain] = TokenBucket.from_limit(limit)
        return bucket

    async def acquire(self, recipients: Iterable[str]) -> None:
        domains = sorted({r.rpartition("@")[2].lower() for r in recipients})
        waits = [self._relay.try_take()] if self._relay else []
        for domain in domains:
            bucket = self._bucket(domain)
            if bucket is not None:
                waits.append(bucket.try_take())
        longest = max(waits, default=0.0)
        if longest > 0:
            await asyncio.sleep(longest)
