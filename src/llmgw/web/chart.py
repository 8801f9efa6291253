"""Charts as inline SVG, drawn on the server: tokens per day stacked by project; small history lines.

No script and no chart library: the page must work with the strict content
security policy the pages send, and an operator's browser may be offline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date

import attrs
from markupsafe import Markup, escape

# Distinguishable for the common colour-blindnesses (Okabe and Ito's palette).
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000")

_WIDTH, _HEIGHT = 900, 280
_LEFT, _RIGHT, _TOP, _BOTTOM = 64, 12, 12, 40


@attrs.frozen
class Series:
    label: str
    colour: str


def colour(index: int) -> str:
    return PALETTE[index % len(PALETTE)]


def _nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 5 times a power of ten at or above value, so the axis reads in round numbers."""
    if value <= 0:
        return 1.0
    power = 1.0
    while power * 10 <= value:
        power *= 10
    while power > value:
        power /= 10
    for step in (1, 2, 5, 10):
        if step * power >= value:
            return step * power
    return 10 * power


def _short(value: float) -> str:
    for size, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if value >= size:
            return f"{value / size:g}{suffix}"
    return f"{value:g}"


def stacked_bars(
    days: Sequence[date], series: Sequence[Series], values: Mapping[tuple[date, int], float], title: str
) -> Markup:
    """An <svg> with one bar per day, stacked by series (values keyed by (day, series index)).

    Every bar segment has a <title> (the browser's tooltip) with the day, the
    series and the value; labels are escaped like the rest of the page.
    """
    plot_w = _WIDTH - _LEFT - _RIGHT
    plot_h = _HEIGHT - _TOP - _BOTTOM
    totals = [sum(values.get((day, i), 0.0) for i in range(len(series))) for day in days]
    top = _nice_ceiling(max(totals, default=0.0))
    slot = plot_w / max(len(days), 1)
    bar = max(slot * 0.7, 1.0)
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {_WIDTH} {_HEIGHT}" width="{_WIDTH}" height="{_HEIGHT}"'
        f' xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
    ]
    for fraction in (0, 0.5, 1):
        y = _TOP + plot_h * (1 - fraction)
        parts.append(
            f'<line x1="{_LEFT}" x2="{_WIDTH - _RIGHT}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d8dce3"/>'
            f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" text-anchor="end">{_short(top * fraction)}</text>'
        )
    label_every = max(1, len(days) // 10)
    for d, day in enumerate(days):
        x = _LEFT + d * slot + (slot - bar) / 2
        y = _TOP + plot_h
        for i, one in enumerate(series):
            value = values.get((day, i), 0.0)
            if value <= 0:
                continue
            h = plot_h * value / top
            y -= h
            parts.append(
                f'<rect class="bar" x="{x:.1f}" y="{y:.1f}" width="{bar:.1f}" height="{h:.1f}"'
                f' fill="{one.colour}">'
                f"<title>{escape(day.isoformat())} · {escape(one.label)}: {value:,.0f} tokens</title></rect>"
            )
        if d % label_every == 0:
            parts.append(
                f'<text x="{x + bar / 2:.1f}" y="{_HEIGHT - _BOTTOM + 16}" text-anchor="middle">'
                f"{day.strftime('%m-%d')}</text>"
            )
    parts.append("</svg>")
    return Markup("".join(parts))


_SMALL_W, _SMALL_H = 300, 90
_SMALL_LEFT, _SMALL_RIGHT, _SMALL_TOP, _SMALL_BOTTOM = 44, 6, 18, 14


def small_lines(
    title: str,
    times: Sequence[float],
    lines: Sequence[tuple[Series, Sequence[float | None]]],
    unit: str = "",
    span: str = "",
) -> Markup:
    """A small <svg> of one or more lines over times (seconds), each value None where there is none.

    For the pages' history: the title and the newest value of each line are written on it, so it
    reads without hovering. A gap (None) breaks its line.
    """
    newest = ", ".join(
        f"{one.label} {_reading(next((v for v in reversed(vs) if v is not None), None), unit)}"
        for one, vs in lines
    )
    below = [(_SMALL_LEFT, "start", span)] if span else []
    return _small(title, f"{title}: {newest}", times, lines, unit, below)


def level_lines(
    title: str,
    levels: Sequence[int],
    lines: Sequence[tuple[Series, Sequence[float | None]]],
    unit: str = "",
) -> Markup:
    """A small <svg> of lines over a benchmark's concurrency levels, each level labelled beneath.

    The levels are evenly spaced whatever their values (1, 4, 16, 64 would otherwise bunch at the
    left), and the header gives each line's value at the highest level.
    """
    at = ", ".join(f"{one.label} {_reading(vs[-1] if vs else None, unit)}" for one, vs in lines)
    xs = [float(i) for i in range(len(levels))]
    plot_w = _SMALL_W - _SMALL_LEFT - _SMALL_RIGHT
    width = max(len(levels) - 1, 1e-9)
    below = [
        (_SMALL_LEFT + plot_w * x / width, "middle", str(level)) for x, level in zip(xs, levels, strict=True)
    ]
    last = f" at {levels[-1]}" if levels else ""
    return _small(title, f"{title}{last}: {at}", xs, lines, unit, below)


def _small(
    title: str,
    header: str,
    xs: Sequence[float],
    lines: Sequence[tuple[Series, Sequence[float | None]]],
    unit: str,
    below: Sequence[tuple[float, str, str]],
) -> Markup:
    """small_lines and level_lines: the lines over xs, with texts below at (x, anchor, text)."""
    plot_w = _SMALL_W - _SMALL_LEFT - _SMALL_RIGHT
    plot_h = _SMALL_H - _SMALL_TOP - _SMALL_BOTTOM
    values = [v for _, vs in lines for v in vs if v is not None]
    top = _nice_ceiling(max(values, default=0.0))
    start, end = (xs[0], xs[-1]) if xs else (0.0, 1.0)
    width = max(end - start, 1e-9)
    parts = [
        f'<svg class="chart small" role="img" viewBox="0 0 {_SMALL_W} {_SMALL_H}" width="{_SMALL_W}"'
        f' height="{_SMALL_H}" xmlns="http://www.w3.org/2000/svg"><title>{escape(title)}</title>'
        f'<text x="{_SMALL_LEFT}" y="12">{escape(header)}</text>'
    ]
    for fraction in (0, 1):
        y = _SMALL_TOP + plot_h * (1 - fraction)
        right = _SMALL_W - _SMALL_RIGHT
        label = _short_unit(top * fraction, unit)
        parts.append(
            f'<line x1="{_SMALL_LEFT}" x2="{right}" y1="{y:.1f}" y2="{y:.1f}" stroke="#d8dce3"/>'
            f'<text x="{_SMALL_LEFT - 4}" y="{y + 4:.1f}" text-anchor="end">{label}</text>'
        )
    for x, anchor, text in below:
        parts.append(f'<text x="{x:.1f}" y="{_SMALL_H - 2}" text-anchor="{anchor}">{escape(text)}</text>')
    for one, vs in lines:
        runs: list[list[tuple[float, float]]] = [[]]
        for t, v in zip(xs, vs, strict=True):
            if v is None:
                runs.append([])
                continue
            runs[-1].append((_SMALL_LEFT + plot_w * (t - start) / width, _SMALL_TOP + plot_h * (1 - v / top)))
        for run in runs:
            if len(run) > 1:
                points = " ".join(f"{px:.1f},{py:.1f}" for px, py in run)
                parts.append(
                    f'<polyline fill="none" stroke="{one.colour}" stroke-width="1.5" points="{points}"/>'
                )
            elif run:
                px, py = run[0]
                parts.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="1.5" fill="{one.colour}"/>')
    parts.append("</svg>")
    return Markup("".join(parts))


def _reading(value: float | None, unit: str) -> str:
    if value is None:
        return "—"
    return _short_unit(value, unit)


def _short_unit(value: float, unit: str) -> str:
    if unit == "s":
        return f"{value * 1000:.3g} ms" if value < 1 else f"{value:.3g} s"
    if unit == "MB":
        return f"{value / 1024:.3g} GB" if value >= 1024 else f"{value:.3g} MB"
    return f"{_short(round(value, 2)) if value >= 1000 else f'{value:.3g}'}{unit}"
