"""Charts drawn as SVG text: ratings with their intervals (the leaderboard) and lines against the
number of users (the capacity test).

Gradio's plots cannot draw an interval bar around a point, so these charts are drawn here: crisp at
any size, with real text a reader can select and a test can read, and the same picture on the page
and in the PNG the browser saves from it (chat/ui/svg_png.py). Each chart carries its caption
(presets, settings, machine) inside the SVG, so a saved image says what it shows. No Gradio here.
"""

from __future__ import annotations

import html
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

# Okabe-Ito colours: told apart by readers with every common kind of colour blindness.
COLOURS = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")
INK, FAINT, GRID = "#1f2937", "#6b7280", "#e5e7eb"
FONT = "font-family: system-ui, -apple-system, 'Segoe UI', sans-serif"
CAPTION_LINE = 16


def _text(x: float, y: float, text: str, *, size: int = 12, anchor: str = "start", fill: str = INK,
          weight: str = "normal", cls: str = "") -> str:
    klass = f' class="{cls}"' if cls else ""
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}" '
            f'font-weight="{weight}"{klass}>{html.escape(text)}</text>')


def _svg(width: int, height: int, body: Sequence[str], label: str) -> str:
    # A white card in both themes: the chart is also saved as an image and pasted into documents.
    return (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label="{html.escape(label)}" style="{FONT}; max-width: 100%; '
            f'height: auto">\n<rect width="{width}" height="{height}" fill="#ffffff"/>\n' + "\n".join(body) + "\n</svg>")


def nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) covering low..high."""
    if not math.isfinite(low) or not math.isfinite(high):
        return [0.0]
    if high <= low:
        high = low + (abs(low) or 1.0)
    raw = (high - low) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value < high + step * 0.999:
        ticks.append(round(value, 10))
        value += step
    return ticks


def _number(value: float) -> str:
    if abs(value) >= 100 or value == int(value):
        return f"{value:,.0f}"
    return f"{value:.1f}" if abs(value) >= 10 else f"{value:.2g}"


def _caption(lines: Sequence[str], x: float, y: float, size: int = 11) -> list[str]:
    return [_text(x, y + i * CAPTION_LINE, line, size=size, fill=FAINT, cls="caption") for i, line in enumerate(lines)]


# --- ratings with intervals ------------------------------------------------------------------


@dataclass(frozen=True)
class Interval:
    """One row of an interval chart: a point estimate and its interval."""

    label: str
    value: float
    low: float
    high: float
    detail: str = ""  # shown when the row is hovered
    note: str | None = None  # said instead of "(low–high)" beside the value, e.g. when the interval has no width


NARROW = 340  # the narrow drawing's width: a phone's screen less the page's margins
LETTER = 0.6  # a letter's width in em, rounded up (system-ui averages about 0.55): to fit text in advance


def fit(text: str, size: float, room: float) -> str:
    """`text`, cut with "…" where it would not fit `room` pixels at font `size`."""
    most = max(int(room / (size * LETTER)), 1)
    return text if len(text) <= most else text[:most - 1] + "…"


def wrap(text: str, size: float, room: float) -> list[str]:
    """`text` in lines of whole words that fit `room` pixels at font `size`."""
    most = max(int(room / (size * LETTER)), 1)
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= most:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines


def interval_chart(rows: Sequence[Interval], *, title: str, axis_title: str, reference: float | None = None,
                   reference_label: str = "", caption: Sequence[str] = (), width: int = 820) -> str:
    """One row per item, best first as given: a dot at the value and a bar across its interval.
    Narrower than 500 (`NARROW` for a phone), each name and value sit on lines of their own above
    the bar, so that the text can stay at 12 px or more where a wide drawing would be shrunk to half
    its size."""
    values = [v for row in rows for v in (row.low, row.high, row.value)] + ([reference] if reference is not None else [])
    ticks = nice_ticks(min(values), max(values)) if values else [0.0, 1.0]
    lo, hi = ticks[0], ticks[-1]
    narrow = width < 500
    if narrow:  # the name, then the value, each on a line of its own above the bar
        left, right, top, row_h, name_size = 20, 20, 62, 62, 13
    else:  # name left of the bar, value right of it
        left, right, top, row_h, name_size = 270, 170, 44, 30, 12
    plot_w = width - left - right
    bottom = top + row_h * max(len(rows), 1)
    notes = [line for text in caption for line in wrap(text, 12, width - 32)]
    height = bottom + 58 + CAPTION_LINE * len(notes)

    def x(value: float) -> float:
        return left + (value - lo) / ((hi - lo) or 1) * plot_w

    body = [_text(16, 24, title, size=15, weight="600")]
    for tick in ticks:
        body.append(f'<line x1="{x(tick):.1f}" y1="{top - 6}" x2="{x(tick):.1f}" y2="{bottom}" stroke="{GRID}"/>')
        body.append(_text(x(tick), bottom + 18, _number(tick), size=12, anchor="middle", fill=FAINT))
    body.append(_text(left + plot_w / 2, bottom + 38, axis_title, size=12, anchor="middle", fill=FAINT))
    if reference is not None:
        body.append(f'<line x1="{x(reference):.1f}" y1="{top - 10}" x2="{x(reference):.1f}" y2="{bottom}" '
                    f'stroke="{FAINT}" stroke-dasharray="4 3"/>')
        body.append(_text(x(reference), top - 14, reference_label, size=12, anchor="middle", fill=FAINT))
    for i, row in enumerate(rows):
        spread = row.note if row.note is not None else f"{row.low:.0f}–{row.high:.0f}"
        value = f"{row.value:.0f} ({spread})"
        colour = COLOURS[0]
        body.append(f'<g class="row"><title>{html.escape(row.detail or row.label)}</title>')
        if narrow:
            y: float = top + row_h * i + 46
            body.append(_text(16, y - 30, fit(row.label, name_size, width - 32), size=name_size, weight="600", cls="label"))
            body.append(_text(16, y - 13, value, size=12, fill=FAINT, cls="value"))
        else:
            y = top + row_h * i + row_h / 2
            body.append(_text(left - 10, y + 4, fit(row.label, name_size, left - 26), anchor="end", cls="label"))
            body.append(_text(width - right + 12, y + 4, value, size=12, cls="value"))
        body.append(f'<line x1="{x(row.low):.1f}" y1="{y:.1f}" x2="{x(row.high):.1f}" y2="{y:.1f}" '
                    f'stroke="{colour}" stroke-width="3" stroke-linecap="round"/>')
        for end in (row.low, row.high):
            body.append(f'<line x1="{x(end):.1f}" y1="{y - 6:.1f}" x2="{x(end):.1f}" y2="{y + 6:.1f}" stroke="{colour}" stroke-width="2"/>')
        body.append(f'<circle cx="{x(row.value):.1f}" cy="{y:.1f}" r="5.5" fill="{colour}" stroke="#ffffff" stroke-width="1.5"/>')
        body.append("</g>")
    body += _caption(notes, 16, bottom + 62, size=12)
    return _svg(width, height, body, title)


# --- lines against the number of users -------------------------------------------------------


@dataclass(frozen=True)
class Series:
    """One line: (x, y) points in x order; a y of None leaves a gap."""

    name: str
    points: Sequence[tuple[float, float | None]]
    colour: str = COLOURS[0]
    dashed: bool = False
    marked: Sequence[float] = ()  # x values circled (e.g. the most users within the target)


@dataclass(frozen=True)
class Panel:
    title: str
    y_title: str
    series: Sequence[Series]
    rule: float | None = None  # a horizontal line, e.g. the target
    rule_label: str = ""
    y_from_zero: bool = True


@dataclass(frozen=True)
class Legend:
    entries: Sequence[tuple[str, str, bool]] = field(default_factory=tuple)  # (name, colour, dashed)


def line_panels(panels: Sequence[Panel], xs: Sequence[float], *, title: str, x_title: str,
                legend: Legend = Legend(), caption: Sequence[str] = (), panel_w: int = 300) -> str:
    """Panels side by side sharing one x axis (placed on a log-2 scale: 1, 2, 4, 8 … users apart evenly)."""
    gap, left, top, plot_h = 28, 56, 64, 190
    width = left + len(panels) * (panel_w + gap)
    legend_y = top + plot_h + 58
    height = legend_y + 14 + CAPTION_LINE * (len(caption) + 1)
    xs = sorted(set(xs)) or [1.0]
    lx = [math.log2(max(v, 1e-9)) for v in xs]
    x_lo, x_hi = min(lx), max(lx)
    body = [_text(16, 24, title, size=15, weight="600")]
    for index, panel in enumerate(panels):
        x0 = left + index * (panel_w + gap)
        inner = panel_w - 24

        def x(value: float, x0: float = x0, inner: float = inner) -> float:
            if x_hi == x_lo:
                return x0 + inner / 2
            return x0 + 12 + (math.log2(max(value, 1e-9)) - x_lo) / (x_hi - x_lo) * (inner - 12)

        ys = [y for s in panel.series for _, y in s.points if y is not None] + ([panel.rule] if panel.rule is not None else [])
        ticks = nice_ticks(0.0 if panel.y_from_zero else min(ys, default=0.0), max(ys, default=1.0) or 1.0)
        y_lo, y_hi = ticks[0], ticks[-1]

        def y(value: float, y_lo: float = y_lo, y_hi: float = y_hi) -> float:
            return top + plot_h - (value - y_lo) / ((y_hi - y_lo) or 1) * plot_h

        body.append(_text(x0, top - 18, panel.title, size=13, weight="600"))
        body.append(_text(x0, top - 4, panel.y_title, size=11, fill=FAINT))
        for tick in ticks:
            body.append(f'<line x1="{x0}" y1="{y(tick):.1f}" x2="{x0 + inner}" y2="{y(tick):.1f}" stroke="{GRID}"/>')
            body.append(_text(x0 - 6, y(tick) + 4, _number(tick), size=10, anchor="end", fill=FAINT))
        for value in xs:
            body.append(_text(x(value), top + plot_h + 16, _number(value), size=10, anchor="middle", fill=FAINT))
        body.append(_text(x0 + inner / 2, top + plot_h + 34, x_title, size=11, anchor="middle", fill=FAINT))
        if panel.rule is not None:
            body.append(f'<line x1="{x0}" y1="{y(panel.rule):.1f}" x2="{x0 + inner}" y2="{y(panel.rule):.1f}" '
                        f'stroke="#b91c1c" stroke-dasharray="6 4"/>')
            body.append(_text(x0 + inner, y(panel.rule) - 5, panel.rule_label, size=10, anchor="end", fill="#b91c1c"))
        for series in panel.series:
            dash = ' stroke-dasharray="5 4"' if series.dashed else ""
            run: list[str] = []
            for px, py in [*series.points, (math.nan, None)]:
                if py is None:
                    if len(run) > 1:
                        body.append(f'<polyline points="{" ".join(run)}" fill="none" stroke="{series.colour}" stroke-width="2"{dash}/>')
                    run = []
                    continue
                run.append(f"{x(px):.1f},{y(py):.1f}")
                body.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="3.5" fill="{series.colour}">'
                            f'<title>{html.escape(f"{series.name}: {_number(py)} at {_number(px)}")}</title></circle>')
                if px in series.marked:
                    body.append(f'<circle cx="{x(px):.1f}" cy="{y(py):.1f}" r="8" fill="none" stroke="{series.colour}" stroke-width="2"/>')
    cursor = 16.0
    for name, colour, dashed in legend.entries:
        dash = ' stroke-dasharray="5 4"' if dashed else ""
        body.append(f'<line x1="{cursor}" y1="{legend_y - 4}" x2="{cursor + 24}" y2="{legend_y - 4}" stroke="{colour}" stroke-width="2"{dash}/>')
        body.append(_text(cursor + 30, legend_y, name, size=11, cls="legend"))
        cursor += 44 + 6.5 * len(name)
    body += _caption(caption, 16, legend_y + 24)
    return _svg(width, height, body, title)
