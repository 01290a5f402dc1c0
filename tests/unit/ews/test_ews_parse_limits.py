"""The ``ews.limits`` caps reach the parser of every folder, as ``imap.limits`` do for IMAP."""

from __future__ import annotations

import datetime as dt
import threading
from pathlib import Path

from connectors.core.avro.serde import AvroSerde
from connectors.core.config import config_from_dict
from connectors.ews.connection import FetchedItem
from connectors.ews.source import EwsSource

BODY = "0123456789" * 100


def _source(tmp_path: Path, limits: dict[str, int]) -> EwsSource:
    account = {
        "name": "ops",
        "service_endpoint": "https://mail.example.com/EWS/Exchange.asmx",
        "email": "ops@example.com",
        "username": "EXAMPLE\\ops",
        "password": "pw",
    }
    cfg = config_from_dict(
        {
            "kafka": {"bootstrap_servers": "127.0.0.1:9092"},
            "claim_check": {"url": f"file://{tmp_path}"},
            "ews": {"accounts": [account], "limits": limits},
        }
    )
    return EwsSource.from_config(cfg, serve_health=False)


def _text_body(source: EwsSource) -> str:
    account = source.settings.accounts[0]
    worker = source._worker(account, "inbox", threading.Event())
    mime = (
        b"From: a@example.com\r\nTo: ops@example.com\r\nSubject: s\r\nMessage-ID: <m@x>\r\n"
        b"Content-Type: text/plain\r\n\r\n" + BODY.encode()
    )
    item = FetchedItem("id-1", "ck-1", mime, dt.datetime(2026, 12, 1, tzinfo=dt.UTC))
    built = worker.builder.build(item)
    value = built.records[0].value
    assert value is not None
    return str(AvroSerde.for_schema("MailEvent").decode(value)["text_body"])


def test_the_body_cap_of_the_ews_section_applies(tmp_path: Path) -> None:
    assert _text_body(_source(tmp_path, {})) == BODY  # the parser's default keeps it whole
    assert len(_text_body(_source(tmp_path, {"max_body_bytes": 100}))) <= 100
