"""One owner for every engine of the app, when several UI workers serve it (`--ui-workers N`).

The `EngineOwner` lives in the supervisor. It is the app's `EngineRegistry` (chat/registry.py): it
alone starts, wakes, puts to sleep, unloads and restarts engines, within the one memory budget,
and it backs off after failures. What changes is who uses the engines: each engine is a shared core
(chat/engine_core.py) with a client slot for every worker, and the owner holds slot 0 itself (for
sleep and wake, and to write the warm-up token). So before it takes an engine away it asks every
worker whether the engine is idle there (a worker then holds new requests for it until told what
happened), and it lets their clients go before it stops a core.

Each worker talks to it over chat/control.py:

    worker                                   owner
    acquire {preset, have}          ->       starts or wakes the engine (budget, back-off)
                                    <-       status* (what it is doing), then slot | ready | failed | busy
    report {engines, first_tokens}  ->       every half second: streams, load, use, times to first token
                                    <-       snapshot: every engine as the whole app sees it (EngineView)
                                    <-       drain {key} (answered: idle or not), resume, asleep, detach, died
    capacity_take / _give_back / _stop ->    one capacity test at a time for the whole app
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from chat import control
from chat.engine import Engine, EngineState
from chat.errors import ChatError, EngineBusy, PresetError
from chat.presets import PresetCatalog
from chat.registry import EngineRegistry, EngineView, first_token_percentiles

log = logging.getLogger(__name__)

SPARE_SLOTS = 4  # UI workers that can be replaced over a core's life (vLLM greets each slot once)
SNAPSHOT_EVERY_S = 0.5
ASK_TIMEOUT_S = 10.0
DETACH_TIMEOUT_S = 30.0
NO_SLOT = ("{name} has no connection left for a replaced UI worker; it gets new ones when the engine next "
           "starts. Pick another preset, or restart the app.")


class Peer:
    """One UI worker's connection to the owner."""

    def __init__(self, number: int, writer: asyncio.StreamWriter) -> None:
        self.number = number  # unique for the owner's life; a replaced worker is a new peer
        self.worker: int | None = None  # its UI worker number, once it said hello
        self.writer = writer
        self.reports: dict[str, dict[str, Any]] = {}  # engine key -> its latest report
        self.settled = False  # its first engine start has ended (joined and warmed up, or failed)
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def send(self, message: dict[str, Any]) -> None:
        with contextlib.suppress(ConnectionError, RuntimeError):
            await control.send(self.writer, message)

    async def ask(self, message: dict[str, Any], within_s: float = ASK_TIMEOUT_S) -> dict[str, Any]:
        """Send a request and wait for the worker's answer (TimeoutError if it does not come)."""
        ident = -next(self._ids)  # negative: the owner's requests; a worker's own are positive
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        try:
            await self.send({**message, "id": ident})
            async with asyncio.timeout(within_s):  # not wait_for, which may lose a cancel (chat/stream.py `paced`)
                return await future
        finally:
            self._waiting.pop(ident, None)

    def answered(self, message: dict[str, Any]) -> None:
        future = self._waiting.get(message.get("id", 0))
        if future is not None and not future.done():
            future.set_result(message)

    def gone(self) -> None:
        for future in self._waiting.values():
            if not future.done():
                future.set_exception(ConnectionError("the UI worker went away"))


