"""Charts drawn on the server as SVG (templates/knowledge/_chart.html): bars, stacked or not, and
lines, over days. No script and no library: the page stays within the Content Security Policy,
prints, and reads the same with JavaScript off; every chart has a table of its numbers beside it
for screen readers. The drawing is 360 units wide, a phone's width, and scales up."""

import math
from dataclasses import dataclass
from datetime import date

WIDTH, HEIGHT = 360, 150
LEFT, RIGHT, TOP, BOTTOM = 40, 6, 8, 18


@dataclass(frozen=True)
class Series:
    name: str
    values: list[float | None]


def _nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (and above zero)."""
    if value <= 0:
        return 1
    power = 10 ** math.floor(math.log10(value))
    return next(step * power for step in (1, 2, 5, 10) if step * power >= value)


def _label(value: float) -> str:
    if value >= 1_000_000:
        return f"{value / 1_000_000:g}M"
    if value >= 1000:
        return f"{value / 1000:g}k"
    return f"{value:g}"


def _frame(days: list[date], top: float, unit: str) -> dict:
    plot_width, plot_height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    ticks = [
        {"y": round(TOP + plot_height * (1 - share), 1), "label": _label(top * share) + (unit if share else "")}
        for share in (0, 0.5, 1)
    ]
    slot = plot_width / max(len(days), 1)
    picks = sorted({0, len(days) // 2, len(days) - 1}) if days else []
    # The first and last labels hang inwards from the plot's edges, so a phone shows them whole.
    xlabels = [
        {
            "x": LEFT
            if index == 0
            else WIDTH - RIGHT
            if index == len(days) - 1
            else round(LEFT + slot * (index + 0.5), 1),
            "anchor": "start" if index == 0 else "end" if index == len(days) - 1 else "middle",
            "label": f"{days[index]:%-d %b}",
        }
        for index in picks
    ]
    return {
        "width": WIDTH,
        "height": HEIGHT,
        "left": LEFT,
        "right": WIDTH - RIGHT,
        "bottom": HEIGHT - BOTTOM,
        "ticks": ticks,
        "xlabels": xlabels,
        "slot": slot,
        "plot_height": plot_height,
    }


def bar_chart(*, days: list[date], series: list[Series], unit: str = "", stacked: bool = True) -> dict:
    """Bars per day; several series stack (or stand side by side with stacked=False)."""
    if stacked:
        highest = max((sum(s.values[i] or 0 for s in series) for i in range(len(days))), default=0)
    else:
        highest = max((value or 0 for s in series for value in s.values), default=0)
    top = _nice_top(highest)
    chart = _frame(days, top, unit)
    slot, plot_height = chart["slot"], chart["plot_height"]
    bars = []
    for index, day in enumerate(days):
        base = HEIGHT - BOTTOM
        width = slot * 0.8 / (1 if stacked else len(series))
        for number, one in enumerate(series):
            value = one.values[index] or 0
            height = plot_height * value / top
            x = LEFT + slot * index + slot * 0.1 + (0 if stacked else width * number)
            if value:
                bars.append(
                    {
                        "x": round(x, 1),
                        "y": round(base - height, 1),
                        "width": round(width, 1),
                        "height": round(height, 1),
                        "series": number,
                        "title": f"{day:%-d %b}: {_label(value)}{unit} {one.name}".strip(),
                    }
                )
            if stacked:
                base -= height
    return {**chart, "bars": bars, "legend": [(number, one.name) for number, one in enumerate(series)]}


def line_chart(*, days: list[date], series: list[Series], unit: str = "") -> dict:
    """Lines per day; a day without a value breaks the line."""
    top = _nice_top(max((value or 0 for s in series for value in s.values), default=0))
    chart = _frame(days, top, unit)
    slot, plot_height = chart["slot"], chart["plot_height"]
    lines, points = [], []
    for number, one in enumerate(series):
        run: list[str] = []
        for index, value in enumerate([*one.values, None]):
            if value is None:
                if run:
                    lines.append({"series": number, "points": " ".join(run)})
                run = []
                continue
            x, y = round(LEFT + slot * (index + 0.5), 1), round(HEIGHT - BOTTOM - plot_height * value / top, 1)
            run.append(f"{x},{y}")
            points.append(
                {
                    "x": x,
                    "y": y,
                    "series": number,
                    "title": f"{days[index]:%-d %b}: {_label(round(value))}{unit} {one.name}",
                }
            )
    return {
        **chart,
        "lines": lines,
        "points": points,
        "legend": [(number, one.name) for number, one in enumerate(series)],
    }
