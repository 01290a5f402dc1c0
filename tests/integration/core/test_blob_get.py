"""Attachments other teams can open: the consumer guide's fetch function and `mailtap blob get`
against a real S3-compatible server (S3Proxy) and the local claim-check folder."""

from __future__ import annotations

import hashlib
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml
from click.testing import CliRunner

from connectors.core.avro.schemas import schemas_dir
from connectors.core.claimcheck.local import LocalClaimCheckStore
from connectors.core.claimcheck.open import open_claim_check
from connectors.core.claimcheck.s3 import s3_client
from connectors.core.config import S3Settings
from mailtap.cli import main

PDF = b"%PDF-1.7\n" + bytes(range(256)) * 40  # an attachment's bytes, binary


def readme_blob_snippet() -> str:
    """The Python block of schemas/README.md's claim-check section, verbatim."""
    text = (schemas_dir() / "README.md").read_text()
    after = text.split("### Attachments and raw mail", 1)[1]
    return after.split("```python\n", 1)[1].split("```", 1)[0]


def _config(tmp_path: Path, url: str, s3: S3Settings | None = None) -> Path:
    section: dict[str, object] = {"url": url}
    if s3 is not None:
        section["s3"] = {
            "endpoint_url": s3.endpoint_url,
            "region": s3.region,
            "access_key_id": s3.access_key_id,
            "secret_access_key": s3.secret_access_key.get_secret_value()
            if s3.secret_access_key
            else None,
        }
    path = tmp_path / "mailtap.yaml"
    path.write_text(
        yaml.safe_dump({"kafka": {"bootstrap_servers": "unused:9092"}, "claim_check": section})
    )
    return path


def test_the_readme_python_fetches_and_verifies_an_s3_attachment(
    s3_bucket: tuple[str, S3Settings],
) -> None:
    bucket, settings = s3_bucket
    store = open_claim_check(f"s3://{bucket}/claims", s3=settings)
    ref = store.put(PDF, kind="attachment").to_avro()  # what a MailEvent's attachment carries
    assert ref["uri"] == f"s3://{bucket}/claims/attachment/{hashlib.sha256(PDF).hexdigest()}"

    namespace: dict[str, object] = {}
    exec(readme_blob_snippet(), namespace)
    fetch_blob = namespace["fetch_blob"]
    client = s3_client(settings)  # a consumer's own boto3 client with read access
    assert fetch_blob(client, ref) == PDF  # type: ignore[operator]

    # A blob that is not what the event says is refused, not handed on.
    parts = urlsplit(str(ref["uri"]))
    client.put_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"), Body=b"tampered")
    with pytest.raises(ValueError, match="do not match"):
        fetch_blob(client, ref)  # type: ignore[operator]


def test_blob_get_writes_a_verified_s3_blob_and_refuses_a_damaged_one(
    s3_bucket: tuple[str, S3Settings], tmp_path: Path
) -> None:
    bucket, settings = s3_bucket
    uri = open_claim_check(f"s3://{bucket}/claims", s3=settings).put(PDF, kind="raw").uri
    config = _config(tmp_path, f"s3://{bucket}/claims", settings)
    out = tmp_path / "blob.bin"

    got = CliRunner().invoke(main, ["blob", "get", uri, "-o", str(out), "-c", str(config)])
    assert got.exit_code == 0, got.output
    assert out.read_bytes() == PDF

    parts = urlsplit(uri)
    s3_client(settings).put_object(Bucket=bucket, Key=parts.path.lstrip("/"), Body=b"tampered")
    out.unlink()
    got = CliRunner().invoke(main, ["blob", "get", uri, "-o", str(out), "-c", str(config)])
    assert got.exit_code == 1 and "sha256 differs" in got.output
    assert not out.exists()


def test_blob_get_reads_a_local_blob_and_a_packed_one(tmp_path: Path) -> None:
    root = tmp_path / "claims"
    store = LocalClaimCheckStore(root, pack_max_blob=1 << 20)
    single = store.put(PDF, kind="attachment").uri
    batch = store.batch()
    packed = batch.put(b"a small raw mail", kind="raw").uri
    batch.commit()
    assert "#offset=" in packed
    config = _config(tmp_path, root.as_uri())

    for uri, want in ((single, PDF), (packed, b"a small raw mail")):
        got = CliRunner().invoke(main, ["blob", "get", uri, "-c", str(config)])
        assert got.exit_code == 0, got.output
        assert got.stdout_bytes == want

    damaged = Path(urlsplit(single).path)
    damaged.write_bytes(b"tampered")
    got = CliRunner().invoke(main, ["blob", "get", single, "-c", str(config)])
    assert got.exit_code == 1 and "does not match its sha256" in got.output
