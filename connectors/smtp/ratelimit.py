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

    def wait_for_token(self) -> float:
        """Seconds until a token is available, without taking it."""
        now = self._clock()
        self._tokens = min(self.capacity, self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        return 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate

    def try_take(self) -> float:
        """Take a token if there is one (returns 0), else return the seconds until there is one.

        A token is reserved even when the caller has to wait, so waiters queue fairly.
        """
        self.wait_for_token()
        self._tokens -= 1.0
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate


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

    async def acquire(self, recipients: Iterable[str], max_wait: float | None = None) -> bool:
        """Wait for the relay's and each recipient domain's token; True when taken.

        When the wait would exceed ``max_wait`` nothing is taken and False is returned: the sink
        defers the message to a retry tier instead of holding its batch (and the consumer's
        poll interval) for a throttled domain.
        """
        buckets = [self._relay] if self._relay else []
        for domain in sorted({r.rpartition("@")[2].lower() for r in recipients}):
            bucket = self._bucket(domain)
            if bucket is not None:
                buckets.append(bucket)
        if max_wait is not None and any(b.wait_for_token() > max_wait for b in buckets):
            return False
        longest = max((b.try_take() for b in buckets), default=0.0)
        if longest > 0:
            await asyncio.sleep(longest)
        return True
