"""The browser UI (the only package that imports Gradio): Chat, Compare, Leaderboard and Monitor
tabs, and Capacity for administrators.

`CSS` and `HEAD` (the page's scripts) go to `demo.launch(css=..., head=...)`.
"""

from __future__ import annotations

from typing import Any

from chat.ui import gradio_import  # noqa: F401  first: it must see Gradio load (chat/ui/gradio_import.py)

# isort: split
import gradio as gr

from chat.admin import Admins
from chat.capacity_run import CapacityLab
from chat.compare_service import CompareService
from chat.live import ReplyStore
from chat.monitor import Monitor
from chat.service import ChatService
from chat.ui import gradio_internals
from chat.ui.capacity_tab import capacity_tab
from chat.ui.chat_tab import ENGINE_LINE_SCRIPT, chat_tab
from chat.ui.compare_api import compare_api
from chat.ui.compare_tab import compare_tab
from chat.ui.lazy import build_when_opened
from chat.ui.leaderboard_tab import Standings, leaderboard_api, leaderboard_tab
from chat.ui.live_script import HEAD as LIVE_SCRIPT
from chat.ui.monitor_tab import monitor_tab
from chat.ui.reply_api import reply_api
from chat.ui.style import CSS
from chat.ui.style import HEAD as MENDS_SCRIPT
from chat.votes import VoteStore

__all__ = ["CSS", "HEAD", "build_ui"]

HEAD = MENDS_SCRIPT + LIVE_SCRIPT + ENGINE_LINE_SCRIPT

OPEN_SHARED_LINK = "() => { if (new URLSearchParams(location.search).has('p')) document.querySelector('#tab-compare-button')?.click(); }"
BANNER_REFRESH_S = 5.0  # how soon every page notices that a capacity test started or ended
QUIET: dict[str, Any] = {"queue": False, "api_visibility": "private", "show_progress": "hidden"}


def build_ui(
    service: ChatService, monitor: Monitor, logs: ReplyStore, *,
    store: VoteStore | None = None, admins: Admins | None = None, lab: CapacityLab | None = None,
) -> gr.Blocks:
    """The page; its tabs write the replies a page follows into `logs` (which /chat serves).
    Without a vote store, votes last only in the page and there is no Leaderboard tab; without
    anyone who can be an administrator (`--admins`, `--admin-local`), no Capacity tab."""
    gradio_internals.install()
    admins = admins or Admins()
    comparisons = CompareService(service)  # one for the tab and the API: one turn at a time per session
    # Gradio keeps a copy of every file it serves: emptied of what is over an hour old (chat/ui/downloads.py).
    with gr.Blocks(title="vLLM chat demo", fill_height=True, delete_cache=(1800, 3600)) as demo:
        if lab is None and admins.anyone_can_be:
            lab = CapacityLab(service)
        if lab is not None:
            capacity_banner(lab)
        # "wrap", not a "⋯" menu for tabs without room; on a phone the page's CSS keeps them on one row.
        # Only Chat is made with the page; the others when first opened (chat/ui/lazy.py says why).
        with gr.Tabs(overflow_behavior="wrap") as tabs:
            with gr.Tab("Chat", id="chat"):
                chat_tab(service, logs)
            with gr.Tab("Compare", id="compare", elem_id="tab-compare") as compare_page:
                build_when_opened(compare_page, lambda: compare_tab(comparisons, logs, demo, tabs, store))
            standings = Standings(store) if store is not None else None
            if standings is not None:
                with gr.Tab("Leaderboard", id="leaderboard") as leaderboard_page:
                    build_when_opened(leaderboard_page, lambda: leaderboard_tab(standings, admins, demo, leaderboard_page))
            with gr.Tab("Monitor", id="monitor") as monitor_page:
                build_when_opened(monitor_page, lambda: monitor_tab(monitor))
            if lab is not None:
                with gr.Tab("Capacity", id="capacity", visible=False) as capacity_page:
                    capacity = capacity_tab(service, lab, admins)

                def show_capacity(request: gr.Request) -> Any:  # hidden from others; its events check again
                    return gr.Tab(visible=admins.allows_request(request))

                demo.load(show_capacity, None, [capacity_page], **QUIET)
                # Stop works for a test already running when the page opens (a reload, a second admin).
                # It only ever enables: off the queue, this answer may land after a run this page began
                # has enabled Stop, and the run's later updates would not enable it again (Gradio sends
                # a streaming event's outputs as changes, and to the run nothing changed).
                capacity_page.select(lambda: gr.Button(interactive=True) if lab.busy() else gr.skip(), None,
                                     [capacity.stop_button], **QUIET)
        # A share link (?p=...) opens Compare as a click on its tab would; once made, the tab reads
        # the link (CompareTab.open_link). In the browser: a page without a link sends nothing.
        demo.load(None, js=OPEN_SHARED_LINK, api_visibility="private")
        # Endpoints for programs, outside the tabs (a component among a Tabs' children reads as a tab).
        compare_api(comparisons, store)
        if standings is not None:
            leaderboard_api(standings)
        reply_api(service)
    gradio_internals.enable_queue(demo)
    return demo


def capacity_banner(lab: CapacityLab) -> None:
    """A line at the top of every page while a capacity test runs (replies may be slower then)."""
    banner = gr.Markdown("", visible=False, elem_id="capacity-banner")

    def say_if_testing() -> Any:
        text = lab.banner()
        return gr.Markdown(f"⏱ {text}", visible=True) if text else gr.Markdown(visible=False)

    gr.Timer(BANNER_REFRESH_S).tick(say_if_testing, None, [banner], **QUIET)
