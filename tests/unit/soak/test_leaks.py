"""The soak's leak rule: RSS and fd slopes per instance life, after the warm-up, over a window
long enough to judge; a restart starts a new life (its RSS drop is no negative slope); a source
taking mailboxes over steps up without a slope, a leak inside the spans between is still one."""

from __future__ import annotations

from mailtap.soak.monitor import Sample, work_units
from mailtap.soak.report import SETTLE_S, _within_slope, leak_figures

MB = 2**20


def sample(i: int, name: str, rss_mb: float, fds: int, owned: int | None = None) -> Sample:
    """The i-th sample (one every 5 s) of one instance in its first life."""
    return Sample(
        at=i * 5.0,
        events=i,
        commands=i,
        deliveries=i,
        lag_s=0.0,
        rss={name: int(rss_mb * MB)},
        fds={name: fds},
        lives={name: 1},
        owned={} if owned is None else {name: owned},
    )


def samples(rss_mb_per_min: float, fds_per_min: float, minutes: int = 12) -> list[Sample]:
    return [
        sample(
            i, "streams-1", 100 + rss_mb_per_min * i * 5 / 60, int(40 + fds_per_min * i * 5 / 60)
        )
        for i in range(minutes * 12)
    ]


def test_slope_is_per_minute_and_ignores_the_offset_between_spans() -> None:
    assert _within_slope([[(0, 0.0), (60, 2.0), (120, 4.0)]]) == 2.0
    assert _within_slope([[(0, 0.0), (60, 2.0)], [(120, 50.0), (180, 52.0)]]) == 2.0
    assert _within_slope([[(0, 1.0)]]) is None


def test_flat_memory_is_no_leak() -> None:
    figures = leak_figures(samples(0.0, 0.0))
    assert figures["judged_lives"] == 1
    assert figures["leaks"] == []
    assert figures["per_life"][0]["rss_mb_per_min"] == 0.0


def test_growing_rss_or_fds_is_a_leak() -> None:
    rss = leak_figures(samples(3.0, 0.0))
    assert [e["instance"] for e in rss["leaks"]] == ["streams-1"]
    assert rss["leaks"][0]["rss_mb_per_min"] > 2.9
    fds = leak_figures(samples(0.0, 2.0))
    assert fds["leaks"][0]["fds_per_min"] > 1.5


def test_a_short_life_is_not_judged() -> None:
    assert leak_figures(samples(10.0, 10.0, minutes=6))["judged_lives"] == 0


def test_a_restart_starts_a_new_life() -> None:
    first = samples(0.0, 0.0)
    second = samples(0.0, 0.0)
    for s in second:  # restarted with a smaller RSS: not a slope across both lives
        s.at += first[-1].at + 5
        s.rss = {"streams-1": 50 * MB}
        s.lives = {"streams-1": 2}
    figures = leak_figures(first + second)
    assert figures["judged_lives"] == 2
    assert figures["leaks"] == []


def source_samples(rss_mb_per_min: float, takeovers: list[tuple[float, int]]) -> list[Sample]:
    """A source running 30 mailboxes, then the number of mailboxes changing at each
    (second, count): every mailbox is 0.5 MB, and RSS grows by rss_mb_per_min besides."""
    out = []
    owned = 30
    for i in range(20 * 12):
        t = i * 5.0
        for at, count in takeovers:
            if t >= at:
                owned = count
        rss = 100 + 0.5 * owned + rss_mb_per_min * t / 60
        out.append(sample(i, "imap-source-1", rss, 40 + 2 * owned, owned))
    return out


def test_a_takeover_is_a_step_not_a_leak() -> None:
    # 30 -> 60 mailboxes at 5 min (another instance killed), back to 30 at 12 min: +15 MB and
    # +60 fds in one step, which a plain slope over the life reads as 2 MB/min.
    figures = leak_figures(source_samples(0.0, [(300.0, 60), (720.0, 30)]))
    assert figures["leaks"] == []
    life = figures["per_life"][0]
    assert life["spans"] == 3
    assert life["rss_mb_per_min"] == 0.0
    assert life["fds_per_min"] == 0.0


def test_a_leak_between_takeovers_is_still_a_leak() -> None:
    figures = leak_figures(source_samples(1.5, [(300.0, 60), (720.0, 30)]))
    assert [e["instance"] for e in figures["leaks"]] == ["imap-source-1"]
    assert abs(figures["leaks"][0]["rss_mb_per_min"] - 1.5) < 0.01


def test_the_settling_after_a_takeover_is_not_judged() -> None:
    samples = source_samples(0.0, [(300.0, 60)])
    for s in samples:  # the new mailboxes' backfill: +10 MB over the first settle period
        if 300.0 <= s.at < 300.0 + SETTLE_S:
            s.rss["imap-source-1"] -= int(10 * MB * (1 - (s.at - 300.0) / SETTLE_S))
    assert leak_figures(samples)["leaks"] == []


