"""connectors/core/claimcheck.py: the local content-addressed store and the URL factory.
(Lives next to the mail tests because the mail parser is its first user.)"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from connectors.core.claimcheck import (
    BlobRef,
    ClaimCheckError,
    LocalClaimCheckStore,
    begin_batch,
    open_claim_check,
)
from connectors.core.errors import ConfigError, Disposition, classify

pytestmark = pytest.mark.unit


def test_put_get_round_trip_and_content_addressing(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    data = b"\x00binary\xffdata" * 100
    ref = store.put(data, kind="attachment")
    assert ref.sha256 == hashlib.sha256(data).hexdigest()
    assert ref.size == len(data)
    assert ref.uri.startswith("file:///")
    assert ref.uri.endswith(f"/attachment/{ref.sha256[:2]}/{ref.sha256}")
    assert store.get(ref.uri) == data
    assert ref.to_avro() == {"uri": ref.uri, "sha256": ref.sha256, "size": ref.size}


def test_put_is_idempotent_and_leaves_no_temporary_files(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    first = store.put(b"same", kind="raw")
    mtime = Path(first.uri.removeprefix("file://")).stat().st_mtime_ns
    second = store.put(b"same", kind="raw")
    assert first == second
    assert Path(first.uri.removeprefix("file://")).stat().st_mtime_ns == mtime
    assert [p.name for p in tmp_path.rglob("*") if p.is_file()] == [first.sha256]


def test_a_torn_file_is_replaced(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    ref = store.put(b"complete content", kind="raw")
    path = Path(ref.uri.removeprefix("file://"))
    path.write_bytes(b"torn")
    assert store.put(b"complete content", kind="raw") == ref
    assert store.get(ref.uri) == b"complete content"


def test_corruption_is_detected(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    ref = store.put(b"abcd", kind="raw")
    Path(ref.uri.removeprefix("file://")).write_bytes(b"abce")
    with pytest.raises(ClaimCheckError, match="does not match its sha256"):
        store.get(ref.uri)


@pytest.mark.parametrize(
    "uri",
    ["file:///etc/passwd", "s3://bucket/key", "file://otherhost/x", "relative/path"],
)
def test_uris_outside_the_store_are_refused(tmp_path: Path, uri: str) -> None:
    with pytest.raises(ClaimCheckError):
        LocalClaimCheckStore(tmp_path).get(uri)


def test_traversal_is_refused(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path / "store")
    (tmp_path / "secret").write_bytes(b"x")
    with pytest.raises(ClaimCheckError, match="outside the store root"):
        store.get(f"file://{tmp_path}/store/../secret")


@pytest.mark.parametrize("kind", ["", "../x", "Raw", "a/b", "x" * 40])
def test_kinds_are_plain_names(tmp_path: Path, kind: str) -> None:
    with pytest.raises(ValueError, match="kind"):
        LocalClaimCheckStore(tmp_path).put(b"x", kind=kind)


def test_write_failure_on_a_file_in_the_way(tmp_path: Path) -> None:
    (tmp_path / "raw").write_bytes(b"not a directory")
    with pytest.raises(ClaimCheckError) as caught:
        LocalClaimCheckStore(tmp_path).put(b"x", kind="raw")
    assert isinstance(caught.value.__cause__, OSError)
    assert classify(caught.value) is Disposition.RETRY


def test_open_claim_check_file_url(tmp_path: Path) -> None:
    store = open_claim_check(f"file://{tmp_path}/blobs")
    assert isinstance(store, LocalClaimCheckStore)
    ref = store.put(b"via url", kind="raw")
    assert ref.uri.startswith(f"file://{tmp_path}/blobs/raw/")


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("s3://bucket/prefix", "S3"),
        ("file://host/path", "absolute local path"),
        ("http://example.com/x", "unsupported scheme"),
        ("/just/a/path", "unsupported scheme"),
    ],
)
def test_open_claim_check_errors_say_what_to_change(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        open_claim_check(url)
    assert "file:///" in str(caught.value)
    assert classify(caught.value) is Disposition.PERMANENT


def _files(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def test_a_batch_stores_its_blobs_once_by_commit(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path, fsync_threads=2)
    batch = begin_batch(store)
    first = batch.put(b"first", kind="raw")
    again = batch.put(b"first", kind="raw")
    second = batch.put(b"second", kind="attachment")
    assert first == again == store.locate(b"first", "raw")[1]
    batch.commit()
    assert store.get(first.uri) == b"first" and store.get(second.uri) == b"second"
    assert _files(tmp_path) == sorted([first.sha256, second.sha256])
    assert store.put(b"first", kind="raw") == first  # idempotent across both paths
    store.close()


def test_a_discarded_batch_leaves_no_write_in_flight_nor_temporary_file(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    batch = store.batch()
    refs = [batch.put(b"blob %d" % i, kind="raw") for i in range(50)]
    batch.discard()
    assert _files(tmp_path) == sorted(ref.sha256 for ref in refs)  # complete blobs only
    batch.commit()  # nothing left to wait for
    store.close()


def test_a_removed_directory_is_made_again(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    ref = store.put(b"one", kind="raw")
    shutil.rmtree(tmp_path / "raw")
    assert store.put(b"one", kind="raw") == ref
    assert store.get(ref.uri) == b"one"


def test_a_batch_rewrites_a_torn_blob_and_keeps_a_complete_one(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path)
    whole = store.put(b"complete content", kind="raw")
    torn = store.put(b"other content", kind="raw")
    Path(torn.uri.removeprefix("file://")).write_bytes(b"torn")
    mtime = Path(whole.uri.removeprefix("file://")).stat().st_mtime_ns
    batch = store.batch()
    assert batch.put(b"complete content", kind="raw") == whole
    assert batch.put(b"other content", kind="raw") == torn
    batch.commit()
    assert Path(whole.uri.removeprefix("file://")).stat().st_mtime_ns == mtime
    assert store.get(torn.uri) == b"other content"
    store.close()


def test_a_batch_write_failure_is_a_retriable_claim_check_error_at_commit(tmp_path: Path) -> None:
    (tmp_path / "raw").write_bytes(b"not a directory")
    batch = LocalClaimCheckStore(tmp_path).batch()
    batch.put(b"x", kind="raw")
    with pytest.raises(ClaimCheckError) as caught:
        batch.commit()
    assert isinstance(caught.value.__cause__, OSError)
    assert classify(caught.value) is Disposition.RETRY


def test_begin_batch_on_another_store_puts_at_once(tmp_path: Path) -> None:
    class OtherStore:
        def __init__(self) -> None:
            self.inner = LocalClaimCheckStore(tmp_path)

        def put(self, data: bytes, *, kind: str) -> BlobRef:
            return self.inner.put(data, kind=kind)

        def get(self, uri: str) -> bytes:
            return self.inner.get(uri)

    batch = begin_batch(OtherStore())
    ref = batch.put(b"durable now", kind="raw")
    assert batch.get(ref.uri) == b"durable now"
    batch.commit()
    batch.discard()
    assert batch.get(ref.uri) == b"durable now"
