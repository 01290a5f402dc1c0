"""``mailtap bench ingest`` on a tiny mailbox, in every CI run: the source publishes every mail,
the naive poller (imapclient FETCH -> producer) polls every mail, and the CPU per mail of both
is printed into the CI log so a regression is seen. Time is never asserted (a shared machine);
what is asserted is that the figures exist and were counted."""

from __future__ import annotations

import pytest

from mailtap.bench import ingest
from mailtap.dev import DevServices

#: Several FETCH batches (200 each), so that events arrive over time and CPU per mail is counted.
MAILS = 1000


@pytest.mark.timeout(600)  # a hang guard: three baselines and a source start on a busy machine
def test_a_tiny_ingest_bench_counts_every_mail_and_prints_cpu_per_mail(
    services: DevServices, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv(ingest.ENV_STATE_DIR, str(services.state_dir))
    monkeypatch.setattr(ingest, "IDLE_SAMPLES", 3)  # seconds each; the new-mail path, not its p99
    figures = ingest.bench_ingest(json_out=True, mails=MAILS, rounds=1, warm_up_s=0)
    (round_,) = figures["rounds"]
    assert figures["raw_fetched"] == MAILS
    assert figures["naive_poller_mails_per_s"] > 0 and round_["ingest_mails_per_s"] > 0
    naive = figures["naive_poller_cpu_us_per_mail"]
    assert naive["client"] > 0 and naive["total"] >= naive["client"]
    # Counted once a tenth of the mails is on Kafka, in clock ticks: a part may show 0.0.
    cpu = figures["ingest_cpu_us_per_mail"]
    assert set(cpu) == {"source", "parse_processes", "kafka", "dovecot", "total"}
    assert min(cpu.values()) >= 0
    assert cpu["total"] == pytest.approx(sum(v for k, v in cpu.items() if k != "total"), abs=0.5)
    assert figures["ingest_to_naive_ratio"] > 0
    # New mail after the backfill arrived too, every one within the sample's 30 s (a mail IDLE
    # did not announce waits 10 s at most, for the light sync).
    assert figures["idle_samples"] == 3 and "new_mail_missed" not in figures
    # Spawn -> first event comes before the last one (issue 29's "first event <= 1 s" figure).
    assert 0 < figures["first_event_s"] < figures["ingest_wall_seconds_incl_startup"]
    assert figures["first_event_s_range"] == [round_["first_event_s"]] * 2
    with capsys.disabled():
        print(
            f"\n[bench ingest, {MAILS} mails] {ingest._cpu_line(figures)}; "
            f"first event {figures['first_event_s']} s after the source's spawn"
        )