def test_a_streams_worker_taking_partitions_over_is_a_step_too() -> None:
    # The other worker killed: 6 -> 12 partitions of mail.events and their table rows.
    samples = source_samples(0.0, [(300.0, 60)])
    for s in samples:
        s.rss = {"streams-1": s.rss.pop("imap-source-1")}
        s.fds = {"streams-1": s.fds.pop("imap-source-1")}
        s.lives = {"streams-1": 1}
        s.owned = {"streams-1": s.owned.pop("imap-source-1") // 5}
    figures = leak_figures(samples)
    assert figures["leaks"] == []
    assert figures["per_life"][0]["spans"] == 2


def test_work_units_come_from_what_each_component_reports() -> None:
    assert work_units({"ok": True, "mailboxes": {"a/INBOX": {}, "b/INBOX": {}}}) == 2
    assert work_units({"ok": True, "assigned_partitions": 6}) == 6
    assert work_units({"ok": False, "reason": "event loop stuck"}) is None
    assert work_units(None) is None


#: imap-source-3's first life in the second 60-minute run (docs/soak.md), (second, RSS MB):
#: its writers warming up from their first mails, +9 MB, then flat. The old rule flagged it
#: at 1.08 MB/min.
WARMING_LIFE = [
    (0, 219.4), (25, 218.8), (49, 218.5), (65, 218.6), (75, 218.6), (83, 218.6), (92, 218.6),
    (121, 218.6), (131, 218.7), (139, 218.7), (146, 218.8), (151, 219.2), (157, 219.3),
    (164, 219.8), (174, 220.6), (181, 220.8), (191, 221.2), (201, 221.9), (210, 222.3),
    (219, 222.6), (227, 222.7), (236, 222.9), (244, 222.9), (254, 223.0), (265, 224.8),
    (274, 224.8), (286, 224.8), (294, 224.8), (304, 225.3), (313, 225.7), (324, 225.7),
    (333, 225.8), (342, 225.9), (352, 225.9), (359, 227.1), (370, 227.1), (379, 227.1),
    (388, 227.1), (395, 227.1), (404, 227.1), (413, 227.1), (421, 227.2), (430, 227.2),
    (439, 227.2), (447, 227.2), (456, 227.2), (464, 227.2), (473, 227.2), (483, 227.2),
    (494, 227.4), (504, 227.5), (513, 227.6), (522, 227.6), (531, 227.7), (545, 227.7),
    (554, 227.7), (563, 227.8), (573, 227.8), (583, 227.8), (592, 227.8), (603, 227.8),
    (612, 227.8), (623, 227.9), (632, 228.0), (642, 228.0),
]  # fmt: skip


def warming_source(leak_mb_per_min: float) -> list[Sample]:
    """That life, plus a steady leak."""
    out = []
    for i, (t, rss) in enumerate(WARMING_LIFE):
        point = sample(i, "imap-source-1", rss + leak_mb_per_min * t / 60, 600, 78)
        point.at = float(t)
        out.append(point)
    return out


def test_a_warm_up_that_reaches_its_bound_is_no_leak() -> None:
    figures = leak_figures(warming_source(0.0))
    life = figures["per_life"][0]
    assert life["rss_mb_per_min"] > 1.0  # over the whole window it reads as one
    assert life["rss_mb_per_min_later_half"] < 0.5
    assert figures["leaks"] == []


def test_a_leak_under_a_warm_up_still_grows_in_the_later_half() -> None:
    figures = leak_figures(warming_source(1.2))
    assert [e["instance"] for e in figures["leaks"]] == ["imap-source-1"]
    assert figures["leaks"][0]["rss_mb_per_min_later_half"] > 1.2


def test_a_step_late_in_the_life_that_stays_is_judged_on_both_halves() -> None:
    # One big mail: +3 MB at minute 9 of 12, flat otherwise. The later half reads it as a
    # slope, the whole window under the limit: no leak.
    points = [
        sample(i, "imap-source-1", 200 + (3.0 if i * 5 >= 540 else 0.0), 600, 64)
        for i in range(12 * 12)
    ]
    assert leak_figures(points)["leaks"] == []


def test_a_report_reads_back_the_samples_it_wrote() -> None:
    # `python -m mailtap.soak.report DIR` draws the plot from the JSON afterwards.
    written = sample(7, "imap-source-1", 201.3, 612, 64)
    back = Sample.from_json(written.to_json())
    assert back.to_json() == written.to_json()
    assert abs(back.rss["imap-source-1"] - written.rss["imap-source-1"]) < 0.05 * MB
