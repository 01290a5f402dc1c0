"""The S3-compatible claim-check store: ``s3://bucket/prefix`` on AWS S3, MinIO, Ceph RGW, S3Proxy.

Blobs are content-addressed objects ``<prefix>/<kind>/<sha256>``, so a put is idempotent (a
redelivered mail or a UIDVALIDITY rescan writes the same object again) and a reader checks the
bytes it got against the name::

    s3://mailtap-blobs/claims/raw/9b1e...c4

An S3 PUT is atomic (a reader sees the whole object or none) and durable when it returns, so
there is no torn blob and no fsync. A batch (:class:`S3ClaimCheckBatch`) starts its blobs'
uploads on a thread pool as the parser puts them and ``commit`` waits for all of them: the order
"blobs durable, then the Kafka transaction that references them" holds as with the local store,
and a batch of 200 mails costs a few round trips of wall time, not 200. No pack files here: an
object per blob is what S3 is built for, and packs would make the objects not content-addressed.

Integrity: every PUT carries Content-MD5, so a body damaged on the way is refused by the server
(``BadDigest``) instead of stored; ``get`` checks the sha256 in the key. boto3 >= 1.36 adds CRC
checksums sent as aws-chunked trailers by default, which S3-compatible servers commonly refuse
("NotImplemented: A header you provided implies functionality that is not implemented", seen
with S3Proxy); they are switched to "when_required".

Blobs of ``HEAD_FIRST_BYTES`` or more are looked up with HEAD before they are uploaded: a rescan
of a mailbox then does not upload every large attachment again. Small ones are just PUT (one
round trip either way).

Failures: an unreachable endpoint, a missing bucket or refused credentials at start are a
:class:`~connectors.core.errors.ConfigError` whose message says what to change; at run time every
failure is a :class:`~connectors.core.claimcheck.errors.ClaimCheckError` (the batch is retried, the
mails are not bad).
"""

from __future__ import annotations

import base64
import hashlib
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.store import SHA256_HEX, BlobRef, blob_digest
from connectors.core.config import S3Settings
from connectors.core.errors import ConfigError

__all__ = ["S3ClaimCheckBatch", "S3ClaimCheckStore", "s3_client"]

#: From this size a blob is looked up (HEAD) before it is uploaded.
HEAD_FIRST_BYTES = 256 * 1024
#: Attempts per request (boto3's "standard" retry mode: backoff with jitter on throttling and
#: 5xx answers); past them the batch fails with a ClaimCheckError and the source retries it.
MAX_ATTEMPTS = 3

