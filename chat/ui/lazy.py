"""Tabs whose contents are made the first time they are opened, not with the page.

Gradio's page builds every component and event of every tab before it shows the first one, and
then walks all of them on every event: on a phone (Lighthouse's throttled profile) the Compare,
Leaderboard and Monitor tabs cost about a second of main-thread time and 0.5 s of largest paint
for a Chat-tab visitor who may never open them. Made on first opening (with `gr.render`), they
stay made for the rest of the visit: their values and running events survive switching tabs.

Their events exist only in the pages that opened them, so programs reach these tabs' work through
component-free endpoints (`gr.api`) defined with the page, not through the tabs' events.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

QUIET: dict[str, Any] = {"api_visibility": "private", "show_progress": "hidden"}


def build_when_opened(tab: gr.Tab, build: Callable[[], object]) -> None:
    """Make `build()`'s components in `tab` (call inside it) when the tab is first selected.

    The selection sets an "opened" state, whose change makes them: it changes once, so they are made
    once per page. The selecting event is queued because Gradio runs a state's change only then."""
    opened = gr.State(False)

    # One tab is made at a time (two of one page at once broke Gradio: "dictionary changed size during
    # iteration"): the adapter runs every render's event alone, on the queue and on Gradio's direct
    # route alike (chat/ui/gradio_internals.py, item 4). Each takes a moment, once per page.
    @gr.render(inputs=[opened], triggers=[opened.change], show_progress="hidden")  # type: ignore[untyped-decorator]
    def contents(is_open: bool) -> None:
        if is_open:
            build()

    tab.select(lambda: True, None, [opened], concurrency_limit=None, **QUIET)
