"""Two Graph source processes share six mailboxes through a consumer group (graph.group; units
placed by account): each mailbox is owned by exactly one; after a kill -9 the survivor takes
the orphaned ones over, a folder added with `mailtap mailboxes add` starts in it, and every
mail is on mail.events exactly once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import yaml
from click.testing import CliRunner

from connectors.core.config import KafkaSettings
from connectors.core.source.ownership.group import by_account
from mailtap.cli import main
from tests.graph_server import GraphTestServer
from tests.integration.graph.graph_kafka import read_events, source_config
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
    return names_covering("graph", by_account, lambda i: f"gr{i}-{unique}", MAILBOXES, PARTITIONS)


def _mime(account: str, n: int) -> bytes:
    return (
        f"From: Shop <orders@shop.example>\r\nTo: {account}@example.com\r\nSubject: Order {n}\r\n"
        f"Message-ID: <order-{n}-{account}@shop.example>\r\n"
        f"Date: Sun, 29 Nov 2026 16:00:00 +0000\r\n\r\nOrder number {n}\r\n"
    ).encode()


def _wait(condition: Callable[[], T], what: str) -> T:
    return wait_until(condition, what, WAIT_S)


def _settled(instances: list[Instance], expected: set[str]) -> dict[str, set[str]]:
    return settled(instances, expected, WAIT_S)


def test_two_graph_instances_split_the_mailboxes_and_one_takes_over_after_a_kill(
    graph_server: GraphTestServer, kafka: KafkaSettings, unique: str, tmp_path: Path
) -> None:
    names = _names(unique)
    config: dict[str, Any] = source_config(kafka, graph_server, tmp_path / "claims")
    config["graph"]["accounts"] = []
    for name in names:
        graph_server.add_mailbox(f"{name}@example.com")
        config["graph"]["accounts"].append(
            {"name": name, "user": f"{name}@example.com", "start": "all"}
        )
    config["graph"]["group"] = {
        "id": f"graph-group-{unique}",
        "work_topic": f"mailtap.graph-work.{unique}",
        "work_partitions": PARTITIONS,
        "session_timeout_seconds": 6,
    }
    expected = {f"graph/{n}/inbox" for n in names}
    instances = [start_instance("graph-source", config, tmp_path, f"g{n}") for n in range(2)]
    try:
        _settled(instances, expected)
        for name in names:
            graph_server.add_message(f"{name}@example.com", _mime(name, 1))
        keys = {f"{n}/mid:order-1-{n}@shop.example" for n in names}
        _wait(lambda: keys <= {k for k, _ in read_events(kafka)}, "the first mails")

        victim = instances[0]
        victim.proc.kill()
        victim.proc.wait(10)
        assert _settled(instances, expected) == {"g1": expected}
        for name in names:
            graph_server.add_message(f"{name}@example.com", _mime(name, 2))
        keys |= {f"{n}/mid:order-2-{n}@shop.example" for n in names}
        _wait(lambda: keys <= {k for k, _ in read_events(kafka)}, "the mails after the kill")

        # A folder added at runtime (the mailboxes topic) starts in the running survivor.
        path = tmp_path / "cli.yaml"
        path.write_text(yaml.safe_dump(config))
        added = CliRunner().invoke(
            main, ["mailboxes", "add", "graph", names[0], "archive", "-c", str(path)]
        )
        assert added.exit_code == 0, added.output
        expected.add(f"graph/{names[0]}/archive")
        _settled(instances, expected)
        graph_server.add_message(f"{names[0]}@example.com", _mime(names[0], 3), folder="archive")
        keys.add(f"{names[0]}/mid:order-3-{names[0]}@shop.example")
        _wait(lambda: keys <= {k for k, _ in read_events(kafka)}, "the archived mail")
    finally:
        stop_instances(instances)
    counts = Counter(k for k, _ in read_events(kafka))
    assert set(counts) == keys
    assert all(n == 1 for n in counts.values()), counts
