"""TLS with certificate verification on by default (DESIGN.md, security rules).

Dovecot runs without TLS here; a TLS-terminating loopback proxy with a trustme certificate for
``localhost`` stands in front of it, like a server on port 993.
"""

from __future__ import annotations

import ssl
from collections.abc import Iterator

import pytest
import trustme

from connectors.core.errors import Disposition, classify
from connectors.imap.state import WorkerState
from tests.integration.imap.imap_harness import ImapHarness, keys_of, running, wait_for
from tests.support.tcp_proxy import TcpProxy


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_proxy(imap: ImapHarness, ca: trustme.CA) -> Iterator[TcpProxy]:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("localhost").configure_cert(context)
    with TcpProxy(imap.host, imap.port, tls=context) as proxy:
        yield proxy


def test_ssl_with_the_right_ca_works(
    imap: ImapHarness, ca: trustme.CA, tls_proxy: TcpProxy
) -> None:
    ca_file = imap.tmp / "ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    ids = imap.append_numbered(3)
    account = {"host": "localhost", "security": "ssl", "ca_file": str(ca_file)}
    with running(imap, port=tls_proxy.port, account=account):
        wait_for(lambda: imap.cursor_at(3), "mails over TLS")
    assert keys_of(imap.events()) == {f"acct/mid:{m}" for m in ids}


@pytest.mark.parametrize(
    ("host", "trust_ca"),
    [("localhost", False), ("127.0.0.1", True)],
    ids=["unknown-ca", "hostname-mismatch"],
)
def test_an_unverifiable_certificate_is_refused_before_login(
    imap: ImapHarness, ca: trustme.CA, tls_proxy: TcpProxy, host: str, trust_ca: bool
) -> None:
    account: dict[str, object] = {"host": host, "security": "ssl"}
    if trust_ca:
        ca_file = imap.tmp / "ca.pem"
        ca.cert_pem.write_to_path(str(ca_file))
        account["ca_file"] = str(ca_file)
    imap.append_numbered(1)
    with running(imap, port=tls_proxy.port, account=account, backoff_cap_seconds=1) as source:
        worker = source.workers[0]
        wait_for(lambda: worker.machine.history.count(WorkerState.BACKOFF) >= 2, "two refusals")
        history = [s.value for s in worker.machine.history]
        # Permanent (a retry cannot fix a certificate): waits the cap, never reaches LOGIN.
        assert "AUTHENTICATING" not in history
        assert worker.backoff.attempt >= 2
        assert classify(worker.last_error) is Disposition.PERMANENT  # type: ignore[arg-type]
        cause = worker.last_error
        while cause is not None and not isinstance(cause, ssl.SSLCertVerificationError):
            cause = cause.__cause__  # type: ignore[assignment]
        assert cause is not None, repr(worker.last_error)
    assert imap.events() == []
