"""``mailtap bench scale`` on a small scale: it runs 1, 2 and 3 instances over 4 mailboxes, every mail
arrives once, a kill orphans mailboxes whose new mails arrive, and so do those of an instance
that leaves cleanly after a new one joined; its times are figures, never asserted."""

from __future__ import annotations

import pytest

from mailtap.bench import ingest
from mailtap.bench.scale import bench_scale
from mailtap.dev import DevServices


def test_the_scale_bench_counts_every_mail_and_a_failover(
    services: DevServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ingest.ENV_STATE_DIR, str(services.state_dir))
    figures = bench_scale(
        json_out=True,
        mailboxes=4,
        instances=(1, 2, 3),
        mails=2,
        session_timeout=6,
        registry=False,  # the registry path is the same with a URL; this keeps the run short
    )
    one, two, three = figures["runs"]
    assert (one["instances"], one["mailboxes"], one["events"]) == (1, 4, 8)
    assert (two["instances"], two["mailboxes"], two["events"]) == (2, 4, 8)
    # The mails the kill and the clean leave of the 2-instance round added are read again
    # (fresh topics), each once.
    assert three["events"] == 8 + two["orphaned_mailboxes"] + two["left_mailboxes"]
    assert three["failover_s_max"] >= three["failover_s_p50"] > 0
    for run in (two, three):  # a joiner took a share; the leaver's mailboxes moved
        assert 1 <= run["left_mailboxes"] <= 4
        assert run["handover_s_max"] >= run["handover_s_p50"] > 0
    assert one["rss_bytes"] > 0 and "failover_s_p50" not in one and "handover_s_p50" not in one
    # The victim owns the most: at least half (every mailbox when all hash to its partitions).
    assert 2 <= two["orphaned_mailboxes"] <= 4
    assert two["failover_s_max"] >= two["failover_s_p50"] > 0
    assert figures["rss_baseline_1_mailbox_mb"] > 0
    assert "rss_mb_per_idle_mailbox" in figures and "failover_meets_target" in figures
    assert "rss_mb_per_mailbox_after_backfill" in figures
    assert figures["startup"].startswith("not run")
    assert figures["schema_registry"] is None  # --no-registry: single-object Avro
