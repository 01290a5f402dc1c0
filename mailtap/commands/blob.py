"""``mailtap blob get URI [-o FILE] -c CONFIG``: a claim-check blob, checked against its sha256.

The URI is one an event carries (``raw_ref.uri``, ``attachments[].uri``): ``s3://bucket/key``
(the key ends in the blob's sha256) or ``file:///...`` (a file named by its sha256, or a pack
with ``#offset=..&size=..&sha256=..``). The bytes are written only when their sha256 matches;
a damaged or missing blob exits non-zero with the reason. An ``s3://`` URI is read with the
config's ``claim_check.s3`` settings (endpoint, region, credentials; boto3's own chain when the
section leaves them out), from the URI's bucket; a ``file://`` URI only from inside the
config's local ``claim_check.url``.
"""

from __future__ import annotations

import sys
from pathlib import Path
from urllib.parse import urlsplit

import click

from connectors.core.claimcheck.errors import ClaimCheckError
from connectors.core.claimcheck.open import open_configured
from connectors.core.claimcheck.store import close_store
from connectors.core.config import MailtapConfig, load_config
from connectors.core.errors import ConfigError
from mailtap.commands.common import config_option


@click.group("blob")
def blob() -> None:
    """Claim-check blobs (raw mails, large bodies, attachments) that events refer to."""


def fetch_blob(cfg: MailtapConfig, uri: str) -> bytes:
    """The verified bytes behind ``uri``; ClaimCheckError or ConfigError say why not."""
    parts = urlsplit(uri)
    if parts.scheme == "s3":
        from connectors.core.claimcheck.s3 import S3ClaimCheckStore

        store = S3ClaimCheckStore.open(f"s3://{parts.netloc}", cfg.claim_check.s3)
        try:
            return store.get(uri)
        finally:
            close_store(store)
    if parts.scheme == "file":
        if urlsplit(cfg.claim_check.url).scheme != "file":
            raise ConfigError(
                f"{uri} is a file:// blob but claim_check.url is {cfg.claim_check.url}: use the "
                "config of the host whose claim-check folder holds it"
            )
        local = open_configured(cfg.claim_check)  # the folder's checks: absolute, local
        try:
            return local.get(uri)
        finally:
            close_store(local)
    raise ClaimCheckError(f"not a claim-check URI (s3://bucket/key or file:///path): {uri!r}")


@blob.command("get")
@click.argument("uri")
@click.option(
    "-o",
    "--output",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Write the blob to FILE (default: standard output).",
)
@config_option
def get(uri: str, output: Path | None, config_path: str) -> None:
    """Fetch the blob at URI, check its sha256, and write it out."""
    try:
        data = fetch_blob(load_config(config_path), uri)
    except (ClaimCheckError, ConfigError) as exc:
        raise click.ClickException(str(exc)) from exc
    if output is None:
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()
    else:
        output.write_bytes(data)
        click.echo(f"{output}: {len(data)} bytes, sha256 verified", err=True)
