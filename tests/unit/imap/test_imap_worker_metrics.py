"""The mailbox worker's state reaches ``mailtap_source_state``; a fenced worker shows FENCED (not
STOPPED) and makes ``/healthz`` fail with that reason."""

from __future__ import annotations

from connectors.core.kafka.errors import FencedError
from connectors.core.metrics import SourceMetrics
from tests.unit.imap.test_imap_worker import RecordingWriter, filled, make_worker

LABELS = {"source": "imap", "account": "a", "folder": "INBOX"}


def state_of(metrics: SourceMetrics) -> list[str]:
    return [
        s.labels["state"]
        for family in metrics.registry.collect()
        if family.name == "mailtap_source_state"
        for s in family.samples
        if s.value == 1
    ]


def test_a_fenced_worker_reports_fenced_and_health_says_why() -> None:
    metrics = SourceMetrics()
    writer = RecordingWriter()
    writer.fail_next = FencedError("another instance")
    worker, _, _ = make_worker(filled(2), writer=writer, metrics=metrics)
    worker.run()
    assert state_of(metrics) == ["FENCED"]
    ok, detail = metrics.health(600)
    assert not ok and "fenced by another instance" in detail["reason"]


def test_a_worker_that_synced_reports_its_idle_state() -> None:
    metrics = SourceMetrics()
    worker, _, _ = make_worker(filled(2), metrics=metrics)
    worker.run()
    # The fake stops the worker after its idle rounds: the last state is STOPPED, alone.
    assert state_of(metrics) == ["STOPPED"]
    assert metrics.registry.get_sample_value("mailtap_source_mailboxes", {"source": "imap"}) == 1
