"""One owner for every engine of the app, when several UI workers serve it (`--ui-workers N`).

The `EngineOwner` lives in the supervisor and is the `Sharing` (chat/registry.py) of the app's one
`EngineRegistry`: it alone starts, wakes, puts to sleep, unloads and restarts engines, within the one
memory budget, and backs off after failures. Each engine is a shared core (chat/engine_core.py) with
a client slot for every worker; the owner holds slot 0 itself (for sleep and wake, and to write the
start's warm-up). Before it takes an engine away it asks every worker whether the engine is idle
there, and it lets their clients go before it stops a core. A core's process that ends is seen at
once (its sentinel, on the owner's event loop) and the core restarted. It also keeps the app's
counts (chat/tallies.py), so that a visitor's share and failed sign-ins hold across workers. The
workers speak to it over chat/control.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from chat import control
from chat.engine import RESTARTING, Engine, EngineState
from chat.errors import ChatError, EngineBusy
from chat.presets import PresetCatalog
from chat.registry import FIRST_TOKENS_WINDOW_S, EngineRegistry, EngineView, Sharing, first_token_percentiles
from chat.tallies import Tallies

log = logging.getLogger(__name__)

SPARE_SLOTS = 4  # UI workers that can be replaced over a core's life (vLLM greets each slot once)
SNAPSHOT_GAP_S = 0.5  # at most two snapshots a second, however much changes
ASK_TIMEOUT_S = 10.0
DETACH_TIMEOUT_S = 30.0
NO_SLOT = ("{name} has no connection left for a replaced UI worker; it gets new ones when the engine next "
           "starts. Pick another preset, or restart the app.")
CAPACITY_TAKEN = "A capacity test is already running; wait for it to end, or press Stop."


@dataclass
class Peer:
    """One UI worker's process, as the owner knows it."""

    ident: bytes
    worker: int
    report: control.Report | None = None
    settled: bool = False  # its first engine start has ended (joined and warmed up, or failed)


