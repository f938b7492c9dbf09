"""How a reply is run and reaches those who read it: the API's replies and a page's, Chat and Compare alike.

Each reply runs as a task of its own that writes its events into a `ReplyLog`, apart from any
socket; sockets and Gradio's turns only follow logs, from any position. Finished replies stay in
the `ReplyStore` for a while, so a client whose connection dropped gets what it missed without the
reply being generated twice.

A reply belongs to the visitor whose request started it (`chat.voters.visitor_of`: the signed voter
cookie, else the address): the store keeps each under its visitor and id, and every lookup is in the
asker's own, so another visitor's id is simply unknown there (a page's socket and its Gradio events
carry the same cookie, so the page finds the replies its turns follow).

One reply, one owner, one stop key. `start` runs a reply into a new log for the one thing whose
going away aborts it (`ReplyLog.owner`: the socket that asked for it, or the Gradio turn that
did), under the one key that stops it (`ReplyLog.stop_key`). Everything else only reads the log:
the socket's JSON events (`ReplyLog.follow`), or the pipeline's own typed events, the latest each
time (`ReplyLog.drawn`), which is how a Gradio turn draws a reply it did not start.

A page's Chat tab: Gradio redraws a streaming chat by rebuilding, diffing and sending the whole
conversation on every update, in the one event loop that also runs the engine's output handler;
with hundreds of replies at once that work, not the engine, set the pace (bench/frontend.py
measures it), and a typed message reached the engine only after Gradio's protocol had run (its
join request, the queue: 8-11 ms of one stream's first token on the H200, docs/benchmarks.md "One
stream's first token"). So the page's script (chat/ui/live.js) starts the reply itself over its
socket as the message is sent (the API's `begin`: the turn's own inputs, with an id the page
picked), follows its text there and renders it as Markdown; the Gradio turn, sent with that id,
only follows the reply (`turn_reply`): a box for the text at once, a redraw once a second, the
stats and the saved chat at the end. A turn whose page has no socket, or whose `begin` has not
arrived, starts the reply itself under the page's id (a `begin` that comes later follows it). The
page's side (the box each redraw starts a reply with, live.js, its Markdown parser) is
chat/ui/live_script.py. Compare's columns are written by the comparison itself (`live_columns`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any

from chat import metrics
from chat.api_schema import error_code
from chat.compare_service import Begun, CompareEvent, Ended, Redraw, Wrote
from chat.errors import UNEXPECTED_ERROR, Stopped
from chat.service import ChatService, Failed, Finished, ReplyEvent, ReplyRequest, Waiting, Writing

log = logging.getLogger(__name__)

KEEP_S = 120.0  # a finished reply's events stay resumable this long
KEEP_MAX = 256  # and at most this many finished replies are kept
REDRAW_S = 1.0  # Gradio redraws a page's live reply at most this often (the page's box shows the rest)
LINE_EVERY_S = 0.1  # the line beneath a page's live reply travels with its text at most this often


# Each reply's log, and the store of them all.


class ReplyLog:
    """The events of one reply, kept so that any socket of its visitor can follow them from any point,
    and the pipeline's latest typed event, for a Gradio turn that draws it."""

    def __init__(self, request_id: str, visitor: str) -> None:
        self.id = request_id
        self.visitor = visitor  # whose it is (`chat.voters.visitor_of`): nobody else finds it
        self.events: list[dict[str, Any]] = []
        self.latest: ReplyEvent | None = None  # the pipeline's last event (`drawn`)
        self.ended_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.owner: object | None = None  # the one thing whose going away aborts this reply
        self.started_by = ""  # "page", "turn" or "api" (`start`)
        self.stop_key: str | None = None  # the one key that stops it (`ChatService.stop`)
        self.abandon: asyncio.TimerHandle | None = None  # set while it waits to be resumed
        self.cancelled_as = "stopped_by_user"  # the finish reported if its task is cancelled
        self._grew = asyncio.Event()

    @property
    def running(self) -> bool:
        return self.ended_at is None

    def add(self, event_type: str, **fields: Any) -> None:
        self.events.append({"type": event_type, "id": self.id, **fields})
        self._wake()

    def end(self) -> None:
        self.ended_at = time.monotonic()
        self.owner = None  # nothing aborts it now: its socket (and all that hangs on it) need not stay while it is kept
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

    async def drawn(self) -> AsyncIterator[ReplyEvent]:
        """The pipeline's events as a reader who may fall behind sees them: the latest each time it
        changes (each Writing holds the whole reply so far), and always the last."""
        shown: ReplyEvent | None = None
        while True:
            grew = self._grew
            # Whether it had ended before the look: a reply that ends while its reader holds the event
            # yielded here (a Gradio turn sending a redraw) gets its last event drawn too. Asked after
            # the yield, a one-word reply that ended meanwhile left the turn on its first "Writing…".
            ended = not self.running
            if self.latest is not shown and self.latest is not None:
                shown = self.latest
                yield shown
            if ended:
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


# Running a reply into its log.


def start(service: ChatService, logs: ReplyStore, visitor: str, log_id: str, request: ReplyRequest,
          owner: object, *, started_by: str, lines: bool = False) -> ReplyLog:
    """Run the reply `request` asks for into a new log `log_id` among `visitor`'s (new: the caller
    checks), owned by `owner` and stopped by `request.stop_key` (or a key of its own). With `lines`
    (a page reads it), deltas carry the line beneath the reply. `started_by` labels the metric."""
    reply_log = ReplyLog(log_id, visitor)
    reply_log.owner, reply_log.started_by = owner, started_by
    reply_log.stop_key = request.stop_key or f"reply:{uuid.uuid4().hex}"  # its own: ids are per visitor
    request = dataclasses.replace(request, stop_key=reply_log.stop_key)
    logs.add(reply_log)
    metrics.reply_started(started_by)
    reply_log.task = asyncio.get_running_loop().create_task(_run(service, reply_log, request, lines),
                                                            name=f"reply {log_id}")
    return reply_log


