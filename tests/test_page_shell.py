"""The page shell's middleware, on its own: it touches the page's HTML and nothing else."""

from __future__ import annotations

import asyncio

import pytest

from chat.ui.page_shell import PageShell, shell_of

pytestmark = pytest.mark.unit

PAGE = b"<html><body><gradio-app></gradio-app></body></html>"


def served(path: str, body: bytes = PAGE, content_type: str = "text/html; charset=utf-8", status: int = 200,
           method: str = "GET", chunks: int = 1) -> tuple[dict, bytes]:
    """What PageShell sends for a request to an app that answers `body` in `chunks` parts."""
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]})
        step = max(1, len(body) // chunks)
        pieces = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
        for n, piece in enumerate(pieces):
            await send({"type": "http.response.body", "body": piece, "more_body": n < len(pieces) - 1})

    sent: list[dict] = []

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b"", "more_body": False}

    scope = {"type": "http", "method": method, "path": path, "headers": []}
    asyncio.run(PageShell(app, shell="<div id=shell></div>")(scope, receive, send))
    start = next(m for m in sent if m["type"] == "http.response.start")
    return dict(start["headers"]), b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")


def test_the_page_gets_the_shell_before_gradio_app_with_its_length_right():
    headers, body = served("/", chunks=3)
    assert body == b"<html><body><div id=shell></div><gradio-app></gradio-app></body></html>"
    assert headers[b"content-length"] == str(len(body)).encode()


@pytest.mark.parametrize(("path", "kind", "status", "method"), [
    ("/config", "text/html", 200, "GET"),  # another route
    ("/", "application/json", 200, "GET"),  # not a page
    ("/", "text/html", 500, "GET"),  # an error's page
    ("/", "text/html", 200, "POST"),
])
def test_everything_else_passes_untouched(path, kind, status, method):
    headers, body = served(path, content_type=kind, status=status, method=method)
    assert body == PAGE and headers[b"content-length"] == str(len(PAGE)).encode()


def test_the_shell_escapes_the_preset_it_names():
    class Preset:
        name = "<b>x</b>"
        description = "a & b"

    html = shell_of(Preset())  # type: ignore[arg-type]
    assert "&lt;b&gt;x&lt;/b&gt;" in html and "a &amp; b" in html and "<b>" not in html
