"""What a visitor sees before Gradio's scripts have drawn the page.

Gradio's page arrives as an empty `<gradio-app>` element and a configuration; its scripts build
every component before anything is drawn, which on a mid-range phone takes seconds (Lighthouse's
phone profile: the title appeared after about 5 s, a blank page until then). The page now carries
the Chat tab's title in its HTML, drawn where Gradio will draw it and in the same type, so the
visitor reads what the page is at once; it goes away the moment Gradio draws its own (the CSS below,
no script). It takes no room in the layout (absolutely placed), so nothing moves when it goes.

Not for a page behind a login: Gradio draws a login form there, not the title. Every page, that one
too, carries `STATUS_TIMERS` (chat/ui/status_timers.js), which must run before Gradio's scripts: it
ends the loop that Gradio's page-loading indicator leaves running for the page's life.
"""

from __future__ import annotations

import html
from pathlib import Path

from starlette.datastructures import MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from chat.presets import Preset

# With the shell in the page's HTML: Gradio's `head` and `css` arrive inside its configuration and
# take effect only once its scripts run. Sizes and places copy Gradio's: its page is at most 1280 px wide with 32 px margins (10 px on a
# phone, style.py), the tabs take the first 72 px, the title is a prose h2 (1.25rem on a phone).
STYLE = """
#page-shell { position: absolute; top: 0; left: 0; right: 0; box-sizing: border-box; max-width: 1280px;
              margin: 0 auto; padding: 72px 32px 0; pointer-events: none; color: #27272a;
              font-family: ui-sans-serif, system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; }
#page-shell h2 { margin: 0 0 8px; font-size: 22px; font-weight: 600; line-height: 1.3; }
#page-shell p { margin: 16px 0 0; font-size: 14px; line-height: 1.625; }
@media (max-width: 700px) {
  #page-shell { padding: 72px 10px 0; }
  #page-shell h2 { font-size: 20px; }
  #page-shell p { display: none; }
}
/* Gone once Gradio has drawn its page (its toasts' holder comes with it, on every tab). */
body:has(#title, gradio-app .toast-wrap) #page-shell { display: none; }
"""


STATUS_TIMERS = f"<script>{Path(__file__).with_name('status_timers.js').read_text(encoding='utf-8')}</script>"


def shell_of(preset: Preset) -> str:
    """The title and description of the Chat tab's first preset, as Gradio will draw them."""
    return (f'<style>{STYLE}</style><div id="page-shell" aria-hidden="true"><h2>{html.escape(preset.name)}</h2>'
            f"<p>{html.escape(preset.description)}</p></div>")


class PageShell:
    """Puts `shell` into the page's HTML (GET /), just before `<gradio-app>`."""

    def __init__(self, app: ASGIApp, shell: str) -> None:
        self.app = app
        self.shell = shell.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "GET" or scope["path"] not in ("/", ""):
            await self.app(scope, receive, send)
            return
        start: Message | None = None
        parts: list[bytes] = []

        async def send_with_shell(message: Message) -> None:
            nonlocal start
            if message["type"] == "http.response.start":
                start = message
                return
            if message["type"] != "http.response.body" or start is None:
                await send(message)
                return
            parts.append(message.get("body", b""))
            if message.get("more_body"):
                return
            body = b"".join(parts)
            headers = MutableHeaders(raw=start["headers"])
            if start["status"] == 200 and headers.get("content-type", "").startswith("text/html"):
                body = body.replace(b"<gradio-app", self.shell + b"<gradio-app", 1)
                headers["content-length"] = str(len(body))
            await send(start)
            await send({"type": "http.response.body", "body": body})

        await self.app(scope, receive, send_with_shell)
