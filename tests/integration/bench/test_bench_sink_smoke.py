"""``mailtap bench sink`` on a small scale against the test session's services: it runs on its
own topics, every command it sends ends SENT (else the bench raises), and it reports its
baseline, its ratio and its transactions (figures, never asserted as speeds)."""

from __future__ import annotations

import pytest

from mailtap.bench import ingest
from mailtap.bench.sink import TARGET_RATIO, bench_sink
from mailtap.dev import DevServices


def test_the_sink_bench_reports_its_baseline_ratio_and_transactions(
    services: DevServices, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ingest.ENV_STATE_DIR, str(services.state_dir))
    figures = bench_sink(json_out=True, messages=40, rounds=1)
    assert figures["raw_aiosmtplib_msgs_per_s"] > 0 and figures["sink_end_to_end_msgs_per_s"] > 0
    assert figures["ratio"] == pytest.approx(
        figures["sink_end_to_end_msgs_per_s"] / figures["raw_aiosmtplib_msgs_per_s"], rel=0.01
    )
    # 41 commands (the warm-up's included), at most pool_size in INTENT per transaction: at
    # least 41 / 4 rounds plus the last, and never more than two per command.
    assert 41 / figures["pool_size"] <= figures["sink_transactions"] <= 2 * 41
    assert figures["sink_transactions_per_message"] == round(figures["sink_transactions"] / 41, 3)
    printed = capsys.readouterr().err
    assert "raw aiosmtplib, one reused connection" in printed
    assert f"(target >= {TARGET_RATIO:.0%})" in printed
