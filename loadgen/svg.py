"""Small self-contained SVG charts (line and bar) for the offline HTML report.

No plotting library and nothing fetched at view time: each chart is one `<svg>` element with
its axes, ticks, legend and data drawn as plain shapes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from html import escape
from typing import NamedTuple

WIDTH = 900
HEIGHT = 320
#: Room for tick labels and axis titles around the plot area.
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 70, 20, 40, 48
#: About this many ticks on a linear axis.
TARGET_TICKS = 6
#: Below this many points a line also marks each one, so a short run still shows its data.
MARKERS_BELOW = 40
FONT = "font-family='system-ui, sans-serif' font-size='12'"
AXIS_COLOR = "#555"
GRID_COLOR = "#e4e4e4"
BAR_COLOR = "#4c78a8"


class Series(NamedTuple):
    """One line of a line chart; a None y leaves a gap."""

    name: str
    xs: Sequence[float]
    ys: Sequence[float | None]
    color: str
    dashed: bool = False


class _Axis(NamedTuple):
    low: float
    high: float
    log: bool

    def fraction(self, value: float) -> float:
        if self.log:
            return (math.log10(value) - math.log10(self.low)) / (
                math.log10(self.high) - math.log10(self.low)
            )
        return (value - self.low) / (self.high - self.low)


def _nice_step(span: float) -> float:
    raw = span / TARGET_TICKS
    magnitude = 10.0 ** math.floor(math.log10(raw))
    return next(m * magnitude for m in (1.0, 2.0, 5.0, 10.0) if m * magnitude >= raw)


def _linear_ticks(low: float, high: float, *, tight: bool = False) -> tuple[_Axis, list[float]]:
    """An axis with round ticks. By default it widens to the round ticks around the data (a
    value axis reads best from 0 to a round top); `tight` keeps exactly [low, high] with the
    round ticks inside it (a time axis: a 30 s run ends at 30, not at the next round tick)."""
    if high <= low:
        high = low + 1.0
    step = _nice_step(high - low)
    start = math.floor(low / step) * step
    end = math.ceil(high / step) * step
    count = round((end - start) / step)
    ticks = [start + i * step for i in range(count + 1)]
    if not tight:
        return _Axis(start, end, False), ticks
    epsilon = step * 1e-9
    return _Axis(low, high, False), [t for t in ticks if low - epsilon <= t <= high + epsilon]


def _log_ticks(low: float, high: float) -> tuple[_Axis, list[float]]:
    low_decade = math.floor(math.log10(low))
    high_decade = max(math.ceil(math.log10(high)), low_decade + 1)
    decades = range(low_decade, high_decade + 1)
    # Few decades: 1-2-5 ticks, so a narrow range still reads off easily.
    mantissas = (1.0, 2.0, 5.0) if len(decades) <= 3 else (1.0,)
    ticks = [m * 10.0**d for d in decades for m in mantissas if m * 10.0**d <= 10.0**high_decade]
    return _Axis(10.0**low_decade, 10.0**high_decade, True), ticks


def _label(value: float) -> str:
    """A tick or bar label: thousands separated, no trailing zeros, millions as "M"."""
    if value == 0:
        return "0"
    if abs(value) >= 1_000_000:
        return f"{value / 1_000_000:,.6g}M"
    if value == round(value):
        return f"{value:,.0f}"
    return f"{value:,.6g}"


class _Frame:
    """The plot area of one chart and the mapping from data to pixels."""

    def __init__(self, x_axis: _Axis, y_axis: _Axis) -> None:
        self.x_axis = x_axis
        self.y_axis = y_axis
        self.left = MARGIN_LEFT
        self.right = WIDTH - MARGIN_RIGHT
        self.top = MARGIN_TOP
        self.bottom = HEIGHT - MARGIN_BOTTOM

    def x(self, value: float) -> float:
        return self.left + self.x_axis.fraction(value) * (self.right - self.left)

    def y(self, value: float) -> float:
        return self.bottom - self.y_axis.fraction(value) * (self.bottom - self.top)


def _open(title: str) -> list[str]:
    return [
        f"<svg xmlns='http://www.w3.org/2000/svg' viewBox='0 0 {WIDTH} {HEIGHT}' "
        f"width='{WIDTH}' height='{HEIGHT}' role='img' aria-label='{escape(title)}'>",
        f"<title>{escape(title)}</title>",
        f"<rect width='{WIDTH}' height='{HEIGHT}' fill='white'/>",
    ]


def _axes(
    frame: _Frame, x_ticks: list[tuple[float, str]], y_ticks: list[float], labels: tuple[str, str]
) -> list[str]:
    parts = []
    for value in y_ticks:
        y = frame.y(value)
        parts.append(
            f"<line x1='{frame.left}' x2='{frame.right}' y1='{y:.1f}' y2='{y:.1f}' "
            f"stroke='{GRID_COLOR}'/>"
            f"<text x='{frame.left - 6}' y='{y + 4:.1f}' text-anchor='end' {FONT} "
            f"fill='{AXIS_COLOR}'>{_label(value)}</text>"
        )
    for x, text in x_ticks:
        parts.append(
            f"<line x1='{x:.1f}' x2='{x:.1f}' y1='{frame.bottom}' y2='{frame.bottom + 4}' "
            f"stroke='{AXIS_COLOR}'/>"
            f"<text x='{x:.1f}' y='{frame.bottom + 18}' text-anchor='middle' {FONT} "
            f"fill='{AXIS_COLOR}'>{escape(text)}</text>"
        )
    x_label, y_label = labels
    middle_y = (frame.top + frame.bottom) / 2
    parts.append(
        f"<polyline points='{frame.left},{frame.top} {frame.left},{frame.bottom} "
        f"{frame.right},{frame.bottom}' fill='none' stroke='{AXIS_COLOR}'/>"
        f"<text x='{(frame.left + frame.right) / 2}' y='{HEIGHT - 8}' text-anchor='middle' "
        f"{FONT}>{escape(x_label)}</text>"
        f"<text x='16' y='{middle_y}' text-anchor='middle' {FONT} "
        f"transform='rotate(-90 16 {middle_y})'>{escape(y_label)}</text>"
    )
    return parts


def _legend(series: Sequence[Series]) -> list[str]:
    parts = []
    x = MARGIN_LEFT
    for s in series:
        dash = " stroke-dasharray='6 4'" if s.dashed else ""
        parts.append(
            f"<line x1='{x}' x2='{x + 22}' y1='18' y2='18' stroke='{s.color}' "
            f"stroke-width='2.5'{dash}/>"
            f"<text x='{x + 28}' y='22' {FONT}>{escape(s.name)}</text>"
        )
        x += 40 + 7 * len(s.name)
    return parts


def _segments(points: list[tuple[float, float] | None]) -> list[list[tuple[float, float]]]:
    segments: list[list[tuple[float, float]]] = [[]]
    for point in points:
        if point is None:
            if segments[-1]:
                segments.append([])
        else:
            segments[-1].append(point)
    return [s for s in segments if s]


def line_chart(
    title: str,
    series: Sequence[Series],
    *,
    x_label: str,
    y_label: str,
    log_y: bool = False,
    x_range: tuple[float, float] | None = None,
) -> str:
    """An SVG line chart of `series` over a shared x axis; `log_y` for latencies; `x_range`
    to line several charts up on the same time axis."""
    xs = [x for s in series for x in s.xs]
    ys = [y for s in series for y in s.ys if y is not None and (y > 0 or not log_y)]
    low, high = x_range or (min(xs, default=0.0), max(xs, default=1.0))
    x_axis, x_ticks = _linear_ticks(low, high, tight=True)
    if log_y:
        y_axis, y_ticks = _log_ticks(min(ys, default=1.0), max(ys, default=10.0))
    else:
        y_axis, y_ticks = _linear_ticks(min([0.0, *ys]), max(ys, default=1.0))
    frame = _Frame(x_axis, y_axis)
    parts = _open(title)
    parts += _axes(frame, [(frame.x(t), _label(t)) for t in x_ticks], y_ticks, (x_label, y_label))
    for s in series:
        dash = " stroke-dasharray='6 4'" if s.dashed else ""
        points = [
            None if y is None or (log_y and y <= 0) else (frame.x(x), frame.y(y))
            for x, y in zip(s.xs, s.ys, strict=True)
        ]
        for segment in _segments(points):
            path = " ".join(f"{x:.1f},{y:.1f}" for x, y in segment)
            parts.append(
                f"<polyline points='{path}' fill='none' stroke='{s.color}' stroke-width='2'"
                f" stroke-linejoin='round'{dash}/>"
            )
        if len(s.xs) < MARKERS_BELOW:
            parts += [
                f"<circle cx='{p[0]:.1f}' cy='{p[1]:.1f}' r='2.5' fill='{s.color}'/>"
                for p in points
                if p is not None
            ]
    parts += _legend(series)
    parts.append("</svg>")
    return "\n".join(parts)


def bar_chart(
    title: str, labels: Sequence[str], values: Sequence[float], *, x_label: str, y_label: str
) -> str:
    """An SVG bar chart, one bar per label, in the order given."""
    y_axis, y_ticks = _linear_ticks(0.0, max(values, default=1.0))
    frame = _Frame(_Axis(0.0, max(len(labels), 1), False), y_axis)
    slot = (frame.right - frame.left) / max(len(labels), 1)
    parts = _open(title)
    centers = [(frame.left + (i + 0.5) * slot, label) for i, label in enumerate(labels)]
    parts += _axes(frame, centers, y_ticks, (x_label, y_label))
    for (x, _), value in zip(centers, values, strict=True):
        top = frame.y(value)
        parts.append(
            f"<rect x='{x - slot * 0.35:.1f}' y='{top:.1f}' width='{slot * 0.7:.1f}' "
            f"height='{frame.bottom - top:.1f}' fill='{BAR_COLOR}'/>"
            f"<text x='{x:.1f}' y='{top - 4:.1f}' text-anchor='middle' {FONT}>"
            f"{_label(value)}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts)
