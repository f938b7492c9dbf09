"""The events of replies that sockets follow, kept so that a client whose connection dropped can resume them.

Each reply writes its events into a `ReplyLog`, apart from any socket; sockets only follow logs,
from any position. Finished replies stay in the `ReplyStore` for a while, so a client that
reconnects gets what it missed without the reply being generated twice. The WebSocket API's
replies write whole events; a page's replies go through `LiveText` (the text as deltas, for the
page's script: chat/ui/live.py).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

GRACE_S = 30.0  # a dropped connection's replies keep running this long, waiting to be resumed
KEEP_S = 120.0  # a finished reply's events stay resumable this long
KEEP_MAX = 256  # and at most this many finished replies are kept
REDRAW_S = 1.0  # Gradio redraws a page's live reply at most this often (the page's box shows the rest)
LINE_EVERY_S = 0.1  # the line beneath a page's live reply travels with its text at most this often


class ReplyLog:
    """The events of one reply, kept so that any socket can follow them from any point."""

    def __init__(self, request_id: str) -> None:
        self.id = request_id
        self.events: list[dict[str, Any]] = []
        self.ended_at: float | None = None
        self.task: asyncio.Task[None] | None = None
        self.owner: object | None = None  # the connection whose closing aborts this reply
        self.abandon: asyncio.TimerHandle | None = None  # set while it waits to be resumed
        self.cancelled_as = "stopped_by_user"  # the finish reported if its task is cancelled
        self.early: object | None = None  # a reply a page began, until its turn claims it (chat/early_reply.py)
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
    """Replies in flight and recently finished, by request id, shared by all connections."""

    def __init__(self, keep_s: float = KEEP_S, keep_max: int = KEEP_MAX) -> None:
        self.keep_s = keep_s
        self.keep_max = keep_max
        self._logs: dict[str, ReplyLog] = {}

    def get(self, request_id: str) -> ReplyLog | None:
        self._evict()
        return self._logs.get(request_id)

    def add(self, reply_log: ReplyLog) -> None:
        self._evict()
        self._logs[reply_log.id] = reply_log

    def owned_by(self, owner: object) -> list[ReplyLog]:
        return [rl for rl in self._logs.values() if rl.owner is owner and rl.running]

    def _evict(self) -> None:
        now = time.monotonic()
        ended = sorted((rl for rl in self._logs.values() if not rl.running), key=lambda rl: rl.ended_at or 0)
        for i, reply_log in enumerate(ended):
            if now - (reply_log.ended_at or now) > self.keep_s or i < len(ended) - self.keep_max:
                del self._logs[reply_log.id]


class LiveText:
    """One reply's text as the page follows it: deltas in a log, Gradio redraws now and then."""

    def __init__(self, store: ReplyStore, redraw_s: float = REDRAW_S, log_id: str | None = None) -> None:
        self.log = ReplyLog(log_id or f"live-{uuid.uuid4().hex}")
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
