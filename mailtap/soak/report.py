"""The soak's report: leak figures from the samples, the JSON document and the PNG plot.

The plot needs matplotlib (the optional ``soak`` extra); without it the JSON says so and the
run's verdict does not change. ``python -m mailtap.soak.report DIR`` draws ``DIR/soak.png``
from ``DIR/soak.json`` afterwards (a run of an hour need not run again for its plot).
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

from mailtap.soak.faults import Fault
from mailtap.soak.monitor import Sample

#: Samples of an instance's life before this are start-up (imports, backfill, group join).
WARM_UP_S = 120.0
#: After an instance takes work units over or hands them back (a source's mailboxes: a worker,
#: a transactional producer and two connections per folder; a streams worker's or a sink's
#: partitions: their table rows and fetch buffers), its RSS steps and settles: not a slope.
SETTLE_S = 60.0
#: A life shorter than this after warm-up says nothing about a slope.
MIN_WINDOW_S = 300.0
#: Growth that counts as a leak over a window of at least MIN_WINDOW_S.
RSS_LEAK_MB_PER_MIN = 1.0
FD_LEAK_PER_MIN = 0.5

Point = tuple[float, float, float]  # (seconds, RSS MB, open fds)
RSS, FDS = 1, 2  # the columns of a Point


def leak_figures(samples: list[Sample]) -> dict[str, Any]:
    """Per instance, the RSS and fd slope of each life long enough to judge; ``leaks`` names
    the lives over the limits.

    An instance's memory follows its work units (the mailboxes a source runs, the partitions
    a streams worker or a sink holds): a takeover after another instance's kill is a step
    up, not a leak. So a life is cut into spans with the same number of work units (from its
    /healthz), each after SETTLE_S, and the slope is the one line fitted through every span
    at once with an offset of its own (the within-span slope): a leak grows inside the
    spans, a takeover only between them. An instance that reports none is one span per
    life.

    Growth that stops is no leak either: a source's new transactional writers warm up over
    their first transactions (librdkafka's buffers and lz4 state, about 110 KB per folder,
    then flat: docs/soak.md), which takes minutes at the soak's rate of mail. A leak keeps
    growing, so a life leaks when the within-span slope exceeds the limit over the whole
    window and also over the later half of each span; both slopes are reported."""
    lives: dict[tuple[str, int], list[tuple[float, int, int, int | None]]] = defaultdict(list)
    for sample in samples:
        for name, rss in sample.rss.items():
            lives[(name, sample.lives[name])].append(
                (sample.at, rss, sample.fds[name], sample.owned.get(name))
            )
    figures: dict[str, Any] = {"per_life": [], "leaks": []}
    for (name, life), points in sorted(lives.items()):
        spans = _spans(points)
        window = sum(span[-1][0] - span[0][0] for span in spans)
        if window < MIN_WINDOW_S:
            continue
        late = _later_halves(spans)
        rss_slope, fd_slope = _within_slope(_series(spans, RSS)), _within_slope(_series(spans, FDS))
        rss_late, fd_late = _within_slope(_series(late, RSS)), _within_slope(_series(late, FDS))
        entry = {
            "instance": name,
            "life": life,
            "window_s": round(window),
            "spans": len(spans),
            "rss_mb_start": round(spans[0][0][1], 1),
            "rss_mb_end": round(spans[-1][-1][1], 1),
            "rss_mb_per_min": _rounded(rss_slope),
            "rss_mb_per_min_later_half": _rounded(rss_late),
            "fds_start": int(spans[0][0][2]),
            "fds_end": int(spans[-1][-1][2]),
            "fds_per_min": _rounded(fd_slope),
            "fds_per_min_later_half": _rounded(fd_late),
        }
        figures["per_life"].append(entry)
        if _grows(rss_slope, rss_late, RSS_LEAK_MB_PER_MIN) or _grows(
            fd_slope, fd_late, FD_LEAK_PER_MIN
        ):
            figures["leaks"].append(entry)
    figures["judged_lives"] = len(figures["per_life"])
    figures["limits"] = {
        "warm_up_s": WARM_UP_S,
        "settle_s": SETTLE_S,
        "min_window_s": MIN_WINDOW_S,
        "rss_mb_per_min": RSS_LEAK_MB_PER_MIN,
        "fds_per_min": FD_LEAK_PER_MIN,
    }
    return figures


def _spans(points: list[tuple[float, int, int, int | None]]) -> list[list[Point]]:
    """The life's points after warm-up, cut where the number of work units changes; each span
    starts SETTLE_S after its change and has at least 3 points. A sample without an answer
    from /healthz keeps the last known number."""
    start = points[0][0]
    spans: list[list[Point]] = []
    current: list[Point] = []
    owned: int | None = None
    changed_at = start
    for t, rss, fds, count in points:
        if count is not None and owned is not None and count != owned:
            spans.append(current)
            current, changed_at = [], t
        if count is not None:
            owned = count
        if t - start >= WARM_UP_S and t - changed_at >= (SETTLE_S if changed_at > start else 0):
            current.append((t, rss / 2**20, float(fds)))
    spans.append(current)
    return [span for span in spans if len(span) >= 3]


def _later_halves(spans: list[list[Point]]) -> list[list[Point]]:
    """Each span from the middle of its time on (spans left with fewer than 3 points dropped)."""
    halves = [[p for p in span if p[0] >= (span[0][0] + span[-1][0]) / 2] for span in spans]
    return [half for half in halves if len(half) >= 3]


def _grows(whole: float | None, later_half: float | None, limit: float) -> bool:
    """A leak grows over the whole window and still in its later half; growth that slowed
    below the limit (a warm-up reaching its bound) is none."""
    late = whole if later_half is None else later_half
    return (whole or 0) > limit and (late or 0) > limit


def _rounded(slope: float | None) -> float | None:
    return None if slope is None else round(slope, 3)


def _series(spans: list[list[Point]], column: int) -> list[list[tuple[float, float]]]:
    """(seconds, value) of one column (RSS or FDS) of every span."""
    return [[(p[0], p[column]) for p in span] for span in spans]


def _within_slope(spans: list[list[tuple[float, float]]]) -> float | None:
    """Least-squares slope per minute of one line through every span, each span with an
    offset of its own; None without any spread in time."""
    cov = var = 0.0
    for span in spans:
        mean_t = sum(t for t, _ in span) / len(span)
        mean_v = sum(v for _, v in span) / len(span)
        cov += sum((t - mean_t) * (v - mean_v) for t, v in span)
        var += sum((t - mean_t) ** 2 for t, _ in span)
    return cov / var * 60.0 if var else None


def write_json(path: Path, document: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2, sort_keys=True, default=str) + "\n")


def plot(path: Path, samples: list[Sample], faults: list[Fault], title: str) -> str | None:
    """Events/s, commands/s, lag and RSS over time, each fault a marker. Returns why not, if
    it could not draw."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return (
            "matplotlib is not installed (pip install 'mailtap[soak]', then "
            f"python -m mailtap.soak.report {path.parent} draws it from soak.json)"
        )
    if len(samples) < 2:
        return "fewer than 2 samples"
    minutes = [s.at / 60 for s in samples]

    def rate(values: list[int]) -> list[float]:
        out = [0.0]
        for i in range(1, len(samples)):
            dt = samples[i].at - samples[i - 1].at
            out.append(max(0.0, (values[i] - values[i - 1]) / dt) if dt > 0 else 0.0)
        return out

    fig, axes = plt.subplots(4, 1, figsize=(8, 8), sharex=True, dpi=72)
    axes[0].plot(minutes, rate([s.events for s in samples]), lw=0.8)
    axes[0].set_ylabel("events/s")
    axes[1].plot(minutes, rate([s.commands for s in samples]), lw=0.8, color="tab:orange")
    axes[1].set_ylabel("commands/s")
    axes[2].plot(minutes, [s.lag_s if s.lag_s is not None else float("nan") for s in samples])
    axes[2].set_ylabel("lag s")
    names = sorted({n for s in samples for n in s.rss})
    for name in names:
        axes[3].plot(
            minutes,
            [s.rss[name] / 2**20 if name in s.rss else float("nan") for s in samples],
            lw=0.7,
            label=name,
        )
    axes[3].set_ylabel("RSS MB")
    axes[3].set_xlabel("minutes")
    axes[3].legend(fontsize=6, ncol=4, loc="upper left")
    colours = {"kill": "red", "broker-kill": "black", "imap-restart": "purple"}
    for ax in axes:
        for fault in faults:
            ax.axvline(
                fault.at / 60, color=colours.get(fault.kind, "grey"), lw=0.8, alpha=0.7, ls=":"
            )
    from matplotlib.lines import Line2D

    axes[0].legend(
        [Line2D([], [], color=c, ls=":") for c in [*colours.values(), "grey"]],
        [*colours, "other faults"],
        fontsize=6,
        ncol=4,
        loc="upper left",
    )
    axes[0].set_title(title, fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return None


def title(seed: int, mailboxes: int, secure: str | None) -> str:
    """The plot's title: the run's seed and size, and the broker's security when secured."""
    on = f", --secure {secure}" if secure else ""
    return f"mailtap soak seed {seed}, {mailboxes} mailboxes{on}"


def replot(report_dir: Path) -> str | None:
    """Draw ``report_dir/soak.png`` from ``report_dir/soak.json``; why not, if it could not."""
    document = json.loads((report_dir / "soak.json").read_text())
    return plot(
        report_dir / "soak.png",
        [Sample.from_json(s) for s in document.get("samples", [])],
        [Fault.from_json(f) for f in document.get("faults", [])],
        title(document["seed"], document["mailboxes"], document.get("secure")),
    )


if __name__ == "__main__":
    why_not = replot(Path(sys.argv[1]))
    if why_not:
        sys.exit(f"no plot: {why_not}")