async def _run(service: ChatService, reply_log: ReplyLog, request: ReplyRequest, lines: bool) -> None:
    """Write one reply's events into its log; runs as its own task, apart from any reader."""
    text = LiveText(reply_log)
    try:
        async with contextlib.aclosing(service.reply(request)) as events:
            async for event in events:
                reply_log.latest = event
                if isinstance(event, Waiting):
                    reply_log.add("progress", status=event.status)
                    continue
                reply = event.reply
                if reply is not None:
                    text.write(reply.text, event.line if lines and isinstance(event, Writing) else None)
                if isinstance(event, Finished):
                    assert reply is not None and reply.stats is not None
                    reply_log.add("stats", stats=reply.stats.as_dict())
                    done = {"notice": reply.notice} if reply.notice else {}
                    reply_log.add("done", finish=reply.stats.finish.name.lower(), **done)
                elif isinstance(event, Failed) and isinstance(event.error, Stopped):
                    reply_log.add("done", finish="stopped_by_user")
                elif isinstance(event, Failed):
                    reply_log.add("error", code=error_code(event.error), message=event.error.message)
    except asyncio.CancelledError:
        reply_log.add("done", finish=reply_log.cancelled_as)
        written = reply_log.latest.reply if isinstance(reply_log.latest, Writing | Failed) else None
        reply_log.latest = Failed(Stopped("Stopped: the page or program that asked for this reply went away."), written)
        raise
    except Exception:
        log.exception("Unexpected error in reply %s", reply_log.id)
        reply_log.add("error", code="internal", message=UNEXPECTED_ERROR)
    finally:
        reply_log.end()


def new_page_id() -> str:
    """An id of the kind a page picks (`api_schema.PAGE_ID`)."""
    return f"live-{uuid.uuid4().hex}"


# The Chat tab's turn: it follows the reply its page started, or starts it.


async def turn_reply(service: ChatService, logs: ReplyStore, request: ReplyRequest, visitor: str, page_id: str | None,
                     browser: bool) -> AsyncGenerator[tuple[ReplyEvent, str | None], None]:
    """The Chat tab's reply as Gradio should draw it: the pipeline's events, each with the id of the
    log a page follows (None for a program, which gets every event it can keep up with).

    The reply is the one `visitor`'s page started under `page_id` over its socket, which this only
    follows; where there is none (no socket, or its `begin` not here yet), this starts it under that
    id (or a new one) and owns it: closing this before the end then aborts it. For a page only the
    redraws that are due come through (the first text at once, then every REDRAW_S)."""
    reply_log = logs.get(visitor, page_id) if page_id else None
    owned = reply_log is None
    if reply_log is None:
        reply_log = start(service, logs, visitor, page_id or new_page_id(), request, owner=asyncio.current_task(),
                          started_by="turn", lines=browser)
    drawn_at = float("-inf")
    try:
        async for event in reply_log.drawn():
            if browser and isinstance(event, Writing):
                if (now := time.monotonic()) - drawn_at < REDRAW_S:
                    continue
                drawn_at = now
            yield event, reply_log.id if browser else None
    finally:
        if owned and reply_log.running and reply_log.task is not None:
            reply_log.abort()
            await asyncio.wait([reply_log.task])  # its engine request aborted when the turn's close returns


def stop(service: ChatService, logs: ReplyStore, visitor: str, turn_stop_key: str, page_id: str | None) -> None:
    """The Chat tab's Stop: the reply its turn started (`turn_stop_key`), and the one its page started
    under `page_id`, by that reply's own key."""
    service.stop(turn_stop_key)
    if page_id and (reply_log := logs.get(visitor, page_id)) is not None:
        service.stop(reply_log.stop_key)


# The text in a log: a reply's, or a Compare column's.


class LiveText:
    """A reply's text as readers follow it: deltas in a log."""

    def __init__(self, reply_log: ReplyLog) -> None:
        self.log = reply_log
        self.sent = 0  # characters of the reply written into the log
        self.deltas = 0
        self._line_at = float("-inf")

    def write(self, text: str, line: str | None = None) -> None:
        """Add what `text` (the reply so far) has beyond what was written, with the line beneath the
        reply as it stands now (`line`, where a page may show it: see `messages.live_line`), at most ten
        times a second: a reader sees no more, and hundreds of replies at once would pay for it."""
        if len(text) > self.sent:
            extra = {}
            now = time.monotonic()
            if line is not None and now - self._line_at >= LINE_EVERY_S:
                extra["line"], self._line_at = line, now
            self.log.add("delta", text=text[self.sent:], index=self.deltas, **extra)
            self.sent, self.deltas = len(text), self.deltas + 1

    def end(self) -> None:
        if self.log.running:
            self.log.add("done")
            self.log.end()


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
                    lives = {id(job): column_text(logs, visitor) for job in event.jobs} if browser else {}
                yield event, {job: live.log.id for job, live in lives.items()}
    finally:
        for live in lives.values():
            live.end()


def column_text(logs: ReplyStore, visitor: str) -> LiveText:
    """A new log of `visitor`'s for one Compare column's text."""
    reply_log = ReplyLog(new_page_id(), visitor)
    logs.add(reply_log)
    return LiveText(reply_log)
