"""How a reply reaches a browser while it is written: the one module Chat and Compare use for it.

Gradio redraws a streaming chat by rebuilding, diffing and sending the whole conversation on every
update, in the one event loop that also runs the engine's output handler; with hundreds of replies
at once that work, not the engine, set the pace (bench/frontend.py measures it). So for a browser
each reply's new text goes into a `ReplyLog` (the WebSocket API's own, chat/reply_log.py) and
Gradio redraws the reply only now and then. Each redraw starts the reply with an empty box
(`<div class="live-reply stream-ID">`, which chat/ui/messages.py draws with the log's id); the
page's script (live.js, in the page's head) follows the log over /chat ("watch") and renders the
whole reply so far as Markdown into that box, with the same parser and options as Gradio's chat
(marked 12, GitHub-flavoured, line breaks kept), holding back a last line that could still turn
into other syntax (an opening fence, a list marker, a table row), so the visitor never sees Markdown as text or a block changing form. While the box has
content the page hides Gradio's own copy of the text after it (style.py); that copy is there for a
page whose script or socket failed. When the reply ends Gradio draws the finished text, rendered
the same way. The line beneath the reply ("Writing… 0:03 · 41 tokens") travels with the text and
the page shows it as the text arrives (in the box `messages.live_line` draws), where Gradio's
redraws would show it once a second.

Programs calling the Gradio API (`gradio_client` says so in a header) cannot run the script, so
they get every redraw's text through Gradio, without a box.

The tabs hand their events over whole: `live_reply` takes a Chat reply's, `live_columns` a
comparison's turn, and each gives back only what Gradio should draw, with the logs' ids.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path

import gradio as gr
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from chat.compare_service import Begun, CompareEvent, Ended, Redraw, Wrote
from chat.reply_log import REDRAW_S, LiveText, ReplyStore
from chat.service import ReplyEvent, Writing

_HERE = Path(__file__).parent
# marked, the Markdown parser Gradio's chat uses, run where no AMD loader or CommonJS module can
# claim it (it then sets window.marked). A script of its own, kept by the browser (its address names
# its version): inline, its 35 KB travelled in Gradio's configuration (where Gradio keeps `head`)
# with every visit, to be parsed before anything was drawn.
MARKED = (_HERE / "vendor" / "marked-12.0.2.min.js").read_text(encoding="utf-8")
MARKED_PATH = "page/marked-12.0.2.js"
SCRIPT = (_HERE / "live.js").read_text(encoding="utf-8")
HEAD = f'<script defer src="{MARKED_PATH}"></script><script>{SCRIPT}</script>'


def routes() -> list[Route]:
    """The page's copy of marked (relative to the page, as the page asks for it)."""
    script = f"(function (define, module, exports) {{\n{MARKED}\n}}).call(window);\n"

    async def marked(request: Request) -> Response:
        return Response(script, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=31536000, immutable"})

    return [Route(f"/{MARKED_PATH}", marked, methods=["GET"])]


def is_browser(request: gr.Request | None) -> bool:
    """A page in a browser runs live.js; Gradio's own client marks its requests as the API's."""
    return request is not None and request.headers.get("x-gradio-user") != "api"


async def live_reply(events: AsyncIterator[ReplyEvent], store: ReplyStore, request: gr.Request | None,
                     begun: LiveText | None = None) -> AsyncGenerator[tuple[ReplyEvent, str | None], None]:
    """The Chat tab's reply (`ChatService.reply`'s events) as Gradio should draw it, each with the id
    of the log a page follows (None for the API, which gets every event): for a page, every piece of
    text goes into the log and only the redraws that are due come through. `begun`: the live text of
    a reply the page began (chat/early_reply.py), whose text is in its log already. Closing it closes `events`."""
    live = begun or (LiveText(store) if is_browser(request) else None)
    try:
        async with contextlib.aclosing(events):  # type: ignore[type-var]
            async for event in events:
                if live is not None and isinstance(event, Writing):
                    if begun is None:
                        live.write(event.reply.text, event.line)
                    if not live.redraw_due():
                        continue
                yield event, live.log.id if live is not None else None
    finally:
        if live is not None:
            live.end()


async def live_columns(send: Callable[[float], AsyncGenerator[CompareEvent, None]], store: ReplyStore,
                       request: gr.Request | None) -> AsyncGenerator[tuple[Begun | Redraw | Ended, dict[int, str]], None]:
    """A comparison's turn (`send(every_s)`: `CompareService.send` or `rerun`, asked to redraw a page
    at most every REDRAW_S) as Gradio should draw it, each event with the ids of the logs a page
    follows, by job (none for the API): for a page, each column's text goes into a log of its own.
    Blind, the line beneath a column is not sent: its figures would tell the columns apart."""
    browser = is_browser(request)
    lives: dict[int, LiveText] = {}
    events = send(REDRAW_S if browser else 0.0)
    try:
        async with contextlib.aclosing(events):
            blind = False
            async for event in events:
                if isinstance(event, Wrote):
                    if (live := lives.get(id(event.job))) is not None:
                        live.write(event.writing.reply.text, None if blind else event.writing.line)
                    continue
                if isinstance(event, Begun):
                    blind = event.comparison.hides_stats
                    lives = {id(job): LiveText(store) for job in event.jobs} if browser else {}
                yield event, {job: live.log.id for job, live in lives.items()}
    finally:
        for live in lives.values():
            live.end()
