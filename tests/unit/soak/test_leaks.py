"""The soak's leak rule: RSS and fd slopes per instance life, after the warm-up, over a window
long enough to judge; a restart starts a new life (its RSS drop is no negative slope)."""

from __future__ import annotations

from mailtap.soak.monitor import Sample, slope_per_minute
from mailtap.soak.report import leak_figures

MB = 2**20


def samples(rss_mb_per_min: float, fds_per_min: float, minutes: int = 12) -> list[Sample]:
    out = []
    for i in range(minutes * 12):  # one sample every 5 s
        t = i * 5.0
        out.append(
            Sample(
                at=t,
                events=i,
                commands=i,
                deliveries=i,
                lag_s=0.0,
                rss={"streams-1": int((100 + rss_mb_per_min * t / 60) * MB)},
                fds={"streams-1": int(40 + fds_per_min * t / 60)},
                lives={"streams-1": 1},
            )
        )
    return out


def test_slope_is_per_minute() -> None:
    assert slope_per_minute([(0, 0.0), (60, 2.0), (120, 4.0)]) == 2.0
    assert slope_per_minute([(0, 1.0), (5, 1.0)]) is None


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
