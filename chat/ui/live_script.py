"""The page's part of a live reply (chat/live.py): live.js, which follows a reply's log over /chat
and renders it into the reply's box, and marked, the Markdown parser it renders with.

Each Gradio redraw of a reply being written starts it with an empty box
(`<div class="live-reply stream-ID">`, which chat/ui/messages.py draws with the log's id); live.js
renders the whole reply so far as Markdown into that box, with the same parser and options as
Gradio's chat (marked 12, GitHub-flavoured, line breaks kept), holding back a last line that could
still turn into other syntax (an opening fence, a list marker, a table row), so the visitor never
sees Markdown as text or a block changing form. While the box has content the page hides Gradio's
own copy of the text after it (style.py); that copy is there for a page whose script or socket
failed, and it shows for a moment before the box's first text, so it is settled the same way
(`messages.settled_copy`). When the reply ends Gradio draws the finished text, rendered the same way. The line beneath
the reply ("Writing… 0:03 · 41 tokens") travels with the text and the page shows it as the text
arrives (in the box `messages.live_line` draws), where Gradio's redraws would show it once a second.

Programs calling the Gradio API (`gradio_client` says so in a header) cannot run the script, so
they get every redraw's text through Gradio, without a box (`is_browser`).
"""

from __future__ import annotations

import json
from pathlib import Path

import gradio as gr
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from chat.api_schema import PAGE_ID
from chat.ui.gradio_internals import from_gradio_client
from chat.ui.messages import MAY_BECOME

_HERE = Path(__file__).parent
# marked, the Markdown parser Gradio's chat uses, run where no AMD loader or CommonJS module can
# claim it (it then sets window.marked). A script of its own, kept by the browser (its address names
# its version): inline, its 35 KB travelled in Gradio's configuration (where Gradio keeps `head`)
# with every visit, to be parsed before anything was drawn.
MARKED = (_HERE / "vendor" / "marked-12.0.2.min.js").read_text(encoding="utf-8")
MARKED_PATH = "page/marked-12.0.2.js"
# The one pattern of a last line that may still change form, which Gradio's copy holds back too.
SCRIPT = (_HERE / "live.js").read_text(encoding="utf-8").replace("/MAY_BECOME/", f"new RegExp({json.dumps(MAY_BECOME.pattern)})", 1)
HEAD = f'<script defer src="{MARKED_PATH}"></script><script>{SCRIPT}</script>'


def routes() -> list[Route]:
    """The page's copy of marked (relative to the page, as the page asks for it)."""
    script = f"(function (define, module, exports) {{\n{MARKED}\n}}).call(window);\n"

    async def marked(request: Request) -> Response:
        return Response(script, media_type="text/javascript",
                        headers={"Cache-Control": "public, max-age=31536000, immutable"})

    return [Route(f"/{MARKED_PATH}", marked, methods=["GET"])]


def is_browser(request: gr.Request | None) -> bool:
    """A page in a browser runs live.js; Gradio's own client says who it is (`from_gradio_client`)."""
    return request is not None and not from_gradio_client(request)



def page_id(value: object) -> str | None:
    """The id a page's turn names for the reply its script started, where it is one a page would pick."""
    return value if isinstance(value, str) and PAGE_ID.fullmatch(value) else None
