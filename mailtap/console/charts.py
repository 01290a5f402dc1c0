"""Inline SVG charts for the page: pure functions, counts in, markup out (no script, no
external library; the page stays one request).

>>> sparkline([0, 2, 1]).startswith('<svg class="spark"')
True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

#: Colours of the delivery outcomes (the page's legend uses the same).
STATUS_COLOURS = {
    "SENT": "#2e7d32",
    "DEFERRED": "#f9a825",
    "BOUNCED": "#c62828",
    "FAILED": "#6a1b9a",
    "UNKNOWN": "#546e7a",
    "SUPPRESSED": "#8d6e63",
}
OTHER_COLOUR = "#90a4ae"


def sparkline(counts: Sequence[int], width: int = 120, height: int = 24) -> str:
    """A line of ``counts`` (oldest first) with a dot on the newest value."""
    if not counts:
        counts = [0]
    top = max(max(counts), 1)
    step = width / max(len(counts) - 1, 1)
    points = [
        (round(i * step, 1), round(height - 2 - (c / top) * (height - 4), 1))
        for i, c in enumerate(counts)
    ]
    path = " ".join(f"{x},{y}" for x, y in points)
    last_x, last_y = points[-1]
    total = sum(counts)
    return (
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'role="img" aria-label="{total} events in {len(counts)} hours">'
        f"<title>{total} events, {len(counts)} h; peak {max(counts)}/h</title>"
        f'<polyline fill="none" stroke="#1565c0" stroke-width="1.5" points="{path}"/>'
        f'<circle cx="{last_x}" cy="{last_y}" r="2" fill="#1565c0"/></svg>'
    )


def outcome_bars(per_hour: Mapping[str, Sequence[int]], width: int = 720, height: int = 160) -> str:
    """Stacked bars, one per hour (oldest left), one colour per delivery status."""
    hours = max((len(v) for v in per_hour.values()), default=24)
    totals = [sum(v[i] for v in per_hour.values() if i < len(v)) for i in range(hours)]
    top = max(max(totals, default=0), 1)
    axis, plot_h = 28, height - 20
    bar_w = (width - axis) / hours
    parts = [
        f'<svg class="outcomes" width="100%" viewBox="0 0 {width} {height}" role="img" '
        f'aria-label="delivery outcomes per hour, last {hours} hours">',
        f'<text x="0" y="10" class="axis">{top}</text>',
        f'<text x="0" y="{plot_h}" class="axis">0</text>',
        f'<line x1="{axis}" y1="{plot_h}" x2="{width}" y2="{plot_h}" stroke="#ccc"/>',
    ]
    for i in range(hours):
        y = float(plot_h)
        x = axis + i * bar_w
        for status in sorted(per_hour):
            count = per_hour[status][i] if i < len(per_hour[status]) else 0
            if not count:
                continue
            h = count / top * (plot_h - 4)
            y -= h
            colour = STATUS_COLOURS.get(status, OTHER_COLOUR)
            parts.append(
                f'<rect x="{x + 1:.1f}" y="{y:.1f}" width="{max(bar_w - 2, 1):.1f}" '
                f'height="{h:.1f}" fill="{colour}"><title>{escape(status)}: {count} '
                f"({hours - i - 1} h ago)</title></rect>"
            )
    parts.append(f'<text x="{axis}" y="{height - 4}" class="axis">-{hours} h</text>')
    parts.append(f'<text x="{width - 30}" y="{height - 4}" class="axis">now</text>')
    parts.append("</svg>")
    return "".join(parts)
