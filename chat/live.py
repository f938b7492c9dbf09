"""How a reply reaches a socket while it is written: the API's replies and a browser's, Chat and Compare alike.

Each reply writes its events into a `ReplyLog`, apart from any socket; sockets only follow logs,
from any position. Finished replies stay in the `ReplyStore` for a while, so a client whose
connection dropped gets what it missed without the reply being generated twice. The WebSocket
API's replies write whole events (chat/api.py).

A reply belongs to the visitor whose request started it (`chat.voters.visitor_of`: the signed voter
cookie, else the address): the store keeps each under its visitor and id, and every lookup is in the
asker's own, so another visitor's id is simply unknown there (a page's socket and its Gradio events
carry the same cookie, so the page finds the replies its turns write).

For a page, Gradio redraws a streaming chat by rebuilding, diffing and sending the whole
conversation on every update, in the one event loop that also runs the engine's output handler;
with hundreds of replies at once that work, not the engine, set the pace (bench/frontend.py
measures it). So a page's reply goes through `LiveText`: its new text goes into a log, which the
page's script (chat/ui/live.js) follows over /chat ("watch") and renders as Markdown, and Gradio
redraws the reply only now and then (`live_reply` for the Chat tab, `live_columns` for a
comparison, each giving back only the redraws that are due, with the logs' ids). The page's side
(the box each redraw starts a reply with, live.js, its Markdown parser) is chat/ui/live_script.py.

A typed message used to reach the engine only after Gradio's protocol had run: the turn's join
request, the queue (8-11 ms of one stream's first token on the H200, docs/benchmarks.md "One stream's first token")
and the turn's first redraw. So when a visitor sends a message, the page's script also sends the
turn's inputs over /chat ("begin", with the id of a live log it picked); the reply starts at once
(`begin`) and writes its text into that log. When Gradio runs the turn, the turn takes the reply
over (`claim`, among its visitor's) if it was asked for exactly what the turn asks for; otherwise
(no script, a failed socket, other inputs, a reply already taken) the turn starts its own and the
early one is aborted.
Until it is claimed the reply belongs to the socket that began it (closing the socket aborts it);
then to the turn, whose Stop reaches it through `stop`. A reply nobody claims within CLAIM_S is aborted.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
import time
import uuid
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from chat import metrics
from chat.api_schema import error_code
from chat.compare_service import Begun, CompareEvent, Ended, Redraw, Wrote
from chat.errors import Stopped
from chat.service import ChatService, Failed, ReplyEvent, ReplyRequest, Writing

log = logging.getLogger(__name__)

KEEP_S = 120.0  # a finished reply's events stay resumable this long
KEEP_MAX = 256  # and at most this many finished replies are kept
REDRAW_S = 1.0  # Gradio redraws a page's live reply at most this often (the page's box shows the rest)
LINE_EVERY_S = 0.1  # the line beneath a page's live reply travels with its text at most this often


# Each reply's log, the store of them all, and a page's live text in a log.


class ReplyLog:
    """The events of one reply, kept so that any socket of its visitor can follow them from any point."""

    def __init__(self, request_id: str, visitor: str) -> None:
        self.id = request_id
        self.visitor = visitor  # whose it is (`chat.voters.visitor_of`): nobody else finds it
        self.events: list[dict[str, Any]] = []
        self.ended_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.owner: object | None = None  # the connection whose closing aborts this reply
        self.abandon: asyncio.TimerHandle | None = None  # set while it waits to be resumed
        self.cancelled_as = "stopped_by_user"  # the finish reported if its task is cancelled
        self.early: EarlyReply | None = None  # a reply a page began, until its turn claims it
        self.stopped_by: str | None = None  # the stop key of the turn that claimed it: its Stop's
        self.stop_key: str | None = None  # the key its reply was started with (`ChatService.stop`), its alone
        self._grew = asyncio.Event()

    @property
    def running(self) -> bool:
        return self.ended_at is None

    def add(self, event_type: str, **fields: Any) -> None:
        self.events.append({"type": event_type, "id": self.id, **fields})
        self._wake()

    def end(self) -> None:
        self.ended_at = time.monotonic()
        self._wake()

    def _wake(self) -> None:
        self._grew.set()
        self._grew = asyncio.Event()

    def position_after(self, delta_index: int) -> int:
        """Where a client that got deltas up to `delta_index` (-1: none) picks up again."""
        position = 0
        for i, event in enumerate(self.events):
            if event["type"] == "delta" and event["index"] <= delta_index:
                position = i + 1
        return position

    async def follow(self, position: int = 0) -> AsyncIterator[dict[str, Any]]:
        """Every event from `position` on, live, until the reply has ended."""
        while True:
            grew = self._grew
            while position < len(self.events):
                yield self.events[position]
                position += 1
            if not self.running:
                return
            await grew.wait()

    def abort(self) -> None:
        """Nobody will read this reply: cancel it (which aborts the engine request)."""
        if self.task is not None and self.running:
            self.cancelled_as = "disconnected"
            self.task.cancel()


class ReplyStore:
    """Replies in flight and recently finished, by visitor and request id: one store for all
    connections, in which each visitor finds only their own."""

    def __init__(self, keep_s: float = KEEP_S, keep_max: int = KEEP_MAX) -> None:
        self.keep_s = keep_s
        self.keep_max = keep_max
        self._logs: dict[tuple[str, str], ReplyLog] = {}

    def get(self, visitor: str, request_id: str) -> ReplyLog | None:
        self._evict()
        return self._logs.get((visitor, request_id))

    def add(self, reply_log: ReplyLog) -> None:
        self._evict()
        self._logs[(reply_log.visitor, reply_log.id)] = reply_log

    def owned_by(self, owner: object) -> list[ReplyLog]:
        return [rl for rl in self._logs.values() if rl.owner is owner and rl.running]

    def claimed_by(self, turn_stop_key: str) -> list[ReplyLog]:
        return [rl for rl in self._logs.values() if rl.stopped_by == turn_stop_key and rl.running]

    def _evict(self) -> None:
        """Drop finished replies older than keep_s; beyond keep_max, the oldest of whoever keeps the
        most (so a visitor who ends many replies quickly drops their own, not others')."""
        now = time.monotonic()
        kept: dict[str, list[ReplyLog]] = {}
        for reply_log in sorted((rl for rl in self._logs.values() if not rl.running), key=lambda rl: rl.ended_at or 0):
            if now - (reply_log.ended_at or now) > self.keep_s:
                del self._logs[(reply_log.visitor, reply_log.id)]
            else:
                kept.setdefault(reply_log.visitor, []).append(reply_log)
        over = sum(map(len, kept.values())) - self.keep_max
        for _ in range(over):
            oldest = max(kept.values(), key=len).pop(0)
            del self._logs[(oldest.visitor, oldest.id)]


class LiveText:
    """One reply's text as the page follows it: deltas in a log, Gradio redraws now and then."""

    def __init__(self, store: ReplyStore, visitor: str, redraw_s: float = REDRAW_S, log_id: str | None = None) -> None:
        self.log = ReplyLog(log_id or f"live-{uuid.uuid4().hex}", visitor)
        store.add(self.log)
        self.redraw_s = redraw_s
        self.sent = 0  # characters of the reply written into the log
        self.deltas = 0
        self._drawn_at = self._line_at = float("-inf")

    def write(self, text: str, line: str | None = None) -> None:
        """Add what `text` (the reply so far) has beyond what was written, with the line beneath the
        reply as it stands now (`line`, where the page may show it: see `messages.live_line`), at most ten
        times a second: a reader sees no more, and hundreds of replies at once would pay for it."""
        if len(text) > self.sent:
            extra = {}
            now = time.monotonic()
            if line is not None and now - self._line_at >= LINE_EVERY_S:
                extra["line"], self._line_at = line, now
            self.log.add("delta", text=text[self.sent:], index=self.deltas, **extra)
            self.sent, self.deltas = len(text), self.deltas + 1

    def redraw_due(self) -> bool:
        """Whether Gradio should redraw now (the first text at once, then every `redraw_s`)."""
        now = time.monotonic()
        if now - self._drawn_at < self.redraw_s:
            return False
        self._drawn_at = now
        return True

    def end(self) -> None:
        if self.log.running:
            self.log.add("done")
            self.log.end()


# The reply a page begins before its turn.

CLAIM_S = 120.0  # longer than any wait in Gradio's queue for a turn that was sent with it
PAGE_LOG_ID = re.compile(r"live-[0-9a-f]{32}")  # the ids a page picks for the replies it begins


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
        self.live.log.stopped_by = turn_stop_key

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


def begin(service: ChatService, logs: ReplyStore, visitor: str, log_id: str, request: ReplyRequest,
          owner: object) -> ReplyLog:
    """Start the reply a page asked for, into a live log with the page's id among its visitor's
    (new: the caller checks)."""
    live = LiveText(logs, visitor, log_id=log_id)
    live.log.owner = owner
    live.log.stop_key = f"early:{uuid.uuid4().hex}"
    live.log.early = EarlyReply(service, dataclasses.replace(request, stop_key=live.log.stop_key), live)
    return live.log


def claim(logs: ReplyStore, visitor: str, log_id: str, request: ReplyRequest) -> EarlyReply | None:
    """The reply `visitor`'s page began under `log_id`, for the turn that asks `request`; None when
    there is none to take (then the turn starts its own, and a reply begun for other inputs is aborted)."""
    if not PAGE_LOG_ID.fullmatch(log_id):
        return None
    reply_log = logs.get(visitor, log_id)
    if reply_log is None:
        # Not begun yet (the socket and Gradio's request are two connections; either may come
        # first): the id is taken now, so that the reply, if it comes, is refused, not left to run.
        logs.add(tombstone := ReplyLog(log_id, visitor))
        tombstone.end()
    if reply_log is None or (early := reply_log.early) is None:
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


def stop(service: ChatService, logs: ReplyStore, turn_stop_key: str) -> None:
    """A turn's Stop: the replies given its stop key, and a reply a page began that such a turn took over."""
    service.stop(turn_stop_key)
    for reply_log in logs.claimed_by(turn_stop_key):
        service.stop(reply_log.stop_key)


# What a tab hands over: its events, whole; what Gradio should draw comes back.


async def live_reply(service: ChatService, logs: ReplyStore, request: ReplyRequest, browser: bool, visitor: str,
                     early: EarlyReply | None = None) -> AsyncGenerator[tuple[ReplyEvent, str | None], None]:
    """The Chat tab's reply as Gradio should draw it: the pipeline's events for `request` (or those of
    the reply the page began, `early`, whose text is in its log already), each with the id of the log
    a page follows (None for a program, which gets every event). For a page (`browser`) every piece of
    text goes into a log of `visitor`'s and only the redraws that are due come through. Closing it
    before the end aborts the reply (the begun one too)."""
    events = early.events() if early is not None else service.reply(request)
    live = early.live if early is not None else LiveText(logs, visitor) if browser else None
    try:
        async with contextlib.aclosing(events):
            async for event in events:
                if live is not None and isinstance(event, Writing):
                    if early is None:
                        live.write(event.reply.text, event.line)
                    if not live.redraw_due():
                        continue
                yield event, live.log.id if live is not None else None
    finally:
        if live is not None:
            live.end()


async def live_columns(send: Callable[[float], AsyncGenerator[CompareEvent, None]], logs: ReplyStore,
                       browser: bool, visitor: str) -> AsyncGenerator[tuple[Begun | Redraw | Ended, dict[int, str]], None]:
    """A comparison's turn (`send(every_s)`: `CompareService.send` or `rerun`, asked to redraw a page
    at most every REDRAW_S) as Gradio should draw it, each event with the ids of the logs a page
    follows, by job (none for a program): for a page, each column's text goes into a log of its own,
    `visitor`'s.
    Blind, the line beneath a column is not sent: its figures would tell the columns apart."""
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
                    lives = {id(job): LiveText(logs, visitor) for job in event.jobs} if browser else {}
                yield event, {job: live.log.id for job, live in lives.items()}
    finally:
        for live in lives.values():
            live.end()
