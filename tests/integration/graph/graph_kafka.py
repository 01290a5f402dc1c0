"""Helpers of the Graph source tests: the config they run with, mails, the keys to expect.

The read_committed readers are the Exchange tests' (tests/integration/ews/ews_kafka.py): they
wait for open transactions to settle before they read.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from connectors.core.config import KafkaSettings
from connectors.core.mail import parse_mail
from tests.graph_server import GraphTestServer
from tests.graph_server.fixture import CLIENT_ID, CLIENT_SECRET, USER
from tests.integration.ews.ews_kafka import read_events, read_topic

__all__ = ["ACCOUNT", "USER", "imap_key", "mime", "read_events", "read_topic", "source_config"]

ACCOUNT = "ops"


def source_config(
    kafka: KafkaSettings, graph: GraphTestServer, claims: Path, **overrides: Any
) -> dict[str, Any]:
    account = {"name": ACCOUNT, "user": USER, "start": "all"}
    account.update(overrides.pop("account", {}))
    section = {
        "tenant_id": graph.authority.rsplit("/", 1)[1],
        "client_id": CLIENT_ID,
        "client_secret": CLIENT_SECRET,
        "authority_host": graph.authority.rsplit("/", 1)[0],
        "api_base": graph.graph_url,
        "ca_file": str(graph.ca_file),
        "accounts": [account],
        "sweep_interval_seconds": 0.5,
        "backoff_initial_seconds": 0.1,
        "backoff_cap_seconds": 1.0,
        **overrides,
    }
    return {
        "kafka": kafka.model_dump(mode="json"),
        "claim_check": {"url": claims.as_uri()},
        "health": {"port": 0},
        "graph": section,
    }


def mime(n: int, *, message_id: bool = True) -> bytes:
    mid = f"Message-ID: <order-{n}@shop.example>\r\n" if message_id else ""
    return (
        f"From: Shop <orders@shop.example>\r\nTo: {USER}\r\nSubject: Order {n}\r\n{mid}"
        f"Date: Sun, 29 Nov 2026 16:00:00 +0000\r\nMIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\nOrder number {n}\r\n"
    ).encode()


def imap_key(raw: bytes) -> str:
    """The key the IMAP source gives the same MIME (same shared parser, IMAP coordinates)."""
    source = {"kind": "IMAP", "folder": "INBOX", "uidvalidity": 1, "uid": 1}
    return parse_mail(
        raw,
        account=ACCOUNT,
        source=source,
        flags=[],
        internal_date=None,
        observed_at=dt.datetime.now(dt.UTC),
    ).key
