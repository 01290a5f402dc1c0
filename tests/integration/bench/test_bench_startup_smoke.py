"""``mailtap bench startup`` on a small scale: it runs, and the counts it reads from the source's
log say which path each start took (its times are figures, never asserted)."""

from __future__ import annotations

import pytest

from mailtap.bench import ingest
from mailtap.bench.startup import bench_startup
from mailtap.dev import DevServices


def test_the_startup_bench_tells_the_changelog_start_from_the_full_scan(
    services: DevServices, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ingest.ENV_STATE_DIR, str(services.state_dir))
    figures = bench_startup(json_out=True, other_events=3000, other_accounts=30, rounds=1)
    (changelog,) = figures["restart_changelog"]
    (full_scan,) = figures["restart_full_scan"]
    assert changelog["events_scanned"] == 0
    assert full_scan["events_scanned"] >= 3000 + 6  # everything, its own 6 events included
    # The changelog start read its own partition: its own records and the other accounts'
    # that share it, far fewer than the 3,000 others.
    assert changelog["changelog_records_of_account"] >= 3
    assert changelog["changelog_records_read"] < 3000
    for run in (figures["first_start"], changelog, full_scan):
        assert run["start_to_first_fetch_s"] > 0 and run["index_load_s"] >= 0
    assert figures["full_scan_to_changelog_ratio"] > 0
    # Timed as the image runs: with mailtap's modules compiled ahead, not at every start.
    assert figures["bytecode_compiled_ahead"] is True
