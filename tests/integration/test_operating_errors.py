"""Operating mailtap when Kafka is not there (issue 13): each component, run as a process the way a
user runs it, against a closed loopback port.

- SIGTERM while a component waits for Kafka ends it promptly, with a log line saying so and no
  traceback (before: it waited out librdkafka's 15-90 s timeouts).
- 25 s without Kafka is a handful of log lines per component, all through the logging system
  (before: ~580 raw ``%3|...|FAIL|`` lines from librdkafka on stderr, outside ``--log-format json``).
- ``consume`` without Kafka says which setting to check instead of a ``cimpl.KafkaException``.
- The streams worker's faust logs are JSON lines too under ``--log-format json``.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from connectors.core.config import KafkaSettings, TopicNames
from connectors.core.kafka.topics import ensure_topics

COMPONENTS = ("imap-source", "ews-source", "smtp-sink", "streams")
#: Well before what the old code needed after a SIGTERM in this state (15-90 s), far above the
#: 2 s the components need, so a loaded machine does not make the test flaky.
EXIT_WITHIN_S = 10.0
#: What 25 s without Kafka may produce per component (issue 13: fewer than 20).
MAX_LINES = 20


@pytest.fixture
def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def config(tmp_path: Path, closed_port: int) -> Path:
    """Every component's section; Kafka at the closed port (the mail servers are never reached:
    every component waits for Kafka first)."""
    path = tmp_path / "mailtap.yaml"
    path.write_text(
        f"""
kafka:
  bootstrap_servers: 127.0.0.1:{closed_port}
claim_check:
  url: file://{tmp_path}/claims
health:
  port: 0
imap:
  accounts:
  - name: acct
    host: 127.0.0.1
    port: {closed_port}
    security: plain
    username: u@example.com
    password: pw
    folders: [INBOX]
ews:
  accounts:
  - name: ex
    service_endpoint: http://127.0.0.1:{closed_port}/EWS/Exchange.asmx
    email: u@example.com
    auth: basic
    username: u
    password: pw
smtp:
  host: 127.0.0.1
  port: {closed_port}
  security: plain
  from_address: mailtap@example.com
streams:
  app_id: ops-test
  from_address:
    address: helpdesk@example.com
"""
    )
    return path


def _env() -> dict[str, str]:
    # The suite's own Kafka must not replace the closed port; no log settings from outside.
    dropped = ("MAILTAP_KAFKA_BOOTSTRAP", "MAILTAP_LOG_LEVEL", "MAILTAP_LOG_FORMAT")
    return {
        name: value
        for name, value in os.environ.items()
        if name not in dropped and not name.startswith("MAILTAP__")
    }


class Component:
    """``mailtap --log-format json run COMPONENT -c CONFIG`` with its stderr collected."""

    def __init__(self, name: str, config: Path, *options: str) -> None:
        self.name = name
        command = [sys.executable, "-m", "mailtap.cli", "--log-format", "json", *options]
        self.process = subprocess.Popen(
            [*command, "run", name, "-c", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.lines.append(line.rstrip("\n"))

    def wait_for_kafka_warning(self, timeout: float = 120.0) -> None:
        """Until the component logged that Kafka refuses connections: it is waiting for Kafka."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any("Connection refused" in line for line in self.lines):
                return
            if self.process.poll() is not None:
                pytest.fail(f"{self.name} ended early: {self.lines}")
            time.sleep(0.1)
        pytest.fail(f"{self.name} never reported the refused connection: {self.lines}")

    def terminate(self) -> float:
        """SIGTERM; returns how long the process took to end (killed after 60 s)."""
        started = time.monotonic()
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._reader.join(10)
        return time.monotonic() - started

    def records(self) -> list[dict[str, object]]:
        """Every stderr line as a JSON log record (fails on a line that is not one)."""
        out = []
        for line in self.lines:
            try:
                out.append(json.loads(line))
            except ValueError:
                pytest.fail(f"{self.name}: a stderr line outside the logging system: {line!r}")
        return out


@pytest.fixture
def components(config: Path) -> Iterator[list[Component]]:
    started: list[Component] = []
    try:
        yield started
    finally:
        for component in started:
            if component.process.poll() is None:
                component.process.kill()
                component.process.wait()


def _start_all(components: list[Component], config: Path, *options: str) -> None:
    # All four at once: they wait for Kafka in parallel, so the test takes one wait, not four.
    components.extend(Component(name, config, *options) for name in COMPONENTS)


