"""A single-node Apache Kafka (KRaft, combined broker + controller) from the Maven-resolved jars."""

from __future__ import annotations

import base64
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mailtap.dev import process
from mailtap.dev.errors import ServiceStartError
from mailtap.dev.layout import kafka_libs, render_template

#: A cold JVM plus storage recovery takes 2-5 s here; a loaded shared 2-core CI box, much more.
START_TIMEOUT_S = 120.0
#: The transactional id and consumer group of :func:`make_coordinators` (no topic of that name).
COORDINATORS_PROBE = "mailtap-dev-coordinators"
JVM_OPTS = ("-Xmx512m", "-Xms128m", "-XX:+UseG1GC", "-Djava.awt.headless=true")


@dataclass(frozen=True)
class KafkaLayout:
    """Files of one broker inside the state directory."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / "server.properties"

    @property
    def log4j_config(self) -> Path:
        return self.root / "log4j2.properties"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def server_log(self) -> Path:
        return self.root / "server.log"

    @property
    def authorizer_log(self) -> Path:
        """Denied operations of the secured broker (``kafka.authorizer.logger``)."""
        return self.root / "authorizer.log"

    @property
    def stdout_log(self) -> Path:
        return self.root / "stdout.log"

    @property
    def ports_file(self) -> Path:
        return self.root / "ports"


def _classpath() -> str:
    libs = kafka_libs()
    if not any(libs.glob("kafka_2.13-*.jar")):
        raise ServiceStartError(
            f"kafka: no Kafka jars in {libs}; run `make venv` (deploy/bootstrap.sh) to fetch them"
        )
    return f"{libs}/*"


def cluster_id() -> str:
    """A random cluster id in Kafka's Uuid text form (URL-safe base64 of 16 bytes, unpadded).

    Never starting with "-", as Kafka's own ``Uuid.randomUuid()`` ensures: the storage tool's
    argument parser would take such an id for an option ("--cluster-id: expected one argument").
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def render(layout: KafkaLayout, host: str, broker_port: int, controller_port: int) -> None:
    layout.root.mkdir(parents=True, exist_ok=True)
    values = {
        "host": host,
        "broker_port": str(broker_port),
        "controller_port": str(controller_port),
        "data_dir": str(layout.data_dir),
    }
    layout.config.write_text(render_template("kafka/server.properties.tmpl", values))
    layout.log4j_config.write_text(
        render_template("kafka/log4j2.properties.tmpl", {"log_path": str(layout.server_log)})
    )


def _log4j_opt(layout: KafkaLayout) -> str:
    return f"-Dlog4j2.configurationFile={layout.log4j_config}"


def prepare_storage(
    layout: KafkaLayout,
    broker_port: int,
    controller_port: int,
    extra_format_args: Sequence[str] = (),
    marker: str = "",
) -> None:
    """Format the log directory unless it holds data written with these same ports (and
    ``marker``, which names what ``extra_format_args`` put into the data, e.g. SCRAM users).

    The KRaft voter set recorded at format time names the controller endpoint, so data formatted
    for other ports is wiped and formatted again rather than reused.
    """
    ports = f"{broker_port} {controller_port}" + (f" {marker}" if marker else "")
    formatted = (layout.data_dir / "meta.properties").exists()
    if formatted and layout.ports_file.exists() and layout.ports_file.read_text() == ports:
        return
    shutil.rmtree(layout.data_dir, ignore_errors=True)
    argv = [
        process.java("kafka"),
        "-Xmx256m",
        _log4j_opt(layout),
        "-cp",
        _classpath(),
        "kafka.tools.StorageTool",
        "format",
        "--cluster-id",
        cluster_id(),
        "--config",
        str(layout.config),
        "--standalone",
        *extra_format_args,
    ]
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if result.returncode != 0:
        raise ServiceStartError(
            f"kafka: formatting {layout.data_dir} failed (exit {result.returncode}):\n"
            f"{result.stdout}\n{result.stderr}"
        )
    layout.ports_file.write_text(ports)


