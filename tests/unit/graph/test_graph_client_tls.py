"""Every mailbox's Graph client shares one TLS context per CA file: a context holds its own
copy of the loaded CA store, and one per mailbox was most of an idle mailbox's memory
(`mailtap bench graph`, RSS per idle mailbox)."""

from __future__ import annotations

import ssl
from pathlib import Path

from connectors.graph.auth import TokenSource
from connectors.graph.client import GraphClient, tls_context
from connectors.graph.config import GraphSourceSettings
from connectors.graph.gate import MailboxGate

CA = Path(ssl.get_default_verify_paths().openssl_cafile)


def settings(ca_file: str | None) -> GraphSourceSettings:
    return GraphSourceSettings.model_validate(
        {
            "tenant_id": "contoso",
            "client_id": "c",
            "client_secret": "s",
            "ca_file": ca_file,
            "accounts": [
                {"name": "a", "user": "a@contoso.com"},
                {"name": "b", "user": "b@contoso.com"},
            ],
        }
    )


def contexts(cfg: GraphSourceSettings) -> list[ssl.SSLContext]:
    tokens = TokenSource(cfg)
    clients = [GraphClient(cfg, a.user, tokens, MailboxGate(4)) for a in cfg.accounts]
    try:
        return [c._http._transport._pool._ssl_context for c in clients]  # type: ignore[attr-defined]
    finally:
        for client in clients:
            client.close()


def test_the_mailboxes_of_a_process_share_one_context_per_ca_file() -> None:
    with_ca = contexts(settings(str(CA)))
    assert with_ca[0] is with_ca[1] is tls_context(str(CA))
    system = contexts(settings(None))
    assert system[0] is system[1] is tls_context(None)
    assert system[0] is not with_ca[0]
    assert system[0].verify_mode == ssl.CERT_REQUIRED and system[0].check_hostname
