"""The page's inline SVG charts: pure functions of counts."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from mailtap.console.charts import STATUS_COLOURS, outcome_bars, sparkline

SVG = "{http://www.w3.org/2000/svg}"


def test_sparkline_puts_the_peak_at_the_top_and_the_newest_value_last() -> None:
    markup = sparkline([0, 4, 2], width=100, height=24)
    svg = ET.fromstring(markup.replace("<svg ", '<svg xmlns="http://www.w3.org/2000/svg" ', 1))
    points = [
        tuple(map(float, p.split(","))) for p in svg.find(f"{SVG}polyline").get("points").split()
    ]  # type: ignore[union-attr]
    assert [x for x, _ in points] == [0.0, 50.0, 100.0]
    ys = [y for _, y in points]
    assert ys[1] == min(ys) and ys[0] == max(ys)  # SVG's y grows downwards
    assert "6 events, 3 h; peak 4/h" in markup


def test_sparkline_of_no_events_is_a_flat_line() -> None:
    markup = sparkline([0] * 24)
    ys = {p.split(",")[1] for p in re.search(r'points="([^"]+)"', markup).group(1).split()}  # type: ignore[union-attr]
    assert len(ys) == 1 and "0 events, 24 h" in markup


def test_outcome_bars_stack_one_rect_per_status_and_hour_with_counts() -> None:
    markup = outcome_bars({"SENT": [1, 0, 3], "BOUNCED": [0, 0, 1]})
    rects = re.findall(
        r'<rect [^>]*fill="(#[0-9a-f]+)"><title>(\w+): (\d+) \((\d+) h ago\)', markup
    )
    assert sorted(rects) == sorted(
        [
            (STATUS_COLOURS["SENT"], "SENT", "1", "2"),
            (STATUS_COLOURS["SENT"], "SENT", "3", "0"),
            (STATUS_COLOURS["BOUNCED"], "BOUNCED", "1", "0"),
        ]
    )
    heights = {
        t: float(h)
        for h, t in re.findall(r'height="([\d.]+)" fill="[^"]+"><title>(\w+: \d+ \(0)', markup)
    }
    assert heights["SENT: 3 (0"] == 3 * heights["BOUNCED: 1 (0"]
