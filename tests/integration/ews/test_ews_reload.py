"""A running `mailtap run ews-source -c FILE` in a group (of one) reloads its accounts on SIGHUP,
against the EWS test server and Kafka: an account added starts publishing, one removed stops,
one whose password was wrong restarts once it is fixed, and a change to another section is named
as needing a restart while the accounts still apply."""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import yaml

from connectors.core.config import KafkaSettings
from tests.ews_server import EwsTestServer
from tests.integration.ews.ews_kafka import read_events, source_config
from tests.support.scaleout import Instance, start_instance, stop_instances

WAIT_S = 120.0


def _wait(condition: Any, what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _mime(account: str, n: int) -> bytes:
    return (
        f"From: Shop <orders@shop.example>\r\nTo: {account}@example.com\r\nSubject: Order {n}\r\n"
        f"Message-ID: <order-{n}-{account}@shop.example>\r\n"
        f"Date: Sun, 29 Nov 2026 16:00:00 +0000\r\nMIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\nOrder number {n}\r\n"
    ).encode()


def _reload(source: Instance, config: dict[str, Any]) -> None:
    content = {**config, "health": {**config["health"], "port": source.health_port}}
    (source.log.parent / f"{source.name}.yaml").write_text(yaml.safe_dump(content))
    source.proc.send_signal(signal.SIGHUP)


def test_sighup_adds_and_removes_ews_accounts_in_a_group(
    ews: EwsTestServer, kafka: KafkaSettings, unique: str, tmp_path: Path
) -> None:
    first, second = f"rx1-{unique}", f"rx2-{unique}"
    config = source_config(kafka, ews, tmp_path / "claims")
    template = config["ews"]["accounts"][0]
    accounts = {}
    for name in (first, second):
        ews.add_mailbox(f"{name}@example.com", "pw")
        accounts[name] = {
            **template,
            "name": name,
            "email": f"{name}@example.com",
            "password": "pw",
        }
    config["ews"]["accounts"] = [accounts[first]]
    config["ews"]["group"] = {
        "id": f"ews-reload-{unique}",
        "work_topic": f"mailtap.ews-work.{unique}",
        "work_partitions": 2,
        "session_timeout_seconds": 6,
    }
    key = "{0}/mid:order-{1}-{0}@shop.example".format
    published = lambda: {k for k, _ in read_events(kafka)}  # noqa: E731 - read_committed

    source = start_instance("ews-source", config, tmp_path, "ews")
    try:
        _wait(lambda: source.owned() == {f"ews/{first}/inbox"}, "the first account running")
        ews.deliver(f"{first}@example.com", _mime(first, 1))
        _wait(lambda: key(first, 1) in published(), "the first account's mail")

        # The second account added with a wrong password, and kafka.partitions changed: the
        # accounts apply, the kafka change is named as waiting for a restart.
        config["ews"]["accounts"] = [accounts[first], {**accounts[second], "password": "wrong"}]
        config["kafka"] = {**config["kafka"], "partitions": 7}
        _reload(source, config)
        _wait(
            lambda: source.health()["states"].get(f"ews/{second}/inbox") == "BACKOFF",
            "the added account refused with the wrong password",
        )
        assert source.owned() == {f"ews/{first}/inbox", f"ews/{second}/inbox"}
        assert "kafka changed, which takes effect only after a restart" in source.log_text()

        # Its password fixed: it restarts with the new one and publishes.
        config["ews"]["accounts"] = [accounts[first], accounts[second]]
        _reload(source, config)
        ews.deliver(f"{second}@example.com", _mime(second, 1))
        _wait(lambda: key(second, 1) in published(), "the added account's mail")

        # The first account removed: its folder stops, its new mail is not published.
        config["ews"]["accounts"] = [accounts[second]]
        _reload(source, config)
        _wait(lambda: source.owned() == {f"ews/{second}/inbox"}, "the removed account stopped")
        ews.deliver(f"{first}@example.com", _mime(first, 2))
        ews.deliver(f"{second}@example.com", _mime(second, 2))
        _wait(lambda: key(second, 2) in published(), "the remaining account's mail")
        time.sleep(2)  # the first account's worker was stopped before its mail arrived
        assert key(first, 2) not in published()
        assert source.alive
    finally:
        stop_instances([source])
    counts = Counter(k for k, _ in read_events(kafka))
    assert set(counts) == {key(first, 1), key(second, 1), key(second, 2)}
    assert all(n == 1 for n in counts.values()), counts
    log = source.log_text()
    assert f"accounts added: {second}; removed: none" in log
    assert f"removed: none; changed (restarted where they run): {second}" in log
    assert f"accounts added: none; removed: {first};" in log
