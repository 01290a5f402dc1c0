"""Claim-check store: large payloads live outside Kafka, events carry a reference.

Mail bodies, attachments and the raw MIME can be many megabytes, far above the broker's
``message.max.bytes``. The parser puts them here and puts only a :class:`BlobRef`
(URI, sha256, size) into the ``MailEvent``, so records stay small and the content can be
fetched later by whoever needs it (the Kafka "claim check" pattern).

Stores are content-addressed: the same bytes always give the same URI, so storing a blob
again (a redelivered mail, a rescan after a UIDVALIDITY change) is a no-op.

>>> import tempfile
>>> store = LocalClaimCheckStore(Path(tempfile.mkdtemp()))
>>> ref = store.put(b"hello", kind="raw")
>>> ref.sha256[:12], ref.size
('2cf24dba5fb0', 5)
>>> store.get(ref.uri)
b'hello'
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from urllib.parse import unquote, urlsplit
from urllib.request import pathname2url

from connectors.core.errors import ConfigError, MailtapError

__all__ = [
    "BlobRef",
    "ClaimCheckError",
    "ClaimCheckStore",
    "LocalClaimCheckStore",
    "open_claim_check",
]

# A kind becomes a directory (or an object-key prefix), so it must be a plain name.
_KIND_RE = re.compile(r"^[a-z0-9][a-z0-9_-]{0,31}$")


class ClaimCheckError(MailtapError):
    """A blob could not be stored or read. Chained to the OSError when there is one, so
    :func:`connectors.core.errors.classify` reads a full disk as retriable."""


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


class LocalClaimCheckStore:
    """Blobs as files under ``root/<kind>/<sha[:2]>/<sha256>``, addressed by ``file://`` URIs.

    Writes go to a temporary file in the target directory, are fsynced and then renamed into
    place, so a crash leaves either the complete blob or nothing (plus a stray ``.tmp`` file).
    """

    def __init__(self, root: Path) -> None:
        self.root = Path(root).resolve()

    def put(self, data: bytes, *, kind: str) -> BlobRef:
        if not _KIND_RE.match(kind):
            raise ValueError(f"claim-check kind must match {_KIND_RE.pattern}, got {kind!r}")
        digest = hashlib.sha256(data).hexdigest()
        path = self.root / kind / digest[:2] / digest
        ref = BlobRef(uri="file://" + pathname2url(str(path)), sha256=digest, size=len(data))
        try:
            if path.is_file() and path.stat().st_size == len(data):
                return ref
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{digest[:16]}.", suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(data)
                    out.flush()
                    os.fsync(out.fileno())
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise
            _fsync_dir(path.parent)
        except OSError as exc:
            raise ClaimCheckError(f"cannot store blob {digest} under {self.root}: {exc}") from exc
        return ref

    def get(self, uri: str) -> bytes:
        path = self._path_of(uri)
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise ClaimCheckError(f"cannot read blob {uri}: {exc}") from exc
        # The file name is the content hash: a mismatch means corruption on disk.
        if hashlib.sha256(data).hexdigest() != path.name:
            raise ClaimCheckError(f"blob {uri} does not match its sha256 (corrupted store?)")
        return data

    def _path_of(self, uri: str) -> Path:
        parts = urlsplit(uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise ClaimCheckError(f"not a local claim-check URI: {uri!r}")
        path = Path(unquote(parts.path)).resolve()
        if not path.is_relative_to(self.root):
            raise ClaimCheckError(f"URI {uri!r} points outside the store root {self.root}")
        return path


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX: the directory entry needs its own fsync)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_claim_check(url: str) -> ClaimCheckStore:
    """Build a store from a configured URL.

    ``file:///var/lib/mailtap/blobs`` -> :class:`LocalClaimCheckStore`. ``s3://bucket/prefix``
    is the optional S3-compatible store; it needs boto3 and is not part of this build.
    A URL that cannot work raises :class:`~connectors.core.errors.ConfigError`.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        if parts.netloc not in ("", "localhost") or not parts.path:
            raise ConfigError(
                f"claim-check URL {url!r}: use an absolute local path like file:///var/lib/mailtap/blobs"
            )
        return LocalClaimCheckStore(Path(unquote(parts.path)))
    if parts.scheme == "s3":
        try:
            import boto3  # noqa: F401
        except ImportError:
            raise ConfigError(
                f"claim-check URL {url!r}: the S3 option needs boto3 (pip install boto3); "
                "or use a local folder: file:///path/to/blobs"
            ) from None
        raise ConfigError(
            f"claim-check URL {url!r}: the S3 store is not implemented in this build; "
            "use a local folder: file:///path/to/blobs"
        )
    raise ConfigError(
        f"claim-check URL {url!r}: unsupported scheme {parts.scheme!r}; use file:///path/to/blobs"
    )
