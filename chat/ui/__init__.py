"""The browser UI (the only package that imports Gradio): Chat, Compare and Monitor tabs.

`CSS` (chat/ui/style.py) goes to `demo.launch(css=...)`.
"""

from __future__ import annotations

import gradio as gr

from chat.monitor import Monitor
from chat.service import ChatService
from chat.ui import gradio_internals
from chat.ui.chat_tab import chat_tab
from chat.ui.compare_tab import compare_tab
from chat.ui.monitor_tab import monitor_tab
from chat.ui.reply_api import reply_api
from chat.ui.style import CSS

__all__ = ["CSS", "build_ui"]

def build_ui(
    service: ChatService, monitor: Monitor, *, concurrency_limit: int | None = None
) -> gr.Blocks:
    gradio_internals.install()
    with gr.Blocks(title="vLLM chat demo", fill_height=True) as demo:
        with gr.Tabs() as tabs:
            with gr.Tab("Chat", id="chat"):
                chat_tab(service, concurrency_limit=concurrency_limit)
            with gr.Tab("Compare", id="compare"):
                compare_tab(service, demo, tabs)
            with gr.Tab("Monitor", id="monitor"):
                monitor_tab(monitor)
        reply_api(service)
    gradio_internals.enable_queue(demo)
    return demo
