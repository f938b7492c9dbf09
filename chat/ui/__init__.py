"""The browser UI (the only package that imports Gradio): Chat, Compare and Monitor tabs."""

from __future__ import annotations

import gradio as gr

from chat.monitor import Monitor
from chat.service import ChatService
from chat.stream import FLUSH_S
from chat.ui import gradio_overhead
from chat.ui.chat_tab import chat_tab, settings_sidebar
from chat.ui.compare_tab import compare_tab
from chat.ui.monitor_tab import monitor_tab


def build_ui(
    service: ChatService, monitor: Monitor, *, concurrency_limit: int | None = None, flush_s: float = FLUSH_S
) -> gr.Blocks:
    gradio_overhead.install()
    with gr.Blocks(title="vLLM chat demo", fill_height=True) as demo:
        settings = settings_sidebar(service)  # first, so the chat finds its inputs already rendered
        with gr.Tabs() as tabs:
            with gr.Tab("Chat", id="chat"):
                chat_tab(service, settings, concurrency_limit=concurrency_limit, flush_s=flush_s)
            with gr.Tab("Compare", id="compare"):
                compare_tab(service, demo, tabs, flush_s=flush_s)
            with gr.Tab("Monitor", id="monitor"):
                monitor_tab(monitor)
    gradio_overhead.enable_queue(demo)
    return demo
