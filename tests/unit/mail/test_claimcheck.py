"""connectors/core/claimcheck.py: the local content-addressed store and the URL factory.
(Lives next to the mail tests because the mail parser is its first user.)"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from connectors.core.claimcheck import (
    ClaimCheckError,
    LocalClaimCheckStore,
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
