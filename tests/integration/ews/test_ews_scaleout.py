"""Two Exchange source processes share six mailboxes through a consumer group (ews.group) on the
protocol-faithful EWS test server: each owns some, each mailbox exactly one; after a kill -9 the
survivor takes the orphaned ones over, a folder added with `mailtap mailboxes add` starts in it,
and every mail is on mail.events exactly once."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import yaml
from click.testing import CliRunner

from connectors.core.config import KafkaSettings
from connectors.core.source.ownership.group import by_folder
from mailtap.cli import main
from tests.ews_server import EwsTestServer
from tests.integration.ews.ews_kafka import read_events, source_config
from tests.support.scaleout import (
    Instance,
    names_covering,
    settled,
    start_instance,
    stop_instances,
    wait_until,
)

MAILBOXES = 6
PARTITIONS = 2
WAIT_S = 120.0
T = TypeVar("T")


def _names(unique: str) -> list[str]:
    return names_covering("ews", by_folder, lambda i: f"ex{i}-{unique}", MAILBOXES, PARTITIONS)


def _mime(account: str, n: int) -> bytes:
    return (
        f"From: Shop <orders@shop.example>\r\nTo: {account}@example.com\r\nSubject: Order {n}\r\n"
        f"Message-ID: <order-{n}-{account}@shop.example>\r\n"
        f"Date: Sun, 29 Nov 2026 16:00:00 +0000\r\nMIME-Version: 1.0\r\n"
        f"Content-Type: text/plain; charset=utf-8\r\n\r\nOrder number {n}\r\n"
    ).encode()


def _wait(condition: Callable[[], T], what: str) -> T:
    return wait_until(condition, what, WAIT_S)


def _settled(instances: list[Instance], expected: set[str]) -> dict[str, set[str]]:
    return settled(instances, expected, WAIT_S)


def test_two_ews_instances_split_the_mailboxes_and_one_takes_over_after_a_kill(
    ews: EwsTestServer, kafka: KafkaSettings, unique: str, tmp_path: Path
) -> None:
    names = _names(unique)
    config = source_config(kafka, ews, tmp_path / "claims")
    template = config["ews"]["accounts"][0]
    config["ews"]["accounts"] = []
    for name in names:
        ews.add_mailbox(f"{name}@example.com", "pw")
        config["ews"]["accounts"].append(
            {**template, "name": name, "email": f"{name}@example.com", "password": "pw"}
        )
    config["ews"]["group"] = {
        "id": f"ews-group-{unique}",
        "work_topic": f"mailtap.ews-work.{unique}",
        "work_partitions": PARTITIONS,
        "session_timeout_seconds": 6,
    }
    expected = {f"ews/{n}/inbox" for n in names}
    instances = [start_instance("ews-source", config, tmp_path, f"e{n}") for n in range(2)]
    try:
        owned = _settled(instances, expected)
        print(f"\nsplit: { {k: sorted(v) for k, v in owned.items()} }")
        for name in names:
            ews.deliver(f"{name}@example.com", _mime(name, 1))
        keys = {f"{n}/mid:order-1-{n}@shop.example" for n in names}
        _wait(lambda: keys <= {k for k, _ in read_events(kafka)}, "the first mails")

        victim = instances[0]
        victim.proc.kill()
        killed_at = time.monotonic()
        victim.proc.wait(10)
        owned = _settled(instances, expected)
        assert owned == {"e1": expected}
        for name in names:
            ews.deliver(f"{name}@example.com", _mime(name, 2))
        keys |= {f"{n}/mid:order-2-{n}@shop.example" for n in names}
        _wait(lambda: keys <= {k for k, _ in read_events(kafka)}, "the mails after the kill")
        print(f"kill -9 -> every mailbox published again: {time.monotonic() - killed_at:.1f}s")

        # A folder added at runtime (the mailboxes topic) starts in the running survivor.
        path = tmp_path / "cli.yaml"
        path.write_text(yaml.safe_dump(config))
        added = CliRunner().invoke(
            main, ["mailboxes", "add", "ews", names[0], "junkemail", "-c", str(path)]
        )
        assert added.exit_code == 0, added.output
        expected.add(f"ews/{names[0]}/junkemail")
        _settled(instances, expected)
        ews.deliver(f"{names[0]}@example.com", _mime(names[0], 3), folder="junkemail")
        keys.add(f"{names[0]}/mid:order-3-{names[0]}@shop.example")
        _wait(lambda: keys <= {k for k, _ in read_events(kafka)}, "the junk mail")
    finally:
        stop_instances(instances)
    counts = Counter(k for k, _ in read_events(kafka))
    assert set(counts) == keys
    assert all(n == 1 for n in counts.values()), counts
