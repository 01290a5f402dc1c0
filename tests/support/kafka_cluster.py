"""A two-broker KRaft cluster whose partition leaders keep moving, for the retry tests.

Node 1 is broker and controller (the dev single-node config, mailtap/dev/kafka.py), node 2 a
broker only, on the same controller quorum. :class:`LeaderMoves` runs LeaderFlipper.java
(compiled here against the Kafka jars): it reverses the replica order of every partition of the
given topics and runs a preferred-leader election, again and again, so a client that asks the
broker it last knew as leader gets NOT_LEADER_OR_FOLLOWER, as after a broker restart or a
reassignment in production. One broker cannot give that answer on demand: a restarted single
broker answers "Unknown partition" while it loads, not NOT_LEADER (tried here).
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka.admin import AdminClient

from mailtap.dev import kafka, process
from mailtap.dev.layout import kafka_libs, render_template

HOST = "127.0.0.1"
JAVA_DIR = Path(__file__).parent / "java"
#: Two cold JVMs on a loaded 2-core machine.
START_TIMEOUT_S = 180.0


@dataclass
class TwoBrokers:
    root: Path
    ports: dict[str, int]
    pids: list[int] = field(default_factory=list)

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.ports['broker1']},{HOST}:{self.ports['broker2']}"

    def layout(self, node: int) -> kafka.KafkaLayout:
        return kafka.KafkaLayout(self.root / f"node{node}")

    def stop(self) -> None:
        for pid in self.pids:
            process.stop_group(pid)


def _format(layout: kafka.KafkaLayout, cluster_id: str, *extra: str) -> None:
    argv = [
        process.java("kafka"),
        "-Xmx256m",
        f"-Dlog4j2.configurationFile={layout.log4j_config}",
        "-cp",
        f"{kafka_libs()}/*",
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id,
        "--config",
        str(layout.config),
        *extra,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"formatting {layout.data_dir} failed: {result.stdout}{result.stderr}")


def start_two_brokers(root: Path) -> TwoBrokers:
    names = ["broker1", "controller", "broker2"]
    ports: dict[str, int] = {}
    while len(ports) < len(names):
        port = process.free_port(HOST)
        if port not in ports.values():
            ports[names[len(ports)]] = port
    cluster = TwoBrokers(root, ports)
    one, two = cluster.layout(1), cluster.layout(2)
    kafka.render(one, HOST, ports["broker1"], ports["controller"])
    # Two brokers: the internal topics may have two replicas, but one keeps them available
    # while the leader moves (they are not what these tests move).
    two.root.mkdir(parents=True, exist_ok=True)
    settings = one.config.read_text().splitlines()
    replaced = {
        "process.roles": "broker",
        "node.id": "2",
        "listeners": f"PLAINTEXT://{HOST}:{ports['broker2']}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{ports['broker2']}",
        "log.dirs": str(two.data_dir),
    }
    lines = [
        f"{key}={replaced[key]}" if (key := line.partition("=")[0]) in replaced else line
        for line in settings
    ]
    two.config.write_text("\n".join(lines) + "\n")
    two.log4j_config.write_text(
        render_template("kafka/log4j2.properties.tmpl", {"log_path": str(two.server_log)})
    )
    cluster_id = kafka.cluster_id()
    _format(one, cluster_id, "--standalone")
    _format(two, cluster_id, "--no-initial-controllers")
    try:
        for layout in (one, two):
            cluster.pids.append(kafka.start(layout))
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap_servers, "log_level": 0})

        def both_registered() -> None:
            brokers = admin.list_topics(timeout=2).brokers
            if len(brokers) != 2:
                raise RuntimeError(f"{len(brokers)} of 2 brokers registered")

        process.wait_until_ready(
            "kafka (2 brokers)",
            cluster.pids[1],
            both_registered,
            [one.server_log, two.server_log],
            START_TIMEOUT_S,
            interval=0.5,
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def compile_flipper(out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        ["javac", "-cp", f"{kafka_libs()}/*", "-d", str(out), str(JAVA_DIR / "LeaderFlipper.java")],
        check=True,
        capture_output=True,
        timeout=180,
    )
    return out


class LeaderMoves:
    """LeaderFlipper.java moving the leaders of ``topics`` every ``pause_ms``; counts the moves."""

    def __init__(
        self, classes: Path, bootstrap_servers: str, topics: list[str], pause_ms: int = 300
    ) -> None:
        self.moves = 0
        self.output: list[str] = []
        self._process = subprocess.Popen(
            [
                process.java("kafka"),
                "-Xmx128m",
                "-cp",
                f"{kafka_libs()}/*:{classes}",
                "LeaderFlipper",
                bootstrap_servers,
                str(pause_ms),
                *topics,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            self.output.append(line.rstrip())
            if line.startswith("moved the leaders"):
                self.moves += 1

    def wait_for_moves(self, count: int, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while self.moves < count:
            if self._process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("LeaderFlipper did not move leaders:\n" + "\n".join(self.output))
            time.sleep(0.1)

    def stop(self) -> None:
        if self._process.poll() is None:
            assert self._process.stdin is not None
            self._process.stdin.close()  # LeaderFlipper exits when its stdin closes
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self._process.pid, signal.SIGKILL)
                self._process.wait(10)
        self._reader.join(5)
