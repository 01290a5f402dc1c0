"""The IMAP source's TLS contexts: one per CA file, shared by every connection (a server restart
reconnects every mailbox at once; a context per connection held ~0.9 MB of CA store each and
cost milliseconds to build), and a new one once the CA file is rewritten."""

from __future__ import annotations

import os
import shutil
import ssl
from pathlib import Path

import certifi

from connectors.imap.config import ImapAccountSettings
from connectors.imap.session import tls_context


def account(name: str, ca_file: Path | None = None) -> ImapAccountSettings:
    return ImapAccountSettings(  # type: ignore[arg-type]
        name=name,
        host="imap.example.org",
        username="u",
        password="p",
        ca_file=str(ca_file) if ca_file else None,
    )


def test_connections_with_one_ca_file_share_a_context(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    shutil.copy(certifi.where(), ca)
    first = tls_context(account("a", ca), None)
    assert tls_context(account("a", ca), None) is first
    assert tls_context(account("b", ca), None) is first  # another account, the same CA file
    assert first.verify_mode == ssl.CERT_REQUIRED and first.check_hostname
    assert tls_context(account("a"), None) is tls_context(account("c"), None)  # system CAs
    assert tls_context(account("a"), None) is not first


def test_a_rewritten_ca_file_gets_a_new_context(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    shutil.copy(certifi.where(), ca)
    before = tls_context(account("a", ca), None)
    ca.write_bytes(Path(certifi.where()).read_bytes() + b"\n")  # a rotated CA
    os.utime(ca, ns=(ca.stat().st_atime_ns, ca.stat().st_mtime_ns + 1_000_000_000))
    after = tls_context(account("a", ca), None)
    assert after is not before and tls_context(account("a", ca), None) is after


def test_a_given_context_is_used_as_it_is() -> None:
    given = ssl.create_default_context()
    assert tls_context(account("a"), given) is given
