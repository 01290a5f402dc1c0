"""connectors/core/claimcheck/store.py: the local content-addressed store and the URL factory.
(Lives next to the mail tests because the mail parser is its first user.)"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest

from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.local import LocalClaimCheckStore, make_durable
from connectors.core.claimcheck.open import open_claim_check, open_configured
from connectors.core.claimcheck.store import BlobRef, begin_batch, staged_batch
from connectors.core.config import ClaimCheckSettings
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


def test_the_default_url_is_a_folder_under_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A configuration without claim_check used to stop at start on its own default.
    monkeypatch.chdir(tmp_path)
    store = open_configured(ClaimCheckSettings())
    assert isinstance(store, LocalClaimCheckStore)
    ref = store.put(b"default", kind="raw")
    assert ref.uri.startswith(f"file://{tmp_path}/.state/claims/raw/")  # absolute in events
    assert store.get(ref.uri) == b"default"


@pytest.mark.parametrize(
    ("url", "message"),
    [
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


@pytest.mark.parametrize(
    ("url", "message"),
    [("s3:///claims", "expected s3://bucket"), ("s3://bucket/claims?x=1", "no \\?query")],
)
def test_an_s3_url_without_a_bucket_fails_before_any_request(url: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        open_claim_check(url)


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


def test_a_staged_batch_keeps_what_its_block_committed_and_drops_the_rest(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path, pack_max_blob=1024)
    with staged_batch(store) as batch:
        assert batch is not None
        kept = batch.put(b"committed", kind="raw")
        batch.commit()
    with pytest.raises(RuntimeError), staged_batch(store) as batch:
        assert batch is not None
        batch.put(b"staged, then the batch failed", kind="raw")
        raise RuntimeError("the Kafka transaction failed")
    assert len(_packs(tmp_path)) == 1  # the failed block's pack was never written
    assert store.get(kept.uri) == b"committed"
    with staged_batch(None) as nothing:
        assert nothing is None
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


# --- packs: a batch's small blobs in one file ----------------------------------------------


def _packs(root: Path) -> list[Path]:
    return sorted(root.glob("pack/*/*.pack"))


def test_a_batch_packs_small_blobs_into_one_file_readable_by_their_uris(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path, fsync_threads=2, pack_max_blob=64)
    batch = store.batch()
    small = [batch.put(b"mail %d" % i, kind="raw") for i in range(20)]
    again = batch.put(b"mail 3", kind="raw")
    large = batch.put(b"L" * 65, kind="attachment")  # over the limit: a file of its own
    assert again == small[3]
    assert _packs(tmp_path) == []  # nothing is written before commit
    batch.commit()
    (pack,) = _packs(tmp_path)
    assert pack.read_bytes() == b"".join(b"mail %d" % i for i in range(20))
    for i, ref in enumerate(small):
        assert ref.sha256 == hashlib.sha256(b"mail %d" % i).hexdigest()
        assert ref.size == len(b"mail %d" % i)
        assert ref.uri.startswith(pack.as_uri() + "#offset=")
        assert store.get(ref.uri) == b"mail %d" % i
    assert store.get(large.uri) == b"L" * 65 and "#" not in large.uri
    assert open_claim_check(tmp_path.as_uri()).get(small[5].uri) == b"mail 5"
    store.close()


def test_every_batch_writes_its_own_pack_and_a_discarded_one_writes_none(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path, pack_max_blob=1024)
    dropped = store.batch()
    dropped.put(b"never committed", kind="raw")
    dropped.discard()
    assert _packs(tmp_path) == []
    first, second = store.batch(), store.batch()
    one, two = first.put(b"same", kind="raw"), second.put(b"same", kind="raw")
    first.commit()
    second.commit()
    assert one.sha256 == two.sha256 and one.uri != two.uri and len(_packs(tmp_path)) == 2
    store.close()


def test_a_damaged_pack_or_reference_is_a_claim_check_error(tmp_path: Path) -> None:
    store = LocalClaimCheckStore(tmp_path, pack_max_blob=1024)
    batch = store.batch()
    ref = batch.put(b"payload one", kind="raw")
    batch.put(b"payload two", kind="raw")
    batch.commit()
    (pack,) = _packs(tmp_path)
    base = ref.uri.partition("#")[0]
    for bad in (
        f"{base}#offset=0&size=11",  # no digest
        f"{base}#offset=x&size=11&sha256={ref.sha256}",
        f"{base}#offset=-1&size=11&sha256={ref.sha256}",
        f"{base}#offset=1&size=11&sha256={ref.sha256}",  # wrong range
        f"{base}#offset=0&size=11&sha256={'0' * 64}",
    ):
        with pytest.raises(ClaimCheckError):
            store.get(bad)
    pack.write_bytes(b"PAYLOAD ONE" + pack.read_bytes()[11:])
    with pytest.raises(ClaimCheckError, match="does not match its sha256"):
        store.get(ref.uri)
    pack.unlink()
    with pytest.raises(ClaimCheckError, match="cannot read"):
        store.get(ref.uri)


def test_a_pack_write_failure_is_a_retriable_error_at_commit(tmp_path: Path) -> None:
    (tmp_path / "pack").write_bytes(b"not a directory")
    batch = LocalClaimCheckStore(tmp_path, pack_max_blob=1024).batch()
    batch.put(b"x", kind="raw")
    with pytest.raises(ClaimCheckError) as caught:
        batch.commit()
    assert classify(caught.value) is Disposition.RETRY


def test_a_deferred_pack_is_written_at_commit_and_made_durable_by_its_paths(
    tmp_path: Path,
) -> None:
    store = LocalClaimCheckStore(tmp_path, pack_max_blob=1024)
    batch = store.batch()
    ref = batch.put(b"parsed elsewhere", kind="raw")
    large = batch.put(b"L" * 2000, kind="raw")  # not packed: durable at commit as before
    unsynced = batch.commit(defer_pack_sync=True)
    assert unsynced == [str(p) for p in _packs(tmp_path)] and len(unsynced) == 1
    make_durable(unsynced)
    assert store.get(ref.uri) == b"parsed elsewhere" and store.get(large.uri) == b"L" * 2000
    assert store.batch().commit(defer_pack_sync=True) == []  # no pack, nothing to sync
    with pytest.raises(ClaimCheckError) as caught:
        make_durable([str(tmp_path / "missing.pack")])
    assert classify(caught.value) is Disposition.RETRY
    store.close()
