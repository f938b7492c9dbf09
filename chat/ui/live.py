"""Live reply text in the browser: new text goes over the page's WebSocket, not through Gradio's queue.

Gradio redraws a streaming chat by rebuilding, diffing and sending the whole conversation on every
update, in the one event loop that also runs the engine's output handler; with hundreds of replies
at once that work, not the engine, set the pace (bench/frontend.py measures it). So for a browser
the Chat tab and Compare write each reply's new text into a `ReplyLog` (the WebSocket API's own,
chat/reply_log.py) and redraw through Gradio only about once a second; the page's script
(live.js, loaded in the page's head) follows the log over /chat ("watch") and shows the text that
arrived since Gradio's last redraw in a placeholder after it (`stream-ID after-N`: the reply's log,
and how many of its deltas Gradio's redraw already holds). Gradio's redraw then carries that text
as Markdown, and the placeholder starts over from there.

Programs calling the Gradio API (`gradio_client` says so in a header) cannot run the script, so
they get every redraw's text through Gradio as before.
"""

from __future__ import annotations

import html
import time
import uuid
from pathlib import Path

import gradio as gr

from chat.reply_log import ReplyLog, ReplyStore

SCRIPT = (Path(__file__).with_name("live.js")).read_text(encoding="utf-8")
HEAD = f"<script>{SCRIPT}</script>"
REDRAW_S = 1.0  # Gradio redraws a live reply at most this often (the placeholder shows the rest)


def is_browser(request: gr.Request | None) -> bool:
    """A page in a browser runs live.js; Gradio's own client marks its requests as the API's."""
    return request is not None and request.headers.get("x-gradio-user") != "api"


class LiveText:
    """One reply's text as the page follows it: deltas in a log, Gradio redraws now and then."""

    def __init__(self, store: ReplyStore, redraw_s: float = REDRAW_S) -> None:
        self.log = ReplyLog(f"live-{uuid.uuid4().hex}")
        store.add(self.log)
        self.redraw_s = redraw_s
        self.sent = 0  # characters of the reply written into the log
        self.deltas = 0
        self._drawn_at = float("-inf")

    def write(self, text: str) -> None:
        """Add what `text` (the reply so far) has beyond what was written."""
        if len(text) > self.sent:
            self.log.add("delta", text=text[self.sent:], index=self.deltas)
            self.sent, self.deltas = len(text), self.deltas + 1

    def redraw_due(self) -> bool:
        """Whether Gradio should redraw now (the first text at once, then every `redraw_s`)."""
        now = time.monotonic()
        if now - self._drawn_at < self.redraw_s:
            return False
        self._drawn_at = now
        return True

    def drawn(self, text: str) -> str:
        """The part of the reply (`text`, so far) that Gradio draws now: what was written to the log."""
        drawn = text[: self.sent]
        if _inside_code_block(drawn):
            drawn += "\n```\n"  # the placeholder must not land inside a code block, where it shows as text
        return drawn

    def placeholder(self) -> str:
        """Where the page shows what arrives until the next redraw (live.js fills it)."""
        # In its class names: Gradio's HTML sanitiser keeps classes and drops data- attributes.
        return f'<span class="live-reply stream-{html.escape(self.log.id)} after-{self.deltas}"></span>'

    def end(self) -> None:
        if self.log.running:
            self.log.add("done")
            self.log.end()


def _inside_code_block(markdown: str) -> bool:
    fences = sum(1 for line in markdown.splitlines() if line.lstrip().startswith("```"))
    return fences % 2 == 1
