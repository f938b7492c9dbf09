"""The events of API replies, kept so that a client whose connection dropped can resume them.

Each reply writes its events into a `ReplyLog`, apart from any socket; sockets only follow logs,
from any position. Finished replies stay in the `ReplyStore` for a while, so a client that
reconnects gets what it missed without the reply being generated twice.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

GRACE_S = 30.0  # a dropped connection's replies keep running this long, waiting to be resumed
KEEP_S = 120.0  # a finished reply's events stay resumable this long
KEEP_MAX = 256  # and at most this many finished replies are kept


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
