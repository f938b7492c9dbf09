"""Counts that must hold for the whole app, not for one UI worker: how many replies a visitor has
on their way, and how many sign-ins failed from an address or for a user name.

With one process a `Tallies` lives in it. With several UI workers it lives in the engine owner
(chat/owner.py), every worker asks it over the control line (chat/control.py), and the replies a
worker held are given back when that worker goes, so a killed worker leaves no visitor short.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable
from typing import Protocol

SWEEP_EVERY = 1024


class Tallies:
    """Two kinds of count, each by a key the caller makes (e.g. "visitor:<id>", "login-address:<ip>"):

    - held things (`hold`/`release`): at most `limit` at once, each held by one holder (a worker);
    - events in a time window (`add`/`recent`): e.g. failed sign-ins over the last five minutes.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._held: dict[str, Counter[str]] = {}  # key -> holder -> how many
        self._events: dict[str, deque[float]] = {}
        self._windows: dict[str, float] = {}  # key -> its window, to forget keys nobody asks about again
        self._adds = 0

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

    def release(self, key: str, holder: str = "") -> None:
        holders = self._held.get(key)
        if not holders or holders[holder] <= 0:
            return
        holders[holder] -= 1
        if holders[holder] <= 0:
            del holders[holder]
        if not holders:
            del self._held[key]

    def drop_holder(self, holder: str) -> int:
        """Forget everything `holder` held (a worker that went); how many things that was."""
        dropped = 0
        for key in list(self._held):
            dropped += self._held[key].pop(holder, 0)
            if not self._held[key]:
                del self._held[key]
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

    def release(self, key: str) -> None: ...  # no answer to wait for: it may run as a reply is torn down

    async def add(self, key: str, window_s: float) -> int: ...

    async def recent(self, key: str, window_s: float) -> int: ...


class InProcess:
    """`AppTallies` for an app of one process."""

    def __init__(self, tallies: Tallies | None = None) -> None:
        self.tallies = tallies or Tallies()

    async def hold(self, key: str, limit: int) -> int | None:
        return self.tallies.hold(key, limit)

    def release(self, key: str) -> None:
        self.tallies.release(key)

    async def add(self, key: str, window_s: float) -> int:
        return self.tallies.add(key, window_s)

    async def recent(self, key: str, window_s: float) -> int:
        return self.tallies.recent(key, window_s)
