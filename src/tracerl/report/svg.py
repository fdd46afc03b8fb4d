"""Line charts as inline SVG: no JavaScript library, no CDN, readable offline.

A chart is one or more panels sharing the x axis (step); each panel has its own y axis and
unit, so quantities with different units (tool calls and seconds) never share a scale.
Every point carries a ``<title>`` (the browser shows it on hover) and every series a
``data-series`` name that the page's legend toggles.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from html import escape

PALETTE = (
    "#1f77b4",
    "#d62728",
    "#2ca02c",
    "#9467bd",
    "#ff7f0e",
    "#17becf",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
)


@dataclass
class Series:
    name: str
    points: list[tuple[float, float]]
    dashed: bool = False
    labels: list[str] | None = None
    """Per point, shown on hover after the value (e.g. the evaluation stage)."""


@dataclass
class Panel:
    unit: str
    series: list[Series] = field(default_factory=list)
    y_min: float | None = None
    y_max: float | None = None
    percent: bool = False


def _ticks(lo: float, hi: float, n: int = 4) -> list[float]:
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / n
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    start = math.ceil(lo / step - 1e-9) * step
    out, v = [], start
    while v <= hi + 1e-9:
        out.append(round(v, 10))
        v += step
    return out


def _fmt(v: float, percent: bool = False) -> str:
    if percent:
        return f"{100 * v:.0f}%" if abs(v) >= 0.1 or v == 0 else f"{100 * v:.1f}%"
    if v == 0:
        return "0"
    if abs(v) < 1e-3:  # learning rates
        return f"{v:.2g}"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 1:
        return f"{v:.2f}".rstrip("0").rstrip(".")
    return f"{v:.3f}".rstrip("0").rstrip(".")


def line_chart(
    chart_id: str,
    title: str,
    panels: Sequence[Panel],
    *,
    width: int = 520,
    panel_height: int = 170,
    x_label: str = "RL step (updates applied)",
    note: str = "",
    x_range: tuple[float, float] | None = None,
    x_labels: dict[float, str] | None = None,
) -> str:
    """The chart as an ``<figure>`` holding one ``<svg class="chart">``. Charts meant to be
    read together should share `x_range`."""
    names = list(dict.fromkeys(s.name for p in panels for s in p.series))
    color = {n: PALETTE[i % len(PALETTE)] for i, n in enumerate(names)}
    xs = [x for p in panels for s in p.series for x, _ in s.points]
    x_lo, x_hi = x_range or ((min(xs), max(xs)) if xs else (0.0, 1.0))
    if x_hi == x_lo:
        x_hi = x_lo + 1
    left, right, top, gap = 56, 14, 20, 30
    height = top + len(panels) * (panel_height + gap) + 18
    plot_w = width - left - right

    def px(x: float) -> float:
        return left + (x - x_lo) / (x_hi - x_lo) * plot_w

    body: list[str] = []
    for k, panel in enumerate(panels):
        y0 = top + k * (panel_height + gap)
        ys = [y for s in panel.series for _, y in s.points]
        lo = panel.y_min if panel.y_min is not None else min(ys, default=0.0)
        hi = panel.y_max if panel.y_max is not None else max(ys, default=1.0)
        if panel.y_max is not None and ys:
            hi = max(hi, max(ys))
        if panel.y_min is not None and ys:
            lo = min(lo, min(ys))
        if hi <= lo:
            hi = lo + (abs(lo) or 1.0)
        ticks = _ticks(lo, hi)
        if ticks[-1] < hi - 1e-9:  # end the axis on a labelled tick
            hi = ticks[-1] + (ticks[1] - ticks[0] if len(ticks) > 1 else hi - lo)
            ticks.append(round(hi, 10))

        def py(y: float, y0: int = y0, lo: float = lo, hi: float = hi) -> float:
            return y0 + panel_height - (y - lo) / (hi - lo) * panel_height

        body.append(
            f'<rect x="{left}" y="{y0}" width="{plot_w}" height="{panel_height}" class="plot-bg"/>'
        )
        for t in ticks:
            y = py(t)
            body.append(
                f'<line x1="{left}" x2="{left + plot_w}" y1="{y:.1f}" y2="{y:.1f}" class="grid"/>'
            )
            body.append(
                f'<text x="{left - 6}" y="{y + 4:.1f}" class="tick" text-anchor="end">'
                f"{_fmt(t, panel.percent)}</text>"
            )
        body.append(f'<text x="{left}" y="{y0 - 6}" class="unit">{escape(panel.unit)}</text>')
        if not ys:
            body.append(
                f'<text x="{left + plot_w / 2}" y="{y0 + panel_height / 2}" class="empty" '
                'text-anchor="middle">no data yet</text>'
            )
        for s in panel.series:
            body.append(_series(s, color[s.name], px, py, panel.percent))
    axis_y = top + len(panels) * (panel_height + gap) - gap + 16
    named = x_labels or {}
    ticks = [t for t in _ticks(x_lo, x_hi, 6) if float(t).is_integer()]  # whole steps
    for t in sorted({*ticks, *(x for x in named if x_lo <= x <= x_hi)}):
        body.append(
            f'<text x="{px(t):.1f}" y="{axis_y}" class="tick" text-anchor="middle">'
            f"{escape(named.get(t, _fmt(t)))}</text>"
        )
    body.append(
        f'<text x="{left + plot_w}" y="{axis_y + 14}" class="tick" text-anchor="end">'
        f"{escape(x_label)}</text>"
    )
    legend = "".join(
        f'<button type="button" class="legend-item" data-series="{escape(n)}" '
        f'aria-pressed="true"><span class="swatch" style="background:{color[n]}"></span>'
        f"{escape(n)}</button>"
        for n in names
    )
    svg = (
        f'<svg class="chart" id="{escape(chart_id)}" data-chart="{escape(chart_id)}" '
        f'viewBox="0 0 {width} {height + 14}" width="{width}" height="{height + 14}" '
        f'role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg">'
        + "".join(body)
        + "</svg>"
    )
    caption = f'<p class="note">{escape(note)}</p>' if note else ""
    return (
        f'<figure class="curve" data-curve="{escape(chart_id)}"><figcaption>{escape(title)}'
        f'</figcaption><div class="legend">{legend}</div>{svg}{caption}</figure>'
    )


def _series(s: Series, color: str, px, py, percent: bool) -> str:
    # by step only: two evaluations at one step keep the order they were made in
    pts = sorted(
        zip(s.points, s.labels or [""] * len(s.points), strict=True), key=lambda p: p[0][0]
    )
    path = " ".join(
        f"{'M' if i == 0 else 'L'}{px(x):.1f},{py(y):.1f}" for i, ((x, y), _) in enumerate(pts)
    )
    dash = ' stroke-dasharray="5 4"' if s.dashed else ""
    dots = "".join(
        f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{color}"><title>'
        f"{escape(s.name)} @ step {_fmt(x)}: {_fmt(y, percent)}"
        f"{' (' + escape(label) + ')' if label else ''}</title></circle>"
        for (x, y), label in pts
    )
    line = (
        f'<path d="{path}" fill="none" stroke="{color}" stroke-width="2"{dash}/>'
        if len(pts) > 1
        else ""
    )
    return f'<g class="series" data-series="{escape(s.name)}">{line}{dots}</g>'