def test_sigterm_while_waiting_for_kafka_stops_every_component_promptly(
    components: list[Component], config: Path
) -> None:
    _start_all(components, config, "-v")  # -v: the INFO line that says the component stopped
    took = {}
    for component in components:
        # Each one as soon as it waits for Kafka: streams takes seconds longer to import, and
        # the others would reach their 30 s start-up limit meanwhile on a loaded machine.
        component.wait_for_kafka_warning()
        took[component.name] = component.terminate()
    print("exit after SIGTERM:", {name: f"{s:.1f}s" for name, s in took.items()})
    for component in components:
        text = "\n".join(component.lines)
        assert took[component.name] < EXIT_WITHIN_S, (component.name, took, text)
        assert component.process.returncode == 0, (component.name, text)
        assert "Traceback" not in text
        own = [str(r["message"]) for r in component.records() if r["logger"] != "librdkafka"]
        assert any("stop" in message for message in own[-3:]), own


def test_25s_without_kafka_is_a_few_json_log_lines_per_component(
    components: list[Component], config: Path
) -> None:
    _start_all(components, config)
    time.sleep(25)
    streams = next(c for c in components if c.name == "streams")
    # streams gives up after its 15 s start-up wait (counted from when faust is imported, which
    # takes seconds on a loaded machine): let it get there.
    streams.process.wait(90)
    for component in components:
        component.terminate()
    counts = {c.name: len(c.lines) for c in components}
    print("log lines in 25 s without Kafka:", counts)
    for component in components:
        records = component.records()  # every line is JSON: nothing bypassed the logging system
        assert 0 < len(records) < MAX_LINES, (component.name, component.lines)
        assert "Traceback" not in "\n".join(component.lines)
        refused = [r for r in records if "Connection refused" in str(r["message"])]
        assert refused and all(r["logger"] == "librdkafka" for r in refused)
        assert all(r["level"] in ("WARNING", "ERROR", "INFO") for r in refused)
    # ... with the sentence that says what to check.
    (error,) = [r for r in streams.records() if r["level"] == "ERROR"]
    assert "cannot reach Kafka at 127.0.0.1:" in str(error["message"])
    assert "check kafka.bootstrap_servers" in str(error["message"])
    assert streams.process.returncode == 1


def test_consume_without_kafka_names_the_setting_to_check(config: Path, closed_port: int) -> None:
    command = [sys.executable, "-m", "mailtap.cli", "consume", "mail.events", "--from-beginning"]
    result = subprocess.run(
        [*command, "-c", str(config)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert result.returncode == 1, result.stderr
    assert f"Error: cannot reach Kafka at 127.0.0.1:{closed_port}" in result.stderr
    assert "check kafka.bootstrap_servers (or MAILTAP_KAFKA_BOOTSTRAP)" in result.stderr
    assert "Traceback" not in result.stderr and "KafkaException" not in result.stderr
    assert "%3|" not in result.stderr  # librdkafka's own stderr lines


def test_streams_logs_are_json_lines_under_log_format_json(
    services: Any, unique: str, tmp_path: Path
) -> None:
    """faust set up its own text handler at INFO over the CLI's (before: ``[2026-...] [pid] [INFO]
    [^Worker]: Starting...`` lines in ``--log-format json``)."""
    names = {f: f"{getattr(TopicNames(), f)}.{unique}" for f in TopicNames.model_fields}
    kafka = KafkaSettings(
        bootstrap_servers=services.kafka.bootstrap_servers, topics=TopicNames(**names)
    )
    ensure_topics(kafka, retry_tiers=["1m"])
    config = tmp_path / "mailtap.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "kafka": {
                    "bootstrap_servers": kafka.bootstrap_servers,
                    "topics": kafka.topics.model_dump(),
                },
                "claim_check": {"url": (tmp_path / "claims").as_uri()},
                "streams": {
                    "app_id": f"ops-json-{unique}",
                    # A path whose parent does not exist: faust alone fails on it.
                    "data_dir": str(tmp_path / "state" / "streams"),
                    "from_address": {"address": "help@example.com"},
                },
            }
        )
    )
    worker = Component("streams", config, "-v")
    try:
        deadline = time.monotonic() + 180
        while not any("Worker ready" in line for line in worker.lines):
            assert worker.process.poll() is None, worker.lines
            assert time.monotonic() < deadline, worker.lines
            time.sleep(0.2)
        took = worker.terminate()
    finally:
        if worker.process.poll() is None:
            worker.process.kill()
            worker.process.wait()
    print(f"streams: {len(worker.lines)} lines, exit {took:.1f}s after SIGTERM")
    records = worker.records()  # fails on any line that is not a JSON log record
    assert any(r["logger"] == "faust.worker" for r in records)
    assert worker.process.returncode == 0, worker.lines
    assert took < EXIT_WITHIN_S