class EngineOwner(Sharing):
    """The app's engines, shared by every UI worker (see the module's docstring)."""

    def __init__(self, catalog: PresetCatalog, folder: Path, workers: int, memory_budget: float | None = None,
                 max_waiting: int = 256) -> None:
        self.registry = EngineRegistry(memory_budget=memory_budget, max_waiting=max_waiting, sharing=self)
        self.catalog, self.folder = catalog, folder
        self.slots = 1 + workers + SPARE_SLOTS
        self.peers: dict[bytes, Peer] = {}
        self.worker_states: Callable[[], list[control.WorkerView]] = list  # the supervisor's
        self.on_settled: Callable[[int], None] = lambda worker: None
        self.capacity: tuple[bytes, control.CapacityView] | None = None  # the one capacity test running, and whose
        self.first_tokens: deque[tuple[float, str, float]] = deque(maxlen=10_000)
        self.tallies = Tallies()  # the whole app's: visitors' replies on their way, failed sign-ins
        self.line: control.Line | None = None
        self._generations = itertools.count(1)
        self._free: dict[str, list[int]] = {}  # engine key -> slots nobody has taken
        self._taking: dict[str, asyncio.Event] = {}  # engines being put to sleep or unloaded to make room
        self._news = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None

    async def serve(self) -> None:
        """Answer the workers until cancelled."""
        self.line = control.Line(self.folder, owner=True)
        broadcast = asyncio.get_running_loop().create_task(self._broadcast())
        try:
            async for ident, message in self.line.messages():
                self._take(ident, message)
        finally:
            broadcast.cancel()
            self.line.close()

    def forget(self, worker: int) -> None:
        """UI worker `worker`'s process ended: its questions end unanswered, its capacity test with it."""
        for peer in [p for p in self.peers.values() if p.worker == worker]:
            del self.peers[peer.ident]
            if self.line is not None:
                self.line.gone(peer.ident)
            if self.capacity is not None and self.capacity[0] == peer.ident:
                self.capacity = None
            if dropped := self.tallies.drop_holder(peer.ident.hex()):
                log.debug("UI worker %d held %d counts; released", worker, dropped)
        self.news()

    async def close(self) -> None:
        """The app stops, its UI workers stopped first: every engine closes, and no worker is asked to
        let go of it. A worker that had gone unseen (its line not yet closed, on a loaded machine) was
        asked, and the stop waited DETACH_TIMEOUT_S for an answer that could not come."""
        for worker in {peer.worker for peer in self.peers.values()}:
            self.forget(worker)
        await self.registry.close_all()

    def news(self) -> None:
        """Something the workers show has changed: a snapshot goes out."""
        self._news.set()

    # --- the registry's engines, shared -------------------------------------------------------

    async def prepare(self, engine: Engine) -> None:
        engine.generation = next(self._generations)
        self._free[engine.key] = list(range(1, self.slots))

    def build(self, engine: Engine, make_room: Callable[[Engine], None]) -> None:
        engine.build(make_room, shared_slots=self.slots, sockets=self.folder)

    async def may_take(self, engine: Engine) -> bool:
        if engine.in_use:
            return False
        drain = control.EngineNews(news=control.News.DRAIN, key=engine.key)
        answers = await asyncio.gather(*(self._ask(p, drain) for p in list(self.peers.values())), return_exceptions=True)
        if all(isinstance(a, control.Answer) and a.ok for a in answers):
            self._taking[engine.key] = asyncio.Event()  # a worker asking for it now waits until it is asleep or gone
            return True
        log.info("Keeping %r: a UI worker is using it", engine.preset.name)
        await self._tell_all(control.EngineNews(news=control.News.RESUME, key=engine.key))
        return False

    def taken(self, engine: Engine) -> None:
        if (taking := self._taking.pop(engine.key, None)) is not None:
            taking.set()

    async def before_unload(self, engine: Engine, reason: str) -> None:
        self._watch(engine, False)  # its processes now end on purpose
        detach = control.EngineNews(news=control.News.DETACH, key=engine.key, reason=reason)
        await asyncio.gather(*(self._ask(p, detach, DETACH_TIMEOUT_S) for p in list(self.peers.values())),
                             return_exceptions=True)

    def died(self, engine: Engine) -> bool:
        self._watch(engine, False)
        control.background(self._tell_all(control.EngineNews(
            news=control.News.DIED, key=engine.key, generation=engine.generation, reason=RESTARTING)))
        return True

    def changed(self, engine: Engine) -> None:
        if engine.state is EngineState.SLEEPING:
            control.background(self._tell_all(control.EngineNews(news=control.News.ASLEEP, key=engine.key)))
        elif engine.state is EngineState.READY:
            self._watch(engine, True)
        self.news()

    def views(self, own: list[EngineView], first_tokens: bool) -> list[EngineView]:
        """Each engine with what every worker reported: streams and requests summed, the newest
        scheduler view, tokens written through every client."""
        now = time.monotonic()
        views = []
        for view, engine in zip(own, list(self.registry), strict=True):
            seen = [r for p in self.peers.values() if p.report and (r := p.report.engines.get(engine.key))
                    and r.generation == engine.generation]
            newest = max(seen, key=lambda r: r.updated_at, default=None)
            if newest is not None and newest.updated_at > engine.load.updated_at:
                view = replace(view, running=newest.running, waiting=newest.waiting, kv_cache_usage=newest.kv_cache_usage)
            p50, p95 = (first_token_percentiles(self.first_tokens, engine.preset.name, now) if first_tokens
                        else (None, None))
            views.append(replace(
                view, unfinished=view.unfinished + sum(r.unfinished for r in seen),
                streams=view.streams + sum(r.streams for r in seen),
                generated_tokens=view.generated_tokens + sum(r.generated_tokens for r in seen),
                ttft_p50_s=p50, ttft_p95_s=p95))
        return views

    def _watch(self, engine: Engine, on: bool) -> None:
        """Restart the engine the moment one of its core's processes ends (on), or no longer (off)."""
        loop = asyncio.get_running_loop()
        for sentinel in engine.core.sentinels if engine.core is not None else []:
            if on:
                loop.add_reader(sentinel, self._core_ended, engine)
            else:
                loop.remove_reader(sentinel)

    def _core_ended(self, engine: Engine) -> None:
        self._watch(engine, False)
        if self.registry.peek(engine.preset) is engine and not self.registry.closing:
            self.registry.restart(engine)

    # --- the workers ------------------------------------------------------------------------

    def _take(self, ident: bytes, message: control.Message) -> None:
        peer = self.peers.get(ident)
        if isinstance(message, control.Hello):
            self.peers[ident] = Peer(ident, message.worker)
            self.news()
        elif peer is None:
            log.warning("A UI worker that did not say hello sent %r", message.op)
        elif isinstance(message, control.Report):
            self._record(peer, message)
        elif isinstance(message, control.Acquire):
            control.background(self._acquire(peer, message))
        elif isinstance(message, control.Capacity):
            control.background(self._capacity(peer, message))
        elif isinstance(message, control.Tally):
            self._tally(peer, message)
        else:
            log.warning("A UI worker sent %r, which the owner does not take", message.op)

    def _record(self, peer: Peer, report: control.Report) -> None:
        peer.report, now = report, time.monotonic()
        for engine in self.registry:
            if (seen := report.engines.get(engine.key)) is not None:
                engine.last_used = max(engine.last_used, now - seen.idle_s)
        self.first_tokens.extend((now, preset, seconds) for preset, seconds in report.first_tokens)
        if report.settled and not peer.settled:
            peer.settled = True
            self.on_settled(peer.worker)
        self.news()

    async def _acquire(self, peer: Peer, ask: control.Acquire) -> None:
        try:
            preset = self.catalog.get(ask.preset)
            while True:
                async for _ in self.registry.wait_until_ready(preset):
                    if (engine := self.registry.peek(preset)) is not None:
                        await self._send(peer, control.Progress(id=ask.id, phase=engine.phase, delay=engine.start_delay_s,
                                                                elapsed=time.monotonic() - engine.started_at))
                engine = await self.registry.get(preset)
                if (taking := self._taking.get(engine.key)) is None:
                    break
                await taking.wait()  # being put to sleep or unloaded: then wake or start it again
        except ChatError as exc:
            await self._send(peer, control.Answer(id=ask.id, ok=False, message=exc.message, busy=isinstance(exc, EngineBusy)))
            return
        free = self._free.get(engine.key, [])
        if ask.have == engine.generation:  # its client is on this core already
            answer = control.Answer(id=ask.id, generation=engine.generation)
        elif free and engine.core is not None:
            answer = control.Answer(id=ask.id, generation=engine.generation, slot=engine.core.slot(free.pop(0)))
        else:
            answer = control.Answer(id=ask.id, ok=False, message=NO_SLOT.format(name=engine.preset.name))
        await self._send(peer, answer)

    async def _capacity(self, peer: Peer, message: control.Capacity) -> None:
        holder = self.peers.get(self.capacity[0]) if self.capacity else None
        if message.act == "take":
            taken = holder is not None and holder is not peer
            if not taken and message.test is not None:
                self.capacity = (peer.ident, message.test)
            await self._send(peer, control.Answer(id=message.id, ok=not taken, message=CAPACITY_TAKEN if taken else ""))
        elif message.act == "give_back" and holder is peer:
            self.capacity = None
        elif message.act == "stop" and holder is not None:
            await self._send(holder, control.Capacity(act="stop"))
        self.news()

    def _tally(self, peer: Peer, tally: control.Tally) -> None:
        holder = peer.ident.hex()  # the process: its replacement holds nothing yet
        if tally.act == "release":
            self.tallies.release(tally.key, holder)
            return
        if tally.act == "leave":
            self.tallies.leave(tally.key, holder, tally.ticket)
            return
        if tally.act == "enter":
            def admit() -> None:
                control.background(self._send(peer, control.Answer(id=tally.id)))

            place = self.tallies.enter(tally.key, tally.limit, tally.max_waiting, holder, tally.ticket, admit)
            answer: control.Message = (control.Answer(id=tally.id, ok=False) if place is None else
                                       control.Answer(id=tally.id) if place == 0 else
                                       control.Progress(id=tally.id, phase="in line", elapsed=0.0, delay=0.0))
            control.background(self._send(peer, answer))
            return
        count = (self.tallies.hold(tally.key, tally.limit, holder) if tally.act == "hold" else
                 self.tallies.add(tally.key, tally.window_s) if tally.act == "add" else
                 self.tallies.recent(tally.key, tally.window_s))
        control.background(self._send(peer, control.Answer(id=tally.id, count=count)))

    async def _ask(self, peer: Peer, news: control.EngineNews, within_s: float = ASK_TIMEOUT_S) -> control.Answer:
        """The worker's answer (not ok if it went; TimeoutError if it is slow)."""
        assert self.line is not None
        async with asyncio.timeout(within_s):  # not wait_for, which may lose a cancel (chat/stream.py `paced`)
            return await self.line.ask(news, peer.ident)

    async def _send(self, peer: Peer, message: control.Message) -> None:
        if self.line is not None:
            with contextlib.suppress(ConnectionError):  # gone: the supervisor tells us (`forget`)
                await self.line.send(message, peer.ident)

    async def _tell_all(self, message: control.Message) -> None:
        for peer in list(self.peers.values()):
            await self._send(peer, message)

    async def _broadcast(self) -> None:
        """A snapshot to every worker when something changed, at most every SNAPSHOT_GAP_S; and
        while an engine starts, every second (its status line counts the seconds), and once the last
        minute's times to first token have aged out."""
        loop = asyncio.get_running_loop()
        while True:
            await self._news.wait()
            self._news.clear()
            try:
                snapshot = control.Snapshot(engines=self.registry.overview(first_tokens=True), workers=self.worker_states(),
                                            capacity=self.capacity[1] if self.capacity else None)
            except Exception:  # a bug here must not leave the workers without news for good
                log.exception("The engines' snapshot for the UI workers failed")
                continue
            await self._tell_all(snapshot)
            if self._timer is not None:
                self._timer.cancel()
            if any(view.state == EngineState.STARTING.value for view in snapshot.engines):
                self._timer = loop.call_later(1.0, self.news)
            elif any(view.ttft_p50_s is not None for view in snapshot.engines):
                self._timer = loop.call_later(FIRST_TOKENS_WINDOW_S, self.news)
            await asyncio.sleep(SNAPSHOT_GAP_S)
