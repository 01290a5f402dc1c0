"""``mailtap bench streams`` on a small scale: one worker and the bare loop each answer every
event written, and the figures are there (its rates are figures, never asserted)."""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from mailtap.bench import ingest
from mailtap.bench.streams import bench_streams, sample_events
from mailtap.dev import DevServices


def test_the_sample_mixes_tickets_approvals_and_mail_the_guards_skip() -> None:
    sample = sample_events("t", 8)
    recipients = [e["to"][0]["address"] for e in sample]
    assert recipients.count("support@example.com") == 6
    assert recipients.count("approvals@example.com") == 2
    assert sum(e["guard_headers"]["auto_submitted"] == "auto-replied" for e in sample) == 2
    assert len({e["key"] for e in sample}) == 8


def test_the_streams_bench_counts_every_event_through_one_worker_and_the_bare_loop(
    services: DevServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ingest.ENV_STATE_DIR, str(services.state_dir))
    figures = bench_streams(json_out=True, events=200, workers=(1,))
    (run,) = figures["runs"]
    assert run["workers"] == 1
    assert run["events_counted"] == 200
    assert figures["bare_events_counted"] == [200]
    # Per 4 events: 2 tickets (an acknowledgement and a workflow event each), an approval
    # request (the forward to the approver, the receipt to the requester, an event), a skipped
    # auto-reply (an event): 8 records. A mail read again publishes nothing (the dedupe table),
    # so anything more would be a command or a status published twice.
    assert run["records_produced"] == 400
    # The clock starts at the first event re-keyed: the reader reads the conversation topic
    # (made after its subscription, it was never read, and the clock started at the first
    # output).
    assert run["events_re_keyed_seen"] > 0
    assert isinstance(run["mails_read_again"], int) and run["mails_read_again"] >= 0
    assert run["events_per_s"] > 0 and figures["bare_aiokafka_events_per_s"][0] > 0
    assert run["ratio_to_bare"] > 0 and run["start_to_first_event_s"] > 0
    # Negative when no answer was seen (0 minus the first event) or the clock started late.
    assert run["first_answer_after_first_event_s"] >= 0
    assert run["cpu_ms_per_event"] > 0 and figures["bare_cpu_ms_per_event"][0] > 0
    assert run["workflows_cpu_ms_per_event"] > 0
    assert figures["scaling"] == {"1": 1.0}
    # A worker restarted on the run's tables reads their changelogs back (a dedupe mark per
    # event at least), then answers the 4 mails written as it starts.
    restart = figures["restart"]
    assert restart["workers_before"] == 1
    assert restart["changelog_records"] >= 200
    assert restart["start_to_answers_s"] > 0
    assert isinstance(figures["one_worker_meets_target"], bool)
    # The run's topics are gone (each left ~50 partitions behind, and a dev broker holding
    # thousands of them from earlier runs took minutes to start).
    (run_id,) = [p.name for p in Path(figures["logs"]).iterdir()]
    admin = AdminClient({"bootstrap.servers": services.bootstrap_servers})
    left = admin.list_topics(timeout=30).topics
    assert [t for t in left if run_id in t] == []
