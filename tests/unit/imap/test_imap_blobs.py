"""Claim-check writes started ahead of the parser: same references, same durability, errors kept."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from connectors.core.claimcheck import BlobRef, ClaimCheckError, LocalClaimCheckStore
from connectors.imap.blobs import PrefetchingClaimCheck


class CountingStore:
    def __init__(self, inner: LocalClaimCheckStore, fail: bool = False) -> None:
        self.inner = inner
        self.fail = fail
        self.puts: list[tuple[bytes, str]] = []
        self.lock = threading.Lock()

    def put(self, data: bytes, *, kind: str) -> BlobRef:
        with self.lock:
            self.puts.append((data, kind))
        if self.fail:
            raise ClaimCheckError("disk full")
        return self.inner.put(data, kind=kind)

    def get(self, uri: str) -> bytes:
        return self.inner.get(uri)


def test_a_prefetched_blob_is_written_once_and_the_parser_gets_its_reference(
    tmp_path: Path,
) -> None:
    store = CountingStore(LocalClaimCheckStore(tmp_path))
    blobs = PrefetchingClaimCheck(store, threads=4)
    raws = [b"mail %d" % i for i in range(20)]
    for raw in raws:
        blobs.prefetch(raw)
    refs = [blobs.put(raw, kind="raw") for raw in raws]
    assert [r.size for r in refs] == [len(r) for r in raws]
    assert [blobs.get(r.uri) for r in refs] == raws
    assert len(store.puts) == 20
    # Not prefetched (an attachment): written inline.
    attachment = blobs.put(b"pdf", kind="attachment")
    assert blobs.get(attachment.uri) == b"pdf" and len(store.puts) == 21
    blobs.close()


def test_equal_bytes_in_another_object_are_not_confused(tmp_path: Path) -> None:
    store = CountingStore(LocalClaimCheckStore(tmp_path))
    blobs = PrefetchingClaimCheck(store, threads=2)
    first = b"same content"
    blobs.prefetch(first)
    other = bytes(bytearray(b"same content"))
    assert blobs.put(other, kind="raw").sha256 == blobs.put(first, kind="raw").sha256
    blobs.close()


def test_a_store_failure_reaches_the_parser_and_settle_clears_uncollected(tmp_path: Path) -> None:
    store = CountingStore(LocalClaimCheckStore(tmp_path), fail=True)
    blobs = PrefetchingClaimCheck(store, threads=2)
    raw, unused = b"a", b"b"
    blobs.prefetch(raw)
    blobs.prefetch(unused)
    with pytest.raises(ClaimCheckError):
        blobs.put(raw, kind="raw")
    blobs.settle([unused])
    assert blobs._pending == {}
    blobs.close()