_NOT_FOUND = {"404", "NoSuchKey", "NotFound", "NoSuchBucket"}
_DENIED = {"403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "Forbidden"}


def _split(url: str) -> tuple[str, str]:
    """``s3://bucket/some/prefix`` -> ("bucket", "some/prefix")."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise ConfigError(f"claim-check URL {url!r}: expected s3://bucket or s3://bucket/prefix")
    if parts.query or parts.fragment:
        raise ConfigError(f"claim-check URL {url!r}: no ?query or #fragment in an s3:// URL")
    return parts.netloc, parts.path.strip("/")


def _code(exc: ClientError) -> str:
    error = exc.response.get("Error", {})
    return str(error.get("Code") or exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode"))


class S3ClaimCheckStore:
    """Blobs as objects ``<prefix>/<kind>/<sha256>`` in one bucket."""

    def __init__(self, url: str, settings: S3Settings) -> None:
        self.url = url
        self.bucket, self.prefix = _split(url)
        self.settings = settings
        #: boto3's S3 client (thread-safe; the upload threads share it).
        self.client = s3_client(settings)
        self._pool: ThreadPoolExecutor | None = None
        self._pool_lock = threading.Lock()

    @classmethod
    def open(cls, url: str, settings: S3Settings) -> S3ClaimCheckStore:
        """A store on ``url`` whose bucket answered, or a ConfigError saying what to change."""
        store = cls(url, settings)
        store.check_bucket()
        return store

    def check_bucket(self) -> None:
        where = self.settings.endpoint_url or "AWS S3"
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = _code(exc)
            if code in _NOT_FOUND:
                raise ConfigError(
                    f"claim-check bucket {self.bucket!r} does not exist at {where}: create it, "
                    "or fix claim_check.url"
                ) from None
            if code in _DENIED:
                raise ConfigError(
                    f"claim-check bucket {self.bucket!r} at {where}: access denied ({code}); "
                    "check claim_check.s3.access_key_id/secret_access_key (or the AWS_* "
                    "environment) and the bucket policy"
                ) from None
            raise ConfigError(
                f"claim-check bucket {self.bucket!r} at {where}: {code}; check claim_check.s3"
            ) from None
        except BotoCoreError as exc:
            raise ConfigError(
                f"cannot reach the claim-check store at {where} ({exc}); check "
                "claim_check.s3.endpoint_url and that the server is up"
            ) from None

    # --- writing ---------------------------------------------------------------------------

    def locate(self, data: bytes, kind: str) -> tuple[str, BlobRef]:
        """The object key of ``data`` and its reference."""
        digest = blob_digest(data, kind)
        key = f"{self.prefix}/{kind}/{digest}" if self.prefix else f"{kind}/{digest}"
        return key, BlobRef(uri=f"s3://{self.bucket}/{key}", sha256=digest, size=len(data))

    def put(self, data: bytes, *, kind: str) -> BlobRef:
        """Store ``data`` now (durable when this returns); raises ClaimCheckError."""
        key, ref = self.locate(data, kind)
        self.write(key, data)
        return ref

    def write(self, key: str, data: bytes) -> None:
        """PUT ``data`` under ``key`` unless a large blob is there already."""
        try:
            if len(data) >= HEAD_FIRST_BYTES and self._has(key, len(data)):
                return
            md5 = base64.b64encode(hashlib.md5(data, usedforsecurity=False).digest()).decode()
            self.client.put_object(Bucket=self.bucket, Key=key, Body=data, ContentMD5=md5)
        except (ClientError, BotoCoreError) as exc:
            raise ClaimCheckError(
                f"cannot store claim-check blob s3://{self.bucket}/{key}: {exc}"
            ) from exc

    def _has(self, key: str, size: int) -> bool:
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=key)
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                return False
            raise
        return int(head.get("ContentLength", -1)) == size

    def batch(self) -> S3ClaimCheckBatch:
        return S3ClaimCheckBatch(self)

    def upload_pool(self) -> ThreadPoolExecutor:
        with self._pool_lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(
                    self.settings.upload_threads, thread_name_prefix="claim-check-s3"
                )
            return self._pool

    # --- reading ---------------------------------------------------------------------------

    def get(self, uri: str) -> bytes:
        """The bytes of ``s3://bucket/.../<sha256>``, checked against the digest in the key."""
        parts = urlsplit(uri)
        key = parts.path.lstrip("/")
        digest = key.rpartition("/")[2]
        if parts.scheme != "s3" or not parts.netloc or not SHA256_HEX.match(digest):
            raise ClaimCheckError(f"not a claim-check URI of an S3 store: {uri!r}")
        try:
            answer = self.client.get_object(Bucket=parts.netloc, Key=key)
            data: bytes = answer["Body"].read()
        except ClientError as exc:
            if _code(exc) in _NOT_FOUND:
                raise ClaimCheckError(f"claim-check blob not found: {uri}") from exc
            raise ClaimCheckError(f"cannot read claim-check blob {uri}: {exc}") from exc
        except BotoCoreError as exc:
            raise ClaimCheckError(f"cannot read claim-check blob {uri}: {exc}") from exc
        if hashlib.sha256(data).hexdigest() != digest:
            raise ClaimCheckError(f"claim-check blob {uri} is damaged: its sha256 differs")
        return data

    def close(self) -> None:
        with self._pool_lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=True)


class S3ClaimCheckBatch:
    """Uploads started at ``put``, all durable once :meth:`commit` returned. One thread."""

    def __init__(self, store: S3ClaimCheckStore) -> None:
        self._store = store
        self._pending: dict[str, Future[None]] = {}

    def put(self, data: bytes, *, kind: str) -> BlobRef:
        key, ref = self._store.locate(data, kind)
        if key not in self._pending:
            self._pending[key] = self._store.upload_pool().submit(self._store.write, key, data)
        return ref

    def get(self, uri: str) -> bytes:
        return self._store.get(uri)

    def commit(self) -> list[str]:
        """Wait for every upload of the batch; raises the first ClaimCheckError."""
        pending, self._pending = self._pending, {}
        failed: BaseException | None = None
        for upload in pending.values():
            error = upload.exception()  # wait for all: none outlives the batch
            failed = failed or error
        if failed is not None:
            raise failed
        return []

    def discard(self) -> None:
        """Wait for the uploads in flight and forget them. What was stored stays:
        content-addressed objects nobody references are harmless."""
        pending, self._pending = self._pending, {}
        for upload in pending.values():
            upload.exception()


def s3_client(settings: S3Settings) -> Any:
    """A boto3 S3 client for ``settings`` (timeouts, retries, addressing, checksums as above)."""
    style = settings.addressing_style
    if style == "auto" and settings.endpoint_url:
        style = "path"  # S3-compatible servers rarely have a DNS name per bucket
    config = Config(
        connect_timeout=settings.connect_timeout_seconds,
        read_timeout=settings.read_timeout_seconds,
        retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"},
        max_pool_connections=settings.upload_threads,
        s3={"addressing_style": style},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    secret = settings.secret_access_key
    return boto3.session.Session().client(
        "s3",
        endpoint_url=settings.endpoint_url,
        region_name=settings.region,
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=secret.get_secret_value() if secret else None,
        config=config,
    )
