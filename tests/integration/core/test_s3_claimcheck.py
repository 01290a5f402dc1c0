"""The S3 claim-check store against a real S3-compatible server (S3Proxy over HTTP on loopback)."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.open import open_claim_check
from connectors.core.claimcheck.s3 import HEAD_FIRST_BYTES, S3ClaimCheckStore, s3_client
from connectors.core.claimcheck.store import staged_batch
from connectors.core.config import S3Settings
from connectors.core.errors import ConfigError, Disposition, classify
from mailtap.dev import s3proxy
from mailtap.dev.process import free_port
from tests.conftest import s3_settings


def _store(bucket: str, settings: S3Settings, prefix: str = "claims") -> S3ClaimCheckStore:
    store = open_claim_check(f"s3://{bucket}/{prefix}", s3=settings)
    assert isinstance(store, S3ClaimCheckStore)
    return store


def _objects(store: S3ClaimCheckStore, bucket: str) -> list[str]:
    """The bucket's object keys (S3Proxy's filesystem backend also lists its folders, as
    ``claims/``: those are not objects)."""
    listed = store.client.list_objects_v2(Bucket=bucket).get("Contents", [])
    return [o["Key"] for o in listed if not o["Key"].endswith("/")]


def _calls(store: S3ClaimCheckStore, operation: str) -> list[str]:
    """The keys of every ``operation`` request the store's client sends from now on."""
    seen: list[str] = []
    store.client.meta.events.register(
        f"before-call.s3.{operation}", lambda params, **_: seen.append(params["url_path"])
    )
    return seen


def test_a_blob_is_one_content_addressed_object_read_back_exactly(
    s3_bucket: tuple[str, S3Settings],
) -> None:
    bucket, settings = s3_bucket
    store = _store(bucket, settings)
    data = "Grüße, a raw mail\r\n".encode() * 100
    ref = store.put(data, kind="raw")
    digest = hashlib.sha256(data).hexdigest()
    assert ref.uri == f"s3://{bucket}/claims/raw/{digest}"
    assert (ref.sha256, ref.size) == (digest, len(data))
    assert store.get(ref.uri) == data
    assert store.put(data, kind="raw") == ref  # idempotent
    assert _objects(store, bucket) == [f"claims/raw/{digest}"]
    # A reader configured without a prefix reads the same URI (the URI names the object).
    assert _store(bucket, settings, prefix="").get(ref.uri) == data


def test_a_batch_uploads_concurrently_and_every_blob_is_there_after_commit(
    s3_bucket: tuple[str, S3Settings],
) -> None:
    bucket, settings = s3_bucket
    store = _store(bucket, settings)
    blobs = [b"mail %d " % i * 200 for i in range(60)]
    with staged_batch(store) as batch:
        assert batch is not None
        refs = [batch.put(data, kind="raw") for data in blobs]
        refs.append(batch.put(blobs[0], kind="raw"))  # the same blob twice: one upload
        assert batch.commit() == []
    assert [store.get(ref.uri) for ref in refs] == [*blobs, blobs[0]]
    assert len(_objects(store, bucket)) == 60
    store.close()


def test_a_large_blob_already_stored_is_not_uploaded_again(
    s3_bucket: tuple[str, S3Settings],
) -> None:
    bucket, settings = s3_bucket
    store = _store(bucket, settings)
    large = bytes(range(256)) * (HEAD_FIRST_BYTES // 256 + 1)
    small = b"small"
    puts = _calls(store, "PutObject")
    first = store.put(large, kind="attachment")
    store.put(small, kind="raw")
    assert len(puts) == 2
    assert store.put(large, kind="attachment") == first  # a rescan: HEAD finds it
    store.put(small, kind="raw")  # small: a PUT costs what a HEAD does
    assert len(puts) == 3
    assert store.get(first.uri) == large


def test_a_damaged_or_missing_object_is_a_claim_check_error(
    s3_bucket: tuple[str, S3Settings],
) -> None:
    bucket, settings = s3_bucket
    store = _store(bucket, settings)
    ref = store.put(b"the original", kind="raw")
    key = ref.uri.removeprefix(f"s3://{bucket}/")
    store.client.put_object(Bucket=bucket, Key=key, Body=b"something else")
    with pytest.raises(ClaimCheckError, match="damaged"):
        store.get(ref.uri)
    store.client.delete_object(Bucket=bucket, Key=key)
    with pytest.raises(ClaimCheckError, match="not found"):
        store.get(ref.uri)
    with pytest.raises(ClaimCheckError, match="not a claim-check URI"):
        store.get("file:///tmp/raw/" + ref.sha256)


def test_a_store_that_cannot_work_fails_at_start_saying_what_to_change(
    s3_server: s3proxy.RunningS3Proxy, s3_bucket: tuple[str, S3Settings]
) -> None:
    bucket, settings = s3_bucket
    with pytest.raises(ConfigError, match=r"does not exist .* create it, or fix claim_check\.url"):
        open_claim_check("s3://no-such-bucket/claims", s3=settings)
    wrong = s3_settings(s3_server, secret_access_key="not-the-secret")
    with pytest.raises(ConfigError, match="access denied") as denied:
        open_claim_check(f"s3://{bucket}/claims", s3=wrong)
    assert "not-the-secret" not in str(denied.value)
    nobody = s3_settings(s3_server, endpoint_url=f"http://127.0.0.1:{free_port()}")
    with pytest.raises(ConfigError, match="cannot reach the claim-check store"):
        open_claim_check(f"s3://{bucket}/claims", s3=nobody)
    with pytest.raises(ConfigError, match="expected s3://bucket"):
        open_claim_check("s3:///claims", s3=settings)


def test_an_outage_fails_the_batch_as_retriable_and_the_retry_stores_it(
    tmp_path: Path, unique: str
) -> None:
    """The server goes away between two batches: the batch's commit raises a retriable
    ClaimCheckError (the source then retries the batch); once it is back, the retry works."""
    s3proxy.build()
    port = free_port()
    server = s3proxy.start(tmp_path, port=port)
    try:
        settings = s3_settings(server)
        bucket = f"outage-{unique}"
        s3_client(settings).create_bucket(Bucket=bucket)
        store = _store(bucket, settings)
        kept = store.put(b"before the outage", kind="raw")
        s3proxy.stop(tmp_path)
        with pytest.raises(ClaimCheckError) as failed, staged_batch(store) as batch:
            assert batch is not None
            retried = batch.put(b"during the outage", kind="raw")
            batch.commit()
        assert classify(failed.value) is Disposition.RETRY
        server = s3proxy.start(tmp_path, port=port)
        with staged_batch(store) as batch:
            assert batch is not None
            assert batch.put(b"during the outage", kind="raw") == retried
            batch.commit()
        assert store.get(retried.uri) == b"during the outage"
        assert store.get(kept.uri) == b"before the outage"  # the objects outlived the restart
        store.close()
    finally:
        s3proxy.stop(tmp_path)
