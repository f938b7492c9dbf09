"""The Monitor tab: the last minutes of load on each loaded engine, refreshed every few seconds."""

from __future__ import annotations

from typing import Any

import gradio as gr
import pandas as pd

from chat.monitor import CHARTS, ChartData, Monitor

TIME = "Time"
PRESET = "Preset"
REFRESH_S = 3.0
# d3-time-format, drawn in the browser's time zone: "4:05:30 PM". With seconds, because the axis
# ticks every 15 or 30 s on a five-minute chart and "4:05 PM" would repeat. (Vega-Lite's
# per-unit format object would do better, but Gradio's plot cannot pass an object through.)
CLOCK = "%-I:%M:%S %p"


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


def updates(monitor: Monitor, now: float | None = None) -> list[Any]:
    """The note, the charts' column, then each chart: the note alone when nothing happened."""
    charts = monitor.charts(now)
    if charts is None:
        return [gr.Markdown(monitor.quiet_message, visible=True), gr.Column(visible=False), *(gr.skip() for _ in CHARTS)]
    return [
        gr.Markdown(visible=False),
        gr.Column(visible=True),
        *(
            gr.LinePlot(frame(data), x_lim=list(data.x_lim), y_lim=list(data.y_lim), caption=data.note)
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
        for pair in (CHARTS[0:2], CHARTS[2:4], CHARTS[4:6]):
            with gr.Row():
                for chart in pair:
                    plots.append(gr.LinePlot(
                        x=TIME, y=chart.y_title, color=PRESET, title=chart.title, x_title=TIME, y_title=chart.y_title,
                        x_axis_format=CLOCK,
                        y_axis_format="d" if chart.counts else None, height=240, elem_id=f"monitor-{chart.field}",
                    ))
    timer = gr.Timer(REFRESH_S)
    timer.tick(lambda: updates(monitor), None, [note, column, *plots], queue=False, api_visibility="undocumented",
               show_progress="hidden")
