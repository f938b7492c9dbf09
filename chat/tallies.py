"""Counts that must hold for the whole app, not for one UI worker: how many replies a visitor has
on their way, how many replies are written at once and who waits for a slot (`--concurrency-limit`),
and how many sign-ins failed from an address or for a user name.

With one process a `Tallies` lives in it. With several UI workers it lives in the engine owner
(chat/owner.py), every worker asks it over the control line (chat/control.py), and the replies a
worker held are given back when that worker goes, so a killed worker leaves no visitor short.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

SWEEP_EVERY = 1024


@dataclass
class _InLine:
    holder: str
    ticket: str
    admit: Callable[[], None]  # called once it holds its slot


class Tallies:
    """Two kinds of count, each by a key the caller makes (e.g. "visitor:<id>", "login-address:<ip>"):

    - held things (`hold`/`release`): at most `limit` at once, each held by one holder (a worker);
      with `enter`, one that finds them all held waits in line, first come first served;
    - events in a time window (`add`/`recent`): e.g. failed sign-ins over the last five minutes.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, Counter[str]] = {}  # key -> holder -> how many
        self._events: dict[str, deque[float]] = {}
        self._windows: dict[str, float] = {}  # key -> its window, to forget keys nobody asks about again
        self._adds = 0
        self._lines: dict[str, deque[_InLine]] = {}
        self._admitted: set[tuple[str, str, str]] = set()  # (key, holder, ticket) of slots taken with `enter`

    def held(self, key: str) -> int:
        return sum(self._held.get(key, Counter()).values())

    def hold(self, key: str, limit: int, holder: str = "") -> int | None:
        """Count one more under `key` for `holder`; how many there were before, or None (and nothing
        counted) where that is already `limit` (0: no limit)."""
        before = self.held(key)
        if limit and before >= limit:
            return None
        self._held.setdefault(key, Counter())[holder] += 1
        return before

    def enter(self, key: str, limit: int, max_waiting: int, holder: str, ticket: str,
              admit: Callable[[], None]) -> int | None:
        """Hold one under `key` for `holder` now (0), or take a place in its line: how many are in it
        then, this one included; `admit` is called once a release hands it a slot. None (nothing
        counted) where `max_waiting` are in line already. `ticket` names the place for `leave`."""
        line = self._lines.get(key, deque())
        if not line and self.hold(key, limit, holder) is not None:
            self._admitted.add((key, holder, ticket))
            return 0
        if len(line) >= max_waiting:
            return None
        line.append(_InLine(holder, ticket, admit))
        self._lines[key] = line
        return len(line)

    def leave(self, key: str, holder: str, ticket: str) -> None:
        """`ticket` is done: its slot goes to the next in line, or it gives up its place there."""
        if (key, holder, ticket) in self._admitted:
            self._admitted.discard((key, holder, ticket))
            self.release(key, holder)
            return
        line = self._lines.get(key, deque())
        if (place := next((p for p in line if p.holder == holder and p.ticket == ticket), None)) is not None:
            line.remove(place)
            if not line:
                del self._lines[key]

    def release(self, key: str, holder: str = "") -> None:
        """One fewer held under `key` by `holder`; its slot goes to the first in line, if any."""
        holders = self._held.get(key)
        if not holders or holders[holder] <= 0:
            return
        holders[holder] -= 1
        if holders[holder] <= 0:
            del holders[holder]
        if not holders:
            del self._held[key]
        if line := self._lines.get(key):
            first = line.popleft()
            if not line:
                del self._lines[key]
            self._held.setdefault(key, Counter())[first.holder] += 1
            self._admitted.add((key, first.holder, first.ticket))
            first.admit()

    def drop_holder(self, holder: str) -> int:
        """Forget everything `holder` held and every place it had in line (a worker that went); how
        many things it held. What it held goes to those in line after it."""
        for key in list(self._lines):
            self._lines[key] = deque(p for p in self._lines[key] if p.holder != holder)
            if not self._lines[key]:
                del self._lines[key]
        self._admitted = {a for a in self._admitted if a[1] != holder}
        dropped = 0
        for key in list(self._held):
            count = self._held[key].get(holder, 0)
            for _ in range(count):
                self.release(key, holder)
            dropped += count
        return dropped

    def add(self, key: str, window_s: float) -> int:
        """Count one event under `key`; how many there have been within the last `window_s`, this one included."""
        times = self._window(key, window_s)
        times.append(self._clock())
        self._events[key], self._windows[key] = times, window_s
        self._adds += 1
        if self._adds % SWEEP_EVERY == 0:  # e.g. a failed sign-in from each of many addresses, once
            for old in [k for k, t in self._events.items() if self._clock() - t[-1] > self._windows[k]]:
                del self._events[old], self._windows[old]
        return len(times)

    def recent(self, key: str, window_s: float) -> int:
        """How many events under `key` within the last `window_s`."""
        return len(self._window(key, window_s))

    def _window(self, key: str, window_s: float) -> deque[float]:
        times = self._events.get(key, deque())
        now = self._clock()
        while times and now - times[0] > window_s:
            times.popleft()
        if not times:
            self._events.pop(key, None)
            self._windows.pop(key, None)
        return times


class AppTallies(Protocol):
    """The app's one `Tallies`, wherever it lives: in this process (`InProcess`) or in the engine
    owner, asked over the control line (chat/owner_link.py)."""

    async def hold(self, key: str, limit: int) -> int | None: ...

    async def enter(self, key: str, limit: int, max_waiting: int, queued: Callable[[], None]) -> str | None:
        """A slot under `key`, waiting in line for one if need be (`queued` is called once when it
        has to): its ticket, for `leave`; None where the line is full. Cancelled, it gives up its place."""

    def leave(self, key: str, ticket: str) -> None: ...  # a slot from `enter` given back (no answer either)

    def release(self, key: str) -> None: ...  # no answer to wait for: it may run as a reply is torn down

    async def add(self, key: str, window_s: float) -> int: ...

    async def recent(self, key: str, window_s: float) -> int: ...


class InProcess:
    """`AppTallies` for an app of one process."""

    def __init__(self, tallies: Tallies | None = None) -> None:
        self.tallies = tallies or Tallies()
        self._tickets = itertools.count(1)

    async def hold(self, key: str, limit: int) -> int | None:
        return self.tallies.hold(key, limit)

    async def enter(self, key: str, limit: int, max_waiting: int, queued: Callable[[], None]) -> str | None:
        admitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ticket = str(next(self._tickets))

        def admit() -> None:
            if not admitted.done():
                admitted.set_result(None)

        place = self.tallies.enter(key, limit, max_waiting, "", ticket, admit)
        if place is None:
            return None
        if place:
            queued()
            try:
                await admitted
            except BaseException:
                self.tallies.leave(key, "", ticket)
                raise
        return ticket

    def leave(self, key: str, ticket: str) -> None:
        self.tallies.leave(key, "", ticket)

    def release(self, key: str) -> None:
        self.tallies.release(key)

    async def add(self, key: str, window_s: float) -> int:
        return self.tallies.add(key, window_s)

    async def recent(self, key: str, window_s: float) -> int:
        return self.tallies.recent(key, window_s)