def start(layout: KafkaLayout, extra_jvm_options: Sequence[str] = ()) -> int:
    # A private java.io.tmpdir: the broker extracts native codecs (zstd-jni) there on first use.
    # With the shared /tmp, brokers of parallel test sessions and /tmp clean-ups raced on the same
    # extracted .so and a broker failed every zstd batch with UnsatisfiedLinkError.
    tmpdir = layout.root / "tmp"
    tmpdir.mkdir(parents=True, exist_ok=True)
    argv = [
        process.java("kafka"),
        *JVM_OPTS,
        *extra_jvm_options,
        f"-Djava.io.tmpdir={tmpdir}",
        _log4j_opt(layout),
        "-cp",
        _classpath(),
        "kafka.Kafka",
        str(layout.config),
    ]
    return process.spawn(argv, layout.stdout_log, cwd=layout.root)


def probe(bootstrap_servers: str, timeout: float = 2.0) -> None:
    """Raise unless a broker answers a metadata request at ``bootstrap_servers``."""
    host, _, port = bootstrap_servers.split(",")[0].rpartition(":")
    # A plain connect first: librdkafka would log a connection-refused line every 50 ms.
    socket.create_connection((host, int(port)), timeout=timeout).close()
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap_servers, "log_level": 0})
    metadata = admin.list_topics(timeout=timeout)
    if not metadata.brokers:
        raise RuntimeError(f"no broker in the metadata of {bootstrap_servers}")


def wait_ready(layout: KafkaLayout, pid: int, bootstrap_servers: str) -> None:
    process.wait_until_ready(
        "kafka",
        pid,
        lambda: probe(bootstrap_servers),
        [layout.server_log, layout.stdout_log],
        START_TIMEOUT_S,
        interval=0.2,
    )


def make_coordinators(bootstrap_servers: str, timeout: float = START_TIMEOUT_S) -> None:
    """Have a new broker create its transaction and group coordinators now, not at the first
    component's start.

    A broker creates ``__transaction_state`` and ``__consumer_offsets`` (10 partitions each
    here) at their first use and loads them before it answers: the first ``init_transactions``
    on a new broker took 4.5 s here, the next ones 0.3 s at the same load. Without this, that
    wait fell into the first start of whatever came first (issue 29: the ingest bench's smoke
    test, alone on the tests' new broker, printed a first event 9.5 s after the source's
    spawn; 1.4-3.4 s in whole CI runs, where other tests had made them). Run on an existing
    broker, it only finds them.
    """
    from confluent_kafka import Consumer, Producer, TopicPartition

    from connectors.core.kafka.retry import retry_retriable

    deadline = time.monotonic() + timeout
    client = {"bootstrap.servers": bootstrap_servers, "log_level": 0}
    producer = Producer(
        {**client, "transactional.id": COORDINATORS_PROBE, "enable.sparse.connections": False}
    )
    # A coordinator still loading answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS for
    # a moment (seen under load): asked again, it answers.
    retry_retriable(
        lambda: producer.init_transactions(max(0.1, deadline - time.monotonic())),
        deadline,
        "kafka: making the transaction coordinator",
    )
    producer.flush(timeout)
    consumer = Consumer({**client, "group.id": COORDINATORS_PROBE, "enable.auto.commit": False})
    try:
        # Asking the group coordinator for committed offsets makes the broker create it.
        retry_retriable(
            lambda: consumer.committed(
                [TopicPartition(COORDINATORS_PROBE, 0)], max(0.1, deadline - time.monotonic())
            ),
            deadline,
            "kafka: making the group coordinator",
        )
    finally:
        consumer.close()


def set_properties(config: Path, values: dict[str, str]) -> None:
    """Set ``values`` in a rendered ``server.properties``: a key already there gets the new
    value in its place, a new key is appended (one line per key, so the file stays the
    truth a person reads; Java's Properties would let a later duplicate win silently)."""
    pending = dict(values)
    lines = []
    for line in config.read_text().splitlines():
        key = line.split("=", 1)[0].strip() if "=" in line and not line.startswith("#") else None
        if key is not None and key in pending:
            line = f"{key}={pending.pop(key)}"
        lines.append(line)
    lines += [f"{key}={value}" for key, value in pending.items()]
    config.write_text("\n".join(lines) + "\n")
