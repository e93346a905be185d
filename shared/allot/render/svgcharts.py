"""Small inline-SVG chart primitives: line chart, bar chart, column chart, CDF.

Each function takes plain numbers and returns one ``<svg>`` element as a string, drawn
entirely here (no JavaScript, no external fonts or files), so a page that embeds it is
self-contained. Output is deterministic: coordinates are printed with one decimal, labels
with fixed formats, colours come from ``PALETTE`` in series order. Text is HTML-escaped.
The ``<svg>`` carries no ``xmlns`` (inline SVG in HTML5 does not need one), so the page
contains no URL at all.

Geometry: a chart is ``width x height`` pixels; the plot area is inset by ``_MARGIN``.
Axes get "nice" ticks (steps of 1, 2 or 5 x 10^k); a log axis gets one tick per decade.
``None`` values break a line instead of being drawn as zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from html import escape

PALETTE = (
    "#4e79a7",
    "#f28e2b",
    "#59a14f",
    "#e15759",
    "#76b7b2",
    "#edc948",
    "#b07aa1",
    "#ff9da7",
    "#9c755f",
    "#bab0ac",
)

_MARGIN = (28, 16, 40, 56)  # top, right, bottom, left


@dataclass(frozen=True, slots=True)
class Series:
    """One named line: ``values[i]`` is plotted at ``xs[i]``; None breaks the line."""

    name: str
    values: Sequence[float | None]
    color: str = ""
    dashed: bool = False


def line_chart(
    xs: Sequence[float],
    series: Sequence[Series],
    *,
    title: str,
    x_label: str = "",
    y_label: str = "",
    y_min: float | None = 0.0,
    y_max: float | None = None,
    width: int = 640,
    height: int = 240,
    max_points: int = 600,
    x_min: float | None = None,
    marker: tuple[float, str] | None = None,
) -> str:
    """Lines over a shared x axis; more than ``max_points`` points are thinned by stride
    (the last point is always kept), which suits cumulative or already-smoothed series.
    ``x_min`` starts the axis before the first point; ``marker`` = (x, label) draws a
    dashed vertical line, e.g. at the last submission."""
    keep = _stride(len(xs), max_points)
    points = [(xs[i], [s.values[i] if i < len(s.values) else None for s in series]) for i in keep]
    ys = [v for _, vals in points for v in vals if v is not None]
    lo = y_min if y_min is not None else min(ys, default=0.0)
    hi = y_max if y_max is not None else max(ys, default=1.0)
    x_lo, x_hi = _span(xs)
    if x_min is not None:
        x_lo = min(x_lo, x_min)
    frame = _Frame(width, height, (x_lo, x_hi), (lo, hi))
    parts = [frame.open(title), frame.axes(x_label, y_label)]
    if marker is not None and frame.x0 <= marker[0] <= frame.x1:
        mx = frame.x(marker[0])
        parts.append(
            f'<line x1="{mx:.1f}" y1="{frame.top:.1f}" x2="{mx:.1f}" y2="{frame.bottom:.1f}" '
            f'stroke="#888" stroke-dasharray="3 3"/>'
            f'<text x="{mx - 3:.1f}" y="{frame.top + 10:.1f}" text-anchor="end" fill="#555">'
            f"{escape(marker[1])}</text>"
        )
    for k, s in enumerate(series):
        color = s.color or PALETTE[k % len(PALETTE)]
        runs: list[list[str]] = [[]]
        for x, vals in points:
            v = vals[k]
            if v is None:
                runs.append([])
            else:
                runs[-1].append(f"{frame.x(x):.1f},{frame.y(v):.1f}")
        dash = ' stroke-dasharray="5 3"' if s.dashed else ""
        parts.extend(
            f'<polyline fill="none" stroke="{color}" stroke-width="1.5"{dash} '
            f'points="{" ".join(run)}"/>'
            for run in runs
            if run
        )
    parts.append(
        frame.legend([(s.name, s.color or PALETTE[k % len(PALETTE)]) for k, s in enumerate(series)])
    )
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    x_label: str = "",
    width: int = 640,
    bar_height: int = 16,
    value_format: str = "{:.3f}",
) -> str:
    """Horizontal bars, one per label, in the order given; each bar shows its value."""
    left = 8 + 7 * max((len(label) for label in labels), default=4)
    height = _MARGIN[0] + _MARGIN[2] + (bar_height + 4) * max(1, len(labels))
    hi = max([*values, 0.0]) or 1.0
    frame = _Frame(width, height, (0.0, hi), (0.0, 1.0), left=left, right_pad=56)
    parts = [frame.open(title), frame.axes(x_label, "", y_ticks=False)]
    for i, (label, value) in enumerate(zip(labels, values, strict=True)):
        top = _MARGIN[0] + 2 + i * (bar_height + 4)
        x1 = frame.x(max(value, 0.0))
        color = PALETTE[0]
        parts.append(
            f'<rect x="{frame.left:.1f}" y="{top}" width="{x1 - frame.left:.1f}" '
            f'height="{bar_height}" fill="{color}"><title>{escape(label)}: '
            f"{escape(value_format.format(value))}</title></rect>"
        )
        parts.append(
            f'<text x="{frame.left - 4:.1f}" y="{top + bar_height - 4}" '
            f'text-anchor="end">{escape(label)}</text>'
        )
        parts.append(
            f'<text x="{x1 + 3:.1f}" y="{top + bar_height - 4}">'
            f"{escape(value_format.format(value))}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)


def column_chart(
    values: Sequence[float],
    *,
    title: str,
    x_start: float = 0.0,
    x_step: float = 1.0,
    x_label: str = "",
    y_label: str = "",
    width: int = 640,
    height: int = 200,
) -> str:
    """Vertical bars: ``values[i]`` over ``[x_start + i*x_step, x_start + (i+1)*x_step)``."""
    n = len(values)
    hi = max([*values, 0.0]) or 1.0
    frame = _Frame(width, height, (x_start, x_start + max(n, 1) * x_step), (0.0, hi))
    parts = [frame.open(title), frame.axes(x_label, y_label)]
    for i, v in enumerate(values):
        if v <= 0:
            continue
        x0 = frame.x(x_start + i * x_step)
        x1 = frame.x(x_start + (i + 1) * x_step)
        y = frame.y(v)
        parts.append(
            f'<rect x="{x0:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 0.5, 0.5):.1f}" '
            f'height="{frame.bottom - y:.1f}" fill="{PALETTE[0]}"/>'
        )
    parts.append("</svg>")
    return "\n".join(parts)


def cdf_chart(
    quantiles: Mapping[str, Sequence[float | None]],
    *,
    title: str,
    x_label: str = "",
    width: int = 640,
    height: int = 260,
) -> str:
    """Empirical CDFs from evenly spaced quantiles: ``quantiles[name][k]`` is the value at
    fraction ``k / (len - 1)``. The x axis is logarithmic; values below 1 sit at 1."""
    floor = 1.0
    finite = [max(v, floor) for qs in quantiles.values() for v in qs if v is not None]
    hi = max([*finite, 10.0])
    frame = _Frame(width, height, (math.log10(floor), math.log10(hi)), (0.0, 1.0))
    parts = [frame.open(title), frame.axes(x_label, "fraction of jobs", log_x=True)]
    for k, (name, qs) in enumerate(quantiles.items()):
        color = PALETTE[k % len(PALETTE)]
        last = len(qs) - 1
        pts = [
            f"{frame.x(math.log10(max(v, floor))):.1f},{frame.y(i / last if last else 1.0):.1f}"
            for i, v in enumerate(qs)
            if v is not None
        ]
        if pts:
            parts.append(
                f'<polyline fill="none" stroke="{color}" stroke-width="1.5" '
                f'points="{" ".join(pts)}"><title>{escape(name)}</title></polyline>'
            )
    parts.append(
        frame.legend([(name, PALETTE[k % len(PALETTE)]) for k, name in enumerate(quantiles)])
    )
    parts.append("</svg>")
    return "\n".join(parts)


# --- shared geometry ------------------------------------------------------------------


class _Frame:
    """Maps data coordinates onto the plot area and draws the axes."""

    def __init__(
        self,
        width: int,
        height: int,
        x_range: tuple[float, float],
        y_range: tuple[float, float],
        *,
        left: int | None = None,
        right_pad: int = 0,
    ) -> None:
        self.width = width
        self.height = height
        self.left = float(left if left is not None else _MARGIN[3])
        self.right = float(width - _MARGIN[1] - right_pad)
        self.top = float(_MARGIN[0])
        self.bottom = float(height - _MARGIN[2])
        self.x0, self.x1 = _widen(*x_range)
        self.y0, self.y1 = _widen(*y_range)

    def x(self, v: float) -> float:
        return self.left + (v - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def y(self, v: float) -> float:
        return self.bottom - (v - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)

    def open(self, title: str) -> str:
        return (
            f'<svg class="chart" viewBox="0 0 {self.width} {self.height}" width="{self.width}" '
            f'height="{self.height}" role="img" aria-label="{escape(title)}" '
            f'font-family="sans-serif" font-size="11">\n'
            f'<text x="4" y="16" font-size="13" font-weight="bold">'
            f"{escape(title)}</text>"
        )

    def axes(self, x_label: str, y_label: str, *, y_ticks: bool = True, log_x: bool = False) -> str:
        parts = [
            f'<line x1="{self.left:.1f}" y1="{self.bottom:.1f}" x2="{self.right:.1f}" '
            f'y2="{self.bottom:.1f}" stroke="#333"/>',
            f'<line x1="{self.left:.1f}" y1="{self.top:.1f}" x2="{self.left:.1f}" '
            f'y2="{self.bottom:.1f}" stroke="#333"/>',
        ]
        x_ticks = (
            _log_ticks(self.x0, self.x1)
            if log_x
            else [(t, _fmt(t)) for t in _ticks(self.x0, self.x1)]
        )
        for t, label in x_ticks:
            x = self.x(t)
            parts.append(
                f'<line x1="{x:.1f}" y1="{self.bottom:.1f}" x2="{x:.1f}" '
                f'y2="{self.bottom + 4:.1f}" stroke="#333"/>'
                f'<text x="{x:.1f}" y="{self.bottom + 15:.1f}" text-anchor="middle">'
                f"{label}</text>"
            )
        if y_ticks:
            for t in _ticks(self.y0, self.y1):
                y = self.y(t)
                parts.append(
                    f'<line x1="{self.left:.1f}" y1="{y:.1f}" x2="{self.right:.1f}" '
                    f'y2="{y:.1f}" stroke="#ddd"/>'
                    f'<text x="{self.left - 4:.1f}" y="{y + 4:.1f}" text-anchor="end">'
                    f"{_fmt(t)}</text>"
                )
        if x_label:
            parts.append(
                f'<text x="{(self.left + self.right) / 2:.1f}" y="{self.height - 6}" '
                f'text-anchor="middle">{escape(x_label)}</text>'
            )
        if y_label:
            cy = (self.top + self.bottom) / 2
            parts.append(
                f'<text x="12" y="{cy:.1f}" text-anchor="middle" '
                f'transform="rotate(-90 12 {cy:.1f})">{escape(y_label)}</text>'
            )
        return "\n".join(parts)

    def legend(self, entries: Sequence[tuple[str, str]]) -> str:
        parts: list[str] = []
        x = self.right
        for name, color in reversed(entries):
            x -= 24 + 6.5 * len(name)
            parts.append(
                f'<rect x="{x:.1f}" y="8" width="10" height="10" fill="{color}"/>'
                f'<text x="{x + 13:.1f}" y="17">{escape(name)}</text>'
            )
        return "\n".join(reversed(parts))


def _widen(lo: float, hi: float) -> tuple[float, float]:
    if hi > lo:
        return lo, hi
    return lo, lo + 1.0


def _span(xs: Sequence[float]) -> tuple[float, float]:
    return (min(xs), max(xs)) if xs else (0.0, 1.0)


def _stride(n: int, max_points: int) -> list[int]:
    if n <= max_points:
        return list(range(n))
    step = math.ceil(n / max_points)
    keep = list(range(0, n, step))
    if keep[-1] != n - 1:
        keep.append(n - 1)
    return keep


def _ticks(lo: float, hi: float, target: int = 5) -> list[float]:
    """Ticks at multiples of a 1/2/5 x 10^k step, about ``target`` of them."""
    raw = (hi - lo) / target
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 5, 10) if m * magnitude >= raw)
    first = math.ceil(lo / step - 1e-9)
    out: list[float] = []
    k = first
    while k * step <= hi + 1e-9 * step:
        out.append(round(k * step, 10))
        k += 1
    return out


_TIME_TICKS = (
    (1.0, "1s"),
    (10.0, "10s"),
    (60.0, "1m"),
    (600.0, "10m"),
    (3600.0, "1h"),
    (36000.0, "10h"),
    (86400.0, "1d"),
    (864000.0, "10d"),
    (8640000.0, "100d"),
)


def _log_ticks(lo: float, hi: float) -> list[tuple[float, str]]:
    """Ticks of a log10 time axis at 1s, 10s, 1m, 10m, 1h, 10h, 1d, 10d, 100d."""
    return [
        (math.log10(sec), label)
        for sec, label in _TIME_TICKS
        if lo - 1e-9 <= math.log10(sec) <= hi + 1e-9
    ]


def _fmt(v: float) -> str:
    if v == 0:
        return "0"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    if abs(v) >= 1:
        return f"{v:g}"
    return f"{v:.2g}"
