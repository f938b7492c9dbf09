"""The Monitor tab: the last minutes of load on each loaded engine, refreshed every few seconds.

Readable on a phone: each chart's title is its label above it (wrapping as a line of text does,
where the plot's own title was cut at the chart's edges), one legend above all six names each
preset's colour at the page's text size (the plot's own legend draws names at 10 px), and a chart
takes a row of its own when two do not fit side by side."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import gradio as gr
import pandas as pd

from chat.charts import COLOURS
from chat.monitor import CHARTS, ChartData, Monitor

TIME = "Time"
PRESET = "Preset"
REFRESH_S = 3.0
# d3-time-format, drawn in the browser's time zone: "4:05:30 PM". With seconds, because the axis
# ticks every 15 or 30 s on a five-minute chart and "4:05 PM" would repeat. (Vega-Lite's
# per-unit format object would do better, but Gradio's plot cannot pass an object through.)
CLOCK = "%-I:%M:%S %p"
CHART_MIN_WIDTH = 320  # two charts side by side from about 700 px; one a row on a phone


def frame(data: ChartData) -> pd.DataFrame:
    """The chart's points as the plot takes them: columns named in words, times as datetimes (UTC), a
    gap as null (Vega-Lite breaks a line at an invalid value: its mark.invalid default since 5.19)."""
    times, presets, values = zip(*data.points, strict=True) if data.points else ((), (), ())
    return pd.DataFrame({
        TIME: pd.to_datetime(pd.Series(times, dtype="float64"), unit="s"),
        PRESET: pd.Series(presets, dtype="string"),
        # Nullable: a missing value is sent as null, where the chart breaks its line.
        data.chart.y_title: pd.Series(values, dtype="Int64" if data.chart.digits == 0 else "float64"),
    })


def colours(charts: Sequence[ChartData]) -> dict[str, str]:
    """Each preset's colour, the same in every chart (by name, so a refresh does not swap them)."""
    presets = sorted({preset for data in charts for _, preset, _ in data.points})
    return {preset: COLOURS[i % len(COLOURS)] for i, preset in enumerate(presets)}


def legend(colour_of: dict[str, str]) -> str:
    items = "".join(f'<li><span class="swatch" style="background: {colour}"></span>{html.escape(preset)}</li>'
                    for preset, colour in colour_of.items())
    return f'<ul class="chart-legend" aria-label="{PRESET}">{items}</ul>'


def updates(monitor: Monitor, now: float | None = None) -> list[Any]:
    """The note, the charts' column, the legend, then each chart: the note alone when nothing happened."""
    charts = monitor.charts(now)
    if charts is None:
        return [gr.Markdown(monitor.quiet_message, visible=True), gr.Column(visible=False), gr.skip(),
                *(gr.skip() for _ in CHARTS)]
    colour_of = colours(charts)
    return [
        gr.Markdown(visible=False),
        gr.Column(visible=True),
        legend(colour_of),
        *(
            gr.LinePlot(frame(data), x_lim=list(data.x_lim), y_lim=list(data.y_lim), caption=data.note,
                        color_map=colour_of)
            for data in charts
        ),
    ]


def monitor_tab(monitor: Monitor) -> None:
    gr.Markdown(
        "Load on each loaded engine over the last minutes, sampled every few seconds. "
        "Many replies waiting means the demo is busy; a slow first token with few waiting means the model is slow.",
        elem_id="monitor-intro",
    )
    note = gr.Markdown(monitor.quiet_message, elem_id="monitor-empty")
    plots = []
    with gr.Column(visible=False, elem_id="monitor-charts") as column:
        key = gr.HTML("", elem_id="monitor-legend", js_on_load=None)
        for pair in (CHARTS[0:2], CHARTS[2:4], CHARTS[4:6]):
            with gr.Row():
                for chart in pair:
                    plots.append(gr.LinePlot(
                        x=TIME, y=chart.y_title, color=PRESET, label=chart.title, show_label=True, x_title=TIME,
                        y_title=chart.y_title, x_axis_format=CLOCK, y_axis_format="d" if chart.counts else None,
                        colors_in_legend=[], min_width=CHART_MIN_WIDTH, elem_id=f"monitor-{chart.field}",
                    ))
    timer = gr.Timer(REFRESH_S)
    timer.tick(lambda: updates(monitor), None, [note, column, key, *plots], queue=False, api_visibility="undocumented",
               show_progress="hidden")
