"""The claim-check interface: large payloads live outside Kafka, events carry a reference.

Mail bodies, attachments and the raw MIME can be many megabytes, far above the broker's
``message.max.bytes``. The parser puts them in a store and puts only a :class:`BlobRef`
(URI, sha256, size) into the ``MailEvent``, so records stay small and the content can be
fetched later by whoever needs it (the Kafka "claim check" pattern).

Stores are content-addressed: the same bytes always give the same URI, so storing a blob
again (a redelivered mail, a rescan after a UIDVALIDITY change) is a no-op.

A source writes the blobs of one Kafka transaction through a :class:`ClaimCheckBatch`
(:func:`begin_batch`): ``put`` only writes, and ``commit`` makes the whole batch durable at
once, before the transaction that references it commits. The stores: :mod:`.local` (a folder)
and :mod:`.s3`; :mod:`.open` builds the configured one.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

# Re-exported (``as``) for the record builders that still import it from here; new code
# imports it from connectors.core.claimcheck.errors.
from connectors.core.claimcheck.errors import ClaimCheckError as ClaimCheckError

#: fsyncs in flight at once. fsync releases the GIL and ext4 folds concurrent fsyncs into one
#: journal commit: 200 blobs took 35-65 ms with 8-16 threads here, 530 ms one after another.
DEFAULT_FSYNC_THREADS = 8

#: Where pack files go under the store root (``pack/<UTC date>/<id>.pack``).
PACK_DIR = "pack"
#: A sha256 in hex, as blob names and URIs carry it.
SHA256_HEX = re.compile(r"^[0-9a-f]{64}$")

# A kind becomes a directory (or an object-key prefix), so it must be a plain name.
KIND_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


def blob_digest(data: bytes, kind: str) -> str:
    """The sha256 (hex) that names ``data`` in every store, once ``kind`` is a plain name."""
    if not KIND_RE.match(kind):
        raise ValueError(f"claim-check kind must match {KIND_RE.pattern}, got {kind!r}")
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, slots=True)
class BlobRef:
    """Where a blob lives; mirrors the Avro record ``io.mailtap.v1.BlobRef``."""

    uri: str
    sha256: str
    size: int

    def to_avro(self) -> dict[str, object]:
        return {"uri": self.uri, "sha256": self.sha256, "size": self.size}


class ClaimCheckStore(Protocol):
    """Content-addressed blob store.

    ``put`` must be idempotent (same bytes -> same ``BlobRef``) and atomic (a reader never
    sees a partial blob). ``get`` returns exactly the bytes that were put.
    """

    def put(self, data: bytes, *, kind: str) -> BlobRef: ...

    def get(self, uri: str) -> bytes: ...


class ClaimCheckBatch(Protocol):
    """The blobs of one Kafka transaction.

    ``put`` returns the blob's reference at once; the blob is durable (and readable through
    the store) only after ``commit`` returned, which the source calls before it commits the
    transaction whose events reference the batch. ``discard`` drops what was not committed.
    """

    def put(self, data: bytes, *, kind: str) -> BlobRef: ...

    def get(self, uri: str) -> bytes: ...

    def commit(self) -> list[str]: ...

    def discard(self) -> None: ...


class _DurableEachPut:
    def __init__(self, store: ClaimCheckStore) -> None:
        self._store = store

    def put(self, data: bytes, *, kind: str) -> BlobRef:
        return self._store.put(data, kind=kind)

    def get(self, uri: str) -> bytes:
        return self._store.get(uri)

    def commit(self) -> list[str]:
        return []

    def discard(self) -> None:
        return None


def begin_batch(store: ClaimCheckStore) -> ClaimCheckBatch:
    """A batch on ``store``: a staged one where the store has it (``store.batch()``: the local
    and the S3 store), else one that just puts (every ``put`` already durable, ``commit`` a
    no-op)."""
    batch = getattr(store, "batch", None)
    if callable(batch):
        staged: ClaimCheckBatch = batch()
        return staged
    return _DurableEachPut(store)


def close_store(store: ClaimCheckStore | None) -> None:
    """Let the store's threads go (stores without any have no ``close``)."""
    close = getattr(store, "close", None)
    if callable(close):
        close()


@contextmanager
def staged_batch(store: ClaimCheckStore | None) -> Iterator[ClaimCheckBatch | None]:
    """The claim-check batch of one Kafka transaction (None without a store). The block commits
    it before the transaction that references its blobs; whatever it staged and did not commit
    (the batch failed) is discarded on the way out, so a retried batch leaves nothing behind."""
    blobs = begin_batch(store) if store is not None else None
    try:
        yield blobs
    finally:
        if blobs is not None:
            blobs.discard()  # nothing after a commit
