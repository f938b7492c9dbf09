"""A Chat-tab reply that the page begins over its socket, before Gradio's queue runs the turn.

A typed message used to reach the engine only after Gradio's protocol had run: the turn's join
request, the queue (8-11 ms of one stream's first token on the H200, README "Several UI workers")
and the turn's first redraw. So when a visitor sends a message, the page's script (live.js) also
sends the turn's inputs over /chat ("begin", with the id of a live log it picked); the reply starts
at once and writes its text into that log, which the page follows from then on. When Gradio runs
the turn, the turn takes the reply over (`claim`) if it was asked for exactly what the turn asks
for; otherwise (no script, a failed socket, other inputs, a reply already taken) the turn starts
its own and the early one is aborted. Until it is claimed the reply belongs to the socket that
began it (closing the socket aborts it); a reply nobody claims within CLAIM_S is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections import deque
from collections.abc import AsyncGenerator

from chat import metrics
from chat.api_schema import error_code
from chat.errors import Stopped
from chat.reply_log import LiveText, ReplyLog
from chat.service import ChatService, Failed, ReplyEvent, ReplyRequest, Writing

log = logging.getLogger(__name__)

CLAIM_S = 120.0  # longer than any wait in Gradio's queue for a turn that was sent with it
PAGE_LOG_ID = re.compile(r"live-[0-9a-f]{32}")  # the ids a page picks for the replies it begins


def stop_key(log_id: str) -> str:
    return f"early:{log_id}"


def same_turn(a: ReplyRequest, b: ReplyRequest) -> bool:
    """Whether two requests ask for the same reply (who asked, and when, aside)."""
    return (a.message, list(a.history), a.preset, a.system_prompt, a.sampling) == (
        b.message, list(b.history), b.preset, b.system_prompt, b.sampling)


class EarlyReply:
    """One begun reply: the pipeline's events, kept for the turn that claims it, and its live log."""

    def __init__(self, service: ChatService, request: ReplyRequest, live: LiveText) -> None:
        self.service = service
        self.request = request
        self.live = live
        self._events: deque[ReplyEvent] = deque()
        self._arrived = asyncio.Event()
        self._ended = False
        loop = asyncio.get_running_loop()
        self.task = live.log.task = loop.create_task(self._run(), name=f"early reply {live.log.id}")
        self._expiry: asyncio.TimerHandle | None = loop.call_later(CLAIM_S, self._expire)

    async def _run(self) -> None:
        failed: Failed | None = None
        try:
            async with contextlib.aclosing(self.service.reply(self.request)) as events:
                async for event in events:
                    if isinstance(event, Writing):
                        self.live.write(event.reply.text, event.line)
                    elif isinstance(event, Failed) and not isinstance(event.error, Stopped):
                        failed = event
                    self._events.append(event)
                    self._arrived.set()
        finally:
            self._ended = True
            self._arrived.set()
            if failed is not None:  # the socket's sentence (the page shows the turn's)
                self.live.log.add("error", code=error_code(failed.error), message=failed.error.message)
                self.live.log.end()
            self.live.end()
            if self._expiry is not None:
                self._expiry.cancel()

    def _expire(self) -> None:
        self._expiry = None
        if self.live.log.running:
            log.info("No turn took over reply %s within %.0f s; aborting it", self.live.log.id, CLAIM_S)
            metrics.early_reply("unclaimed")
            self.task.cancel()

    def claimed_by(self, turn_stop_key: str | None) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            self._expiry = None
        self.live.log.owner = None  # the turn's, now: the socket's closing no longer ends it
        self.service.stop_also_by(stop_key(self.live.log.id), turn_stop_key)

    async def events(self) -> AsyncGenerator[ReplyEvent, None]:
        """The pipeline's events from the first, for the turn that claimed the reply (of several
        Writing events waiting, only the last: each holds the whole reply so far). Closing it
        before the end aborts the reply."""
        try:
            while True:
                if not self._events:
                    if self._ended:
                        return
                    self._arrived.clear()
                    await self._arrived.wait()
                    continue
                event = self._events.popleft()
                while isinstance(event, Writing) and self._events and isinstance(self._events[0], Writing):
                    event = self._events.popleft()
                yield event
        finally:
            self.task.cancel()  # nothing when it has ended


def begin(service: ChatService, log_id: str, request: ReplyRequest, owner: object) -> ReplyLog:
    """Start the reply a page asked for, into a live log with the page's id (new: the caller checks)."""
    live = LiveText(service.logs, log_id=log_id)
    live.log.owner = owner
    live.log.early = EarlyReply(service, dataclasses.replace(request, stop_key=stop_key(log_id)), live)
    return live.log


def claim(service: ChatService, log_id: str, request: ReplyRequest) -> EarlyReply | None:
    """The reply the page began under `log_id`, for the turn that asks `request`; None when there
    is none to take (then the turn starts its own, and a reply begun for other inputs is aborted)."""
    if not PAGE_LOG_ID.fullmatch(log_id):
        return None
    reply_log = service.logs.get(log_id)
    if reply_log is None:
        # Not begun yet (the socket and Gradio's request are two connections; either may come
        # first): the id is taken now, so that the reply, if it comes, is refused, not left to run.
        service.logs.add(tombstone := ReplyLog(log_id))
        tombstone.end()
    if reply_log is None or not isinstance(early := reply_log.early, EarlyReply):
        metrics.early_reply("missing")
        return None
    reply_log.early = None  # claimed once at most
    if not same_turn(early.request, request):
        log.info("Reply %s was begun for other inputs than its turn's; aborting it", log_id)
        metrics.early_reply("other_inputs")
        early.task.cancel()
        return None
    metrics.early_reply("claimed")
    early.claimed_by(request.stop_key)
    return early
