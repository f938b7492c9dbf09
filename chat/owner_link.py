"""A UI worker's side of the engine owner (chat/owner.py): it asks for engines, never decides.

`OwnerLink` is the worker's line to the owner (chat/control.py) and its registry's `Sharing`
(chat/registry.py): where a single process would start or wake an engine, the registry asks the
owner, shows the owner's progress to its readers, and joins the engine's shared core on the slot it
is given (chat/engine_core.py). It tells the owner what only this worker knows (its streams, the
scheduler views its clients saw, its times to first token) when that changes, and shows what the
owner sends back: every engine as the whole app sees it. It is also the worker's way to the app's
counts (`AppTallies`). An engine the owner wants to take away and
that is idle here is held (new requests for it wait) until the owner says what became of it.
Without its owner, in its parent process, a worker stops (chat/lifeline.py).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chat import control, metrics
from chat.engine import RESTARTING, Engine, EngineState
from chat.errors import EngineBusy, EngineError, InputError
from chat.registry import EngineRegistry, EngineView, Sharing

REPORT_GAP_S = 0.5  # at most two reports a second, however much changes


class OwnerLink(Sharing):
    """The worker's one line to the owner, and the way its registry shares engines through it."""

    def __init__(self, folder: Path, worker: int) -> None:
        self.folder, self.worker = folder, worker
        self.registry: EngineRegistry | None = None  # the registry this is the `Sharing` of, once given
        self.snapshot: control.Snapshot | None = None
        self.on_capacity_stop: list[Callable[[], None]] = []
        self.line: control.Line | None = None
        self._changed = asyncio.Event()
        self._sent_first_tokens = 0.0
        self._tickets = itertools.count(1)

    async def open(self, registry: EngineRegistry) -> None:
        """Say hello, then listen and report (on this loop, for the process's life)."""
        self.registry, self.line = registry, control.Line(self.folder, owner=False)
        await self.line.send(control.Hello(worker=self.worker))
        control.background(self._listen())
        control.background(self._report())

    def close(self) -> None:
        if self.line is not None:
            self.line.close()

    async def _listen(self) -> None:
        assert self.line is not None
        async for _, message in self.line.messages():
            if isinstance(message, control.Snapshot):
                self.snapshot = message
            elif isinstance(message, control.EngineNews):
                control.background(self._obey(message))
            elif isinstance(message, control.Capacity):
                for stop in self.on_capacity_stop:
                    stop()

    # --- the registry's engines, from the owner ----------------------------------------------

    async def _acquire(self, engine: Engine, have: int | None) -> control.Answer:
        """The owner's grant of `engine`, its progress shown meanwhile; raises EngineBusy or EngineError."""

        def progress(step: control.Progress) -> None:
            engine.phase, engine.start_delay_s = step.phase, step.delay
            engine.started_at = time.monotonic() - step.elapsed

        assert self.line is not None
        answer = await self.line.ask(control.Acquire(preset=engine.preset.name, have=have), progress=progress)
        if not answer.ok:
            raise (EngineBusy if answer.busy else EngineError)(answer.message)
        return answer

    async def prepare(self, engine: Engine) -> None:
        granted = await self._acquire(engine, None)
        engine.slot, engine.generation = granted.slot, granted.generation
        engine.load.on_change = self._changed.set

    async def wake(self, engine: Engine) -> None:
        if (await self._acquire(engine, engine.generation)).slot is None:
            engine.state = EngineState.READY
        else:  # a new core meanwhile (this one was unloaded or died): the next request joins that one
            engine.state, engine.error, engine.retry_at = EngineState.FAILED, RESTARTING, 0.0

    def died(self, engine: Engine) -> bool:
        """The owner restarts the core; this client is closed, and the next request joins the new one."""
        engine.retry_at = 0.0
        control.background(self._drop(engine))
        return False

    @staticmethod
    async def _drop(engine: Engine) -> None:
        await engine.abort_streams(RESTARTING)
        await engine.close()
        engine.state = EngineState.FAILED  # not CLOSED: its reason stays RESTARTING

    def changed(self, engine: Engine) -> None:
        self._changed.set()

    def views(self, own: list[EngineView], first_tokens: bool) -> list[EngineView]:
        return own if self.snapshot is None else self.snapshot.engines  # before the owner's first word: ours

    def workers(self) -> list[dict[str, Any]]:
        return [w.model_dump(mode="json") for w in self.snapshot.workers] if self.snapshot else []

    async def _obey(self, news: control.EngineNews) -> None:
        """Answer the owner's question, or learn what happened to an engine."""
        assert self.line is not None and self.registry is not None
        engine = next((e for e in self.registry if e.key == news.key), None)
        if news.news is control.News.DRAIN:  # a reply counts from the moment it picks the engine (`Engine.in_use`)
            idle = engine is None or (engine.state is not EngineState.STARTING and not engine.in_use)
            if idle and engine is not None and engine.held is None:
                engine.held = asyncio.Event()  # new requests for it wait until the owner says what became of it
            await self.line.send(control.Answer(id=news.id, ok=idle))
            return
        if engine is not None and news.news is control.News.ASLEEP:
            engine.state = EngineState.SLEEPING
        elif engine is not None and news.news is control.News.DETACH:
            await self.registry.unload(engine, news.reason or "This model was unloaded.")
        elif engine is not None and news.news is control.News.DIED and engine.generation == news.generation:
            self.registry.restart(engine)  # which leaves it to the owner (`died`)
        if engine is not None and (held := engine.held) is not None:
            engine.held = None
            held.set()
        if news.news is control.News.DETACH:
            await self.line.send(control.Answer(id=news.id))

    async def _report(self) -> None:
        """Tell the owner what this worker knows whenever it changed, at most every REPORT_GAP_S."""
        assert self.line is not None and self.registry is not None
        while True:
            await self._changed.wait()
            self._changed.clear()
            mono, engines = time.monotonic(), list(self.registry)
            report = control.Report(engines={e.key: control.EngineReport(
                generation=e.generation, streams=e.streams, unfinished=e.num_unfinished(), running=e.load.running,
                waiting=e.load.waiting, kv_cache_usage=e.load.kv_cache_usage, updated_at=e.load.updated_at,
                generated_tokens=e.load.generated_tokens, idle_s=mono - e.last_used) for e in engines if e.loaded},
                first_tokens=[(preset, s) for at, preset, s in metrics.RECENT_FIRST_TOKENS if at > self._sent_first_tokens],
                settled=bool(engines) and not any(e.state is EngineState.STARTING for e in engines))
            self._sent_first_tokens = mono
            await self.line.send(report)
            await asyncio.sleep(REPORT_GAP_S)

    # --- one capacity test at a time, for the whole app ----------------------------------------

    async def take_capacity(self, presets: list[str], nominal_s: float, by: str) -> None:
        assert self.line is not None
        test = control.CapacityView(presets=presets, ends_at=time.time() + nominal_s, by=by)
        if not (answer := await self.line.ask(control.Capacity(act="take", test=test))).ok:
            raise InputError(answer.message)

    def give_back_capacity(self) -> None:
        assert self.line is not None
        control.background(self.line.send(control.Capacity(act="give_back")))

    def capacity_elsewhere(self) -> dict[str, Any] | None:
        test = self.snapshot.capacity if self.snapshot else None
        return test.model_dump() if test else None

    async def stop_capacity_elsewhere(self) -> None:
        assert self.line is not None
        await self.line.send(control.Capacity(act="stop"))

    # --- the app's counts, kept by the owner (chat/tallies.py `AppTallies`) ----------------------

    async def hold(self, key: str, limit: int) -> int | None:
        return (await self._tally(control.Tally(act="hold", key=key, limit=limit))).count

    def release(self, key: str) -> None:
        assert self.line is not None
        control.background(self.line.send(control.Tally(act="release", key=key)))

    async def enter(self, key: str, limit: int, max_waiting: int, queued: Callable[[], None]) -> str | None:
        assert self.line is not None
        ticket = str(next(self._tickets))
        try:
            answer = await self.line.ask(control.Tally(act="enter", key=key, limit=limit, max_waiting=max_waiting,
                                                       ticket=ticket), progress=lambda _: queued())
        except BaseException:
            self.leave(key, ticket)  # its place in line, or the slot the owner handed it meanwhile
            raise
        return ticket if answer.ok else None

    def leave(self, key: str, ticket: str) -> None:
        assert self.line is not None
        control.background(self.line.send(control.Tally(act="leave", key=key, ticket=ticket)))

    async def add(self, key: str, window_s: float) -> int:
        return (await self._tally(control.Tally(act="add", key=key, window_s=window_s))).count or 0

    async def recent(self, key: str, window_s: float) -> int:
        return (await self._tally(control.Tally(act="recent", key=key, window_s=window_s))).count or 0

    async def _tally(self, tally: control.Tally) -> control.Answer:
        assert self.line is not None
        return await self.line.ask(tally)
