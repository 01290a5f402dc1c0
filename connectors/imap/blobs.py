"""Claim-check writes started before parsing, so their fsyncs overlap the (CPU-bound) parse.

The parser puts every raw MIME into the claim-check store, and the local store fsyncs each blob
(twice: file and directory) before returning - about 1 ms of waiting per mail on this disk,
more than the parse itself. A batch is fetched before it is parsed, so the raw MIME of every
mail is known early: :meth:`PrefetchingClaimCheck.prefetch` starts its ``put`` on a thread
pool (fsync releases the GIL), and the parser's own ``put`` of the same bytes object then just
collects the finished reference. Parsing stays on one thread (parsing on several threads only
adds GIL contention). Durability is unchanged: a ``put`` returns only after the inner store's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor

from connectors.core.claimcheck import BlobRef, ClaimCheckStore


class PrefetchingClaimCheck:
    """A :class:`ClaimCheckStore` wrapper; thread-safe, shared by the workers of a source."""

    def __init__(self, inner: ClaimCheckStore, threads: int) -> None:
        self._inner = inner
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="claim-check")
        # Keyed by the identity of the bytes object the parser will be handed; the entry keeps
        # the object alive, so its id cannot be reused while the entry exists.
        self._pending: dict[tuple[int, str], tuple[bytes, Future[BlobRef]]] = {}
        self._lock = threading.Lock()

    def prefetch(self, data: bytes, kind: str = "raw") -> None:
        with self._lock:
            key = (id(data), kind)
            if key not in self._pending:
                self._pending[key] = (data, self._pool.submit(self._inner.put, data, kind=kind))

    def put(self, data: bytes, *, kind: str) -> BlobRef:
        with self._lock:
            entry = self._pending.pop((id(data), kind), None)
        if entry is not None and entry[0] is data:
            return entry[1].result()
        return self._inner.put(data, kind=kind)

    def get(self, uri: str) -> bytes:
        return self._inner.get(uri)

    def settle(self, datas: Iterable[bytes], kind: str = "raw") -> None:
        """Wait for and forget prefetches the parser did not collect (it failed early)."""
        for data in datas:
            with self._lock:
                entry = self._pending.pop((id(data), kind), None)
            if entry is not None:
                entry[1].exception()

    def close(self) -> None:
        self._pool.shutdown(wait=True)
