"""`/reply` on the Gradio API: one whole reply with structured stats, for programs that cannot stream.

The Python client (chat/client.py) falls back to it when the WebSocket API cannot be reached. It
goes through the same reply pipeline as every other message and answers with the same fields the
WebSocket API sends: the text, `stats` (ReplyStats.as_dict()), `finish` and `notice`, or an `error`
with its code and sentence.
"""

from __future__ import annotations

import contextlib
from typing import Any

import gradio as gr

from chat.api_schema import error_code
from chat.errors import Stopped
from chat.service import ChatService, Failed, Finished, ReplyEvent, ReplyRequest
from chat.voters import visitor_of


def result_of(event: ReplyEvent | None) -> dict[str, Any]:
    """The last event of a reply as the endpoint answers it."""
    if isinstance(event, Finished) and event.reply.stats is not None:
        stats = event.reply.stats
        return {"text": event.reply.text, "stats": stats.as_dict(), "finish": stats.finish.name.lower(),
                "notice": event.reply.notice, "error": None}
    if isinstance(event, Failed) and isinstance(event.error, Stopped):
        return {"text": "", "stats": None, "finish": "stopped_by_user", "notice": None, "error": None}
    if isinstance(event, Failed):
        text = event.reply.text if event.reply is not None else ""
        return {"text": text, "stats": None, "finish": "error", "notice": None,
                "error": {"code": error_code(event.error), "message": event.error.message}}
    raise RuntimeError("the reply pipeline ended without a Finished or Failed event")


def reply_api(service: ChatService) -> None:
    """Register `/reply` on the Blocks being built."""

    async def reply(
        message: str,
        preset: str | None = None,
        system_prompt: str | None = None,
        sampling: dict[str, Any] | None = None,
        history: list[dict[str, Any]] | None = None,
        request: gr.Request | None = None,  # Gradio's, not the caller's: whose share the reply counts in
    ) -> dict[str, Any]:
        """One reply, whole: {text, stats, finish, notice, error}. `sampling` takes the knobs by name,
        `history` earlier turns as {"role", "content"}; a preset or system prompt left out is the default."""
        request = ReplyRequest(message, history or (), preset=preset or None, system_prompt=system_prompt,
                               sampling=sampling or {}, visitor=visitor_of(request) if request is not None else "")
        last: ReplyEvent | None = None
        async with contextlib.aclosing(service.reply(request)) as events:
            async for last in events:  # noqa: B007 - only the last event matters
                pass
        return result_of(last)

    gr.api(reply, api_name="reply", concurrency_limit=None)
