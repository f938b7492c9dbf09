"""The Monitor tab: the last minutes of load on each loaded engine, refreshed every few seconds."""

from __future__ import annotations

import gradio as gr
import pandas as pd

from chat.monitor import Monitor

_CHARTS = (
    ("tokens_per_s", "Tokens generated per second"),
    ("running", "Replies being written"),
    ("waiting", "Replies waiting for a slot"),
    ("kv_cache_percent", "KV cache used (%)"),
    ("ttft_p50_ms", "Time to first token, median over the last minute (ms)"),
    ("ttft_p95_ms", "Time to first token, 95th percentile over the last minute (ms)"),
)


def frames(monitor: Monitor) -> list[pd.DataFrame]:
    samples = monitor.recent()
    table = pd.DataFrame(
        {
            "time": pd.to_datetime([s.at for s in samples], unit="s"),
            "preset": [s.preset for s in samples],
            **{field: [getattr(s, field) for s in samples] for field, _ in _CHARTS},
        }
    )
    return [table[["time", "preset", field]].dropna() for field, _ in _CHARTS]


def monitor_tab(monitor: Monitor) -> None:
    gr.Markdown(
        "Load on each loaded engine over the last minutes, sampled every few seconds. "
        "Many replies waiting means the demo is busy; a slow first token with few waiting means the model is slow.",
        elem_id="monitor-intro",
    )
    plots = []
    for pair in (_CHARTS[0:2], _CHARTS[2:4], _CHARTS[4:6]):
        with gr.Row():
            for field, title in pair:
                plots.append(gr.LinePlot(x="time", y=field, color="preset", title=title, x_title="", y_title="", height=240))
    timer = gr.Timer(3.0)
    timer.tick(lambda: frames(monitor), None, plots, queue=False, api_visibility="undocumented", show_progress="hidden")