class EngineOwner(EngineRegistry):
    """The app's engines, shared by every UI worker (see the module's docstring)."""

    def __init__(self, catalog: PresetCatalog, folder: Path, workers: int, memory_budget: float | None = None,
                 max_waiting: int = 256) -> None:
        super().__init__(memory_budget=memory_budget, max_waiting=max_waiting)
        self.catalog = catalog
        self.folder = folder
        self.slots = 1 + workers + SPARE_SLOTS
        self.peers: dict[int, Peer] = {}
        self.worker_states: Callable[[], list[dict[str, Any]]] = list
        self.capacity: dict[str, Any] | None = None  # the one capacity test running, and which peer runs it
        self.first_tokens: deque[tuple[float, str, float]] = deque(maxlen=10_000)
        self._numbers = itertools.count(1)
        self._generations = itertools.count(1)
        self._holders: dict[str, dict[int, int]] = {}  # engine key -> peer number -> its slot at the core
        self._free: dict[str, list[int]] = {}  # engine key -> slots nobody has taken
        self._snapshot_now = asyncio.Event()
        self._taking: dict[str, asyncio.Event] = {}  # engines being put to sleep or unloaded to make room

    async def serve(self) -> None:
        """Answer the workers until cancelled."""
        server = await control.listen(self.folder, self._serve_peer)
        tasks = [asyncio.create_task(self.watch(every_s=0.5)), asyncio.create_task(self._broadcast())]
        try:
            await asyncio.Event().wait()
        finally:
            server.close()
            for task in tasks:
                task.cancel()

    # --- the registry, for engines that other processes use ---------------------------------------

    def _build(self, engine: Engine, make_room: Callable[[Engine], None]) -> None:
        engine.generation = next(self._generations)
        self._holders[engine.key] = {}
        self._free[engine.key] = list(range(1, self.slots))
        engine.build(make_room, shared_slots=self.slots, sockets=self.folder)

    async def _may_take(self, engine: Engine) -> bool:
        if engine.in_use:
            return False
        peers = list(self.peers.values())
        answers = await asyncio.gather(*(p.ask({"op": "drain", "key": engine.key}) for p in peers),
                                       return_exceptions=True)
        if all(isinstance(a, dict) and a.get("idle") for a in answers):
            self._taking[engine.key] = asyncio.Event()  # a worker asking for it now waits until it is asleep or gone
            return True
        log.info("Keeping %r: a UI worker is using it (%s)", engine.preset.name,
                 ", ".join(repr(a) if isinstance(a, BaseException) else str(a.get("idle")) for a in answers))
        for peer in peers:
            await peer.send({"op": "resume", "key": engine.key})
        return False

    def _taken(self, engine: Engine) -> None:
        taken = self._taking.pop(engine.key, None)
        if taken is not None:
            taken.set()

    async def _before_unload(self, engine: Engine, reason: str) -> None:
        peers = list(self.peers.values())
        await asyncio.gather(*(p.ask({"op": "detach", "key": engine.key, "reason": reason}, within_s=DETACH_TIMEOUT_S)
                               for p in peers), return_exceptions=True)

    def _gone(self, engine: Engine, reason: str) -> None:
        self._tell_all({"op": "died", "key": engine.key, "generation": engine.generation, "reason": reason})

    def _changed(self, engine: Engine) -> None:
        if engine.state is EngineState.SLEEPING:
            self._tell_all({"op": "asleep", "key": engine.key})
        self._snapshot_now.set()

    def _tell_all(self, message: dict[str, Any]) -> None:
        for peer in list(self.peers.values()):
            asyncio.get_running_loop().create_task(peer.send(message))
        self._snapshot_now.set()

    def overview(self, first_tokens: bool = False) -> list[EngineView]:
        """Each engine with what every worker reported: streams and requests summed, the newest
        scheduler view, tokens written through every client."""
        now = time.monotonic()
        views = []
        for view, engine in zip(super().overview(), list(self), strict=True):
            reports = [r for p in self.peers.values() if (r := p.reports.get(engine.key))
                       and r.get("generation") == engine.generation]
            newest = max(reports, key=lambda r: r["updated_at"], default=None)
            load = engine.load
            running, waiting, kv = load.running, load.waiting, load.kv_cache_usage
            if newest is not None and newest["updated_at"] > load.updated_at:
                running, waiting, kv = newest["running"], newest["waiting"], newest["kv_cache_usage"]
            p50 = p95 = None
            if first_tokens:
                p50, p95 = first_token_percentiles(self.first_tokens, engine.preset.name, now)
            views.append(replace(
                view, running=running, waiting=waiting, kv_cache_usage=kv,
                unfinished=view.unfinished + sum(r["unfinished"] for r in reports),
                streams=view.streams + sum(r["streams"] for r in reports),
                generated_tokens=view.generated_tokens + sum(r["generated_tokens"] for r in reports),
                ttft_p50_s=p50, ttft_p95_s=p95))
        return views

    # --- the workers -----------------------------------------------------------------------

    def settled(self, worker: int) -> bool:
        """Whether UI worker `worker` (its current process) has ended its first engine start."""
        return any(p.worker == worker and p.settled for p in self.peers.values())

    async def _serve_peer(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = Peer(next(self._numbers), writer)
        self.peers[peer.number] = peer
        try:
            while (message := await control.receive(reader)) is not None:
                self._take(peer, message)
        except ValueError:
            log.warning("A UI worker sent a message the owner cannot read; its connection is closed")
        finally:
            del self.peers[peer.number]
            peer.gone()
            if self.capacity is not None and self.capacity["peer"] == peer.number:
                self.capacity = None
            writer.close()
            self._snapshot_now.set()

    def _take(self, peer: Peer, message: dict[str, Any]) -> None:
        op = message.get("op")
        if op == "hello":
            peer.worker = message.get("worker")
        elif op == "answer":
            peer.answered(message)
        elif op == "report":
            self._record(peer, message)
        elif op == "acquire":
            asyncio.get_running_loop().create_task(self._acquire(peer, message))
        elif op == "dead":
            engine = self._engines.get(message.get("key", ""))
            if engine is not None and engine.generation == message.get("generation") and engine.died:
                self.restart(engine)
        elif op in ("capacity_take", "capacity_give_back", "capacity_stop"):
            asyncio.get_running_loop().create_task(self._capacity(peer, op, message))
        else:
            log.warning("A UI worker sent an unknown message (%r)", op)

    def _record(self, peer: Peer, message: dict[str, Any]) -> None:
        peer.reports = message.get("engines", {})
        peer.settled = peer.settled or bool(message.get("settled"))
        now = time.monotonic()
        for key, report in peer.reports.items():
            engine = self._engines.get(key)
            if engine is not None:
                engine.last_used = max(engine.last_used, now - report.get("idle_s", 1e9))
        for preset, seconds in message.get("first_tokens", []):
            self.first_tokens.append((now, preset, seconds))

    async def _acquire(self, peer: Peer, message: dict[str, Any]) -> None:
        ident = message["id"]
        try:
            preset = self.catalog.get(str(message.get("preset")))
        except PresetError as exc:
            await peer.send({"op": "failed", "id": ident, "message": exc.message, "retry_in": 0})
            return
        try:
            while True:
                async for _ in self.wait_until_ready(preset):
                    engine = self.peek(preset)
                    if engine is not None:
                        await peer.send({"op": "status", "id": ident, "phase": engine.phase,
                                         "elapsed": time.monotonic() - engine.started_at,
                                         "delay": engine.start_delay_s})
                engine = await self.get(preset)
                taking = self._taking.get(engine.key)
                if taking is None:
                    break
                await taking.wait()  # being put to sleep or unloaded: then wake or start it again
        except EngineBusy as exc:
            await peer.send({"op": "busy", "id": ident, "message": exc.message})
            return
        except ChatError as exc:
            failed = self.peek(preset)
            retry_in = max(failed.retry_at - time.monotonic(), 0.0) if failed is not None else 0.0
            await peer.send({"op": "failed", "id": ident, "message": exc.message, "retry_in": retry_in})
            return
        holders = self._holders.setdefault(engine.key, {})
        if message.get("have") == engine.generation and peer.number in holders:
            await peer.send({"op": "ready", "id": ident})
            return
        free = self._free.get(engine.key, [])
        if not free or engine.core is None:
            await peer.send({"op": "failed", "id": ident, "message": NO_SLOT.format(name=preset.name), "retry_in": 60})
            return
        holders[peer.number] = index = free.pop(0)
        await peer.send({"op": "slot", "id": ident, "generation": engine.generation,
                         "slot": engine.core.slot(index).as_dict()})

    async def _capacity(self, peer: Peer, op: str, message: dict[str, Any]) -> None:
        holder = self.peers.get(self.capacity["peer"]) if self.capacity else None
        if op == "capacity_take":
            if holder is not None and holder is not peer:
                answer = {"ok": False, "message": "A capacity test is already running; wait for it to end, or press Stop."}
            else:
                self.capacity = {"peer": peer.number, "presets": message.get("presets", []),
                                 "ends_at": time.time() + float(message.get("nominal_s", 0)), "by": message.get("by", "")}
                answer = {"ok": True}
            await peer.send({"op": "answer", "id": message.get("id"), **answer})
        elif op == "capacity_give_back" and holder is peer:
            self.capacity = None
        elif op == "capacity_stop" and holder is not None:
            await holder.send({"op": "capacity_stop"})
        self._snapshot_now.set()

    async def _broadcast(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(SNAPSHOT_EVERY_S):
                    await self._snapshot_now.wait()
            self._snapshot_now.clear()
            try:
                snapshot = self.snapshot()
            except Exception:  # a bug here must not leave the workers without news for good
                log.exception("The engines' snapshot for the UI workers failed")
                continue
            for peer in list(self.peers.values()):
                await peer.send(snapshot)

    def snapshot(self) -> dict[str, Any]:
        capacity = None
        if self.capacity is not None:
            capacity = {k: v for k, v in self.capacity.items() if k != "peer"}
        return {"op": "snapshot", "engines": [v.as_dict() for v in self.overview(first_tokens=True)],
                "workers": self.worker_states(), "capacity": capacity}
