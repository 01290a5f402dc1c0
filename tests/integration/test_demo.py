"""`mailtap demo` on the default config, the way a user runs it: its own services in their own
state dir (Kafka, the schema registry, Dovecot, SMTP), the Confluent wire format on every topic,
nothing in the dead-letter topic, and the registry subjects at the configured compatibility."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from connectors.core.avro.serde import CONFLUENT_MAGIC
from connectors.core.config import load_config
from connectors.core.kafka.clients import consumer_config
from mailtap.dev import down, registry, up
from mailtap.dev.layout import REPO_ROOT
from mailtap.dev.process import group_members

pytestmark = pytest.mark.skipif(
    not registry.is_installed(), reason="registry not built: `make registry`"
)

#: A hang guard for the whole demo (five stages of up to 120 s each), not an expectation.
DEMO_TIMEOUT_S = 900


def _get_json(url: str) -> object:
    with urllib.request.urlopen(url, timeout=30) as response:
        return json.load(response)


def test_the_demo_runs_on_the_registry_and_nothing_reaches_the_dlq(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MAILTAP_DEV_REGISTRY", raising=False)
    monkeypatch.delenv("MAILTAP_KAFKA_BOOTSTRAP", raising=False)  # its own Kafka: default topics
    state_dir = Path(tempfile.mkdtemp(prefix="mailtap-test-demo-"))
    state_dir.chmod(0o755)  # Dovecot's unprivileged mail processes reach the maildirs
    info = up(state_dir)  # the demo reuses them, so they outlive it for the checks below
    try:
        assert info.registry is not None
        result = subprocess.run(
            [sys.executable, "-m", "mailtap.cli", "demo", "--state-dir", str(state_dir)],
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            capture_output=True,
            text=True,
            timeout=DEMO_TIMEOUT_S,
            check=False,
        )
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
        assert "every mail took the right path" in result.stdout

        kafka = load_config(info.config_path).kafka
        assert kafka.schema_registry_url == info.registry.url
        topics = kafka.topics
        consumer = Consumer(consumer_config(kafka, "demo-test-checks"))
        try:
            dlq = consumer.list_topics(topics.dlq, timeout=30).topics[topics.dlq]
            assert dlq.error is None and dlq.partitions
            for partition in dlq.partitions:
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topics.dlq, partition), timeout=30
                )
                assert high == 0, f"{topics.dlq}[{partition}] holds {high - low} dead letters"
            # Every record the demo wrote carries the Confluent framing (0x00 + schema id).
            consumer.assign([TopicPartition(topics.events, p, 0) for p in range(kafka.partitions)])
            first = None
            while first is None:
                msg = consumer.poll(30)
                assert msg is not None, f"no record on {topics.events}"
                if msg.error() is None and msg.value() is not None:
                    first = msg.value()
            assert first[:1] == CONFLUENT_MAGIC
        finally:
            consumer.close()

        url = info.registry.url
        for topic in (topics.events, topics.commands, topics.delivery, topics.workflow):
            for subject in (f"{topic}-key", f"{topic}-value"):
                assert _get_json(f"{url}/config/{subject}") == {
                    "compatibilityLevel": kafka.schema_compatibility
                }, subject
        assert kafka.schema_compatibility == "FULL_TRANSITIVE"
    finally:
        down(state_dir)
        shutil.rmtree(state_dir, ignore_errors=True)
    assert {pid: group_members(pid) for pid in info.pids} == {pid: [] for pid in info.pids}
