"""The claim-check store a configuration names: a ``file://`` folder or an ``s3://`` bucket."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import unquote, urlsplit

from connectors.core.claimcheck.local import LocalClaimCheckStore
from connectors.core.claimcheck.store import DEFAULT_FSYNC_THREADS, ClaimCheckStore
from connectors.core.config import ClaimCheckSettings, S3Settings
from connectors.core.errors import ConfigError


def open_configured(
    settings: ClaimCheckSettings, fsync_threads: int = DEFAULT_FSYNC_THREADS
) -> ClaimCheckStore:
    """The store ``claim_check`` configures (:func:`open_claim_check` with its settings)."""
    return open_claim_check(settings.url, fsync_threads, settings.pack_max_blob_bytes, settings.s3)


def open_claim_check(
    url: str,
    fsync_threads: int = DEFAULT_FSYNC_THREADS,
    pack_max_blob: int = 0,
    s3: S3Settings | None = None,
) -> ClaimCheckStore:
    """Build a store from a configured URL.

    ``file:///var/lib/mailtap/blobs`` -> :class:`LocalClaimCheckStore`; ``s3://bucket/prefix``
    -> the S3-compatible store (:mod:`connectors.core.claimcheck.s3`, needs boto3: the ``s3`` extra),
    reached with ``s3`` (``claim_check.s3``: endpoint, region, credentials); its bucket must
    answer now. A URL that cannot work raises :class:`~connectors.core.errors.ConfigError`.
    """
    parts = urlsplit(url)
    if parts.scheme == "file":
        # file://./dir (the default, file://./.state/claims) is relative to the working
        # directory; the store resolves it, so the URIs in events are absolute.
        relative = parts.netloc == "."
        if parts.netloc not in ("", "localhost", ".") or not parts.path:
            raise ConfigError(
                f"claim-check URL {url!r}: use an absolute local path like "
                "file:///var/lib/mailtap/blobs (or file://./dir, relative to the working directory)"
            )
        path = Path("." + unquote(parts.path) if relative else unquote(parts.path))
        return LocalClaimCheckStore(path, fsync_threads, pack_max_blob)
    if parts.scheme == "s3":
        try:
            from connectors.core.claimcheck.s3 import S3ClaimCheckStore
        except ImportError:
            raise ConfigError(
                f"claim-check URL {url!r}: the S3 store needs boto3 (pip install 'mailtap[s3]'); "
                "or use a local folder: file:///path/to/blobs"
            ) from None
        return S3ClaimCheckStore.open(url, s3 if s3 is not None else S3Settings())
    raise ConfigError(
        f"claim-check URL {url!r}: unsupported scheme {parts.scheme!r}; use file:///path/to/blobs "
        "or s3://bucket/prefix"
    )
