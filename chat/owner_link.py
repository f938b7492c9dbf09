"""A UI worker's side of the engine owner (chat/owner.py): it asks for engines, never decides.

`LinkedRegistry` is the worker's `EngineRegistry`. Where a single process would start, wake or
restart an engine, it asks the owner, shows the owner's progress to its readers, and joins the
engine's shared core on the slot it is given (chat/engine_core.py). It reports twice a second what
only it knows (its streams, the scheduler views its client saw, its times to first token) and
shows what the owner sends back: every engine as the whole app sees it. When the owner wants to
take an engine away it asks first; an engine idle here is then held (new requests for it wait)
until the owner says what happened: resumed, asleep, unloaded (`detach`) or dead.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from pathlib import Path
from typing import Any

from chat import control, metrics
from chat.engine import RESTARTING, Engine, EngineState
from chat.engine_core import EngineSlot
from chat.errors import EngineBusy, InputError
from chat.presets import Preset
from chat.registry import EngineRegistry, EngineView, wait_ready

log = logging.getLogger(__name__)

REPORT_EVERY_S = 0.5
LOST = "The demo is restarting part of itself; try again in a moment."
FINAL = {"slot", "ready", "failed", "busy", "answer"}


class OwnerLink:
    """The worker's one connection to the owner."""

    def __init__(self, folder: Path, worker: int, on_lost: Callable[[], None] | None = None) -> None:
        self.folder, self.worker = folder, worker
        # Without its owner a worker cannot serve (the supervisor is gone or replacing it): it stops.
        self.on_lost = on_lost or (lambda: os.kill(os.getpid(), signal.SIGTERM))
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.snapshot: dict[str, Any] = {}
        self.registry: LinkedRegistry | None = None
        self.on_capacity_stop: list[Any] = []
        self._ids = 0
        self._answers: dict[int, asyncio.Queue[dict[str, Any]]] = {}

    async def open(self) -> None:
        self.reader, self.writer = await control.connect(self.folder)
        await self.send({"op": "hello", "worker": self.worker, "pid": os.getpid()})
        asyncio.get_running_loop().create_task(self._read(), name="owner link")

    async def send(self, message: dict[str, Any]) -> None:
        if self.writer is None:
            raise ConnectionError(LOST)
        await control.send(self.writer, message)

    async def ask(self, message: dict[str, Any]) -> AsyncIterator[dict[str, Any]]:
        """Send a request; yield the owner's answers to it, the last one final."""
        self._ids += 1
        ident = self._ids
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._answers[ident] = queue
        try:
            await self.send({**message, "id": ident})
            while True:
                answer = await queue.get()
                if answer.get("op") == "lost":
                    raise ConnectionError(LOST)
                yield answer
                if answer.get("op") in FINAL:
                    return
        finally:
            self._answers.pop(ident, None)

    async def _read(self) -> None:
        assert self.reader is not None
        try:
            while (message := await control.receive(self.reader)) is not None:
                ident = message.get("id")
                if isinstance(ident, int) and ident > 0:
                    queue = self._answers.get(ident)
                    if queue is not None:
                        queue.put_nowait(message)
                elif message.get("op") == "snapshot":
                    self.snapshot = message
                elif self.registry is not None:
                    await self.registry.obey(message)
        except Exception:
            log.exception("The connection to the engine owner failed")
        for queue in self._answers.values():
            queue.put_nowait({"op": "lost"})
        log.warning("UI worker %d lost the engine owner; stopping", self.worker)
        self.on_lost()

    # --- one capacity test at a time, for the whole app ----------------------------------------

    async def take_capacity(self, presets: list[str], nominal_s: float, by: str) -> None:
        async for answer in self.ask({"op": "capacity_take", "presets": presets, "nominal_s": nominal_s, "by": by}):
            if not answer.get("ok"):
                raise InputError(str(answer.get("message")))

    def give_back_capacity(self) -> None:
        asyncio.get_running_loop().create_task(self.send({"op": "capacity_give_back"}))

    def capacity_elsewhere(self) -> dict[str, Any] | None:
        capacity = self.snapshot.get("capacity")
        return capacity if isinstance(capacity, dict) else None

    async def stop_capacity_elsewhere(self) -> None:
        await self.send({"op": "capacity_stop"})


class LinkedRegistry(EngineRegistry):
    """A UI worker's engines: clients of shared cores that the owner starts and stops."""

    def __init__(self, link: OwnerLink, max_waiting: int = 256) -> None:
        super().__init__(memory_budget=None, max_waiting=max_waiting)
        self.link = link
        link.registry = self
        self._sent_first_tokens = 0.0

    def start(self, preset: Preset) -> Engine:
        engine = self._engines.get(preset.engine_key)
        if engine is not None and engine.state is EngineState.FAILED and time.monotonic() >= engine.retry_at:
            engine = None
        if engine is not None and engine.state is not EngineState.CLOSED:
            return engine
        engine = Engine(preset=preset, max_waiting=self.max_waiting)
        engine.on_death = self.restart
        self._engines[engine.key] = engine
        engine.task = asyncio.get_running_loop().create_task(self._acquire(engine), name=f"acquire {preset.name}")
        return engine

    def _wake(self, engine: Engine) -> None:
        if engine.task is not None and not engine.task.done():
            return
        engine.state, engine.phase, engine.started_at = EngineState.STARTING, "waking up", time.monotonic()
        engine.task = asyncio.get_running_loop().create_task(self._acquire(engine), name=f"wake {engine.preset.name}")

    def restart(self, dead: Engine) -> Engine:
        """This client saw its core die: the owner restarts cores; the next request joins the new one."""
        if dead.state is EngineState.READY:
            dead.state, dead.error, dead.retry_at = EngineState.FAILED, RESTARTING, 0.0
            asyncio.get_running_loop().create_task(
                self.link.send({"op": "dead", "key": dead.key, "generation": dead.generation}))
        return dead

    async def wait_until_ready(self, preset: Preset, every_s: float = 1.0) -> AsyncGenerator[str, None]:
        engine = self.prepare(preset)
        while True:
            if engine.held is not None:  # the owner is deciding whether to take it away
                yield f"Waiting for the engine for {preset.name}…"
                with contextlib.suppress(TimeoutError):  # not wait_for, which loses a cancel (chat/stream.py `paced`)
                    async with asyncio.timeout(every_s):
                        await engine.held.wait()
                if engine.held is None:  # decided: it may be asleep or unloaded now, so ask again
                    engine = self.prepare(preset)
                continue
            if engine.state is EngineState.STARTING:
                yield engine.status()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(every_s):
                        await wait_ready(engine)
                continue
            await wait_ready(engine)
            return

    async def _acquire(self, engine: Engine) -> None:
        engine.refusal = None
        have = engine.generation if engine.llm is not None else None
        try:
            async for answer in self.link.ask({"op": "acquire", "preset": engine.preset.name, "have": have}):
                op = answer["op"]
                if op == "status":
                    engine.phase, engine.start_delay_s = answer["phase"], answer["delay"]
                    engine.started_at = time.monotonic() - answer["elapsed"]
                elif op == "slot":
                    await self._join(engine, EngineSlot(**answer["slot"]), answer["generation"])
                elif op == "ready":
                    engine.state = EngineState.READY
                elif op == "busy":
                    engine.refusal = EngineBusy(answer["message"])
                    engine.state = EngineState.SLEEPING if engine.llm is not None else EngineState.CLOSED
                elif op == "failed":
                    self._failed(engine, answer["message"], answer.get("retry_in", 0.0))
        except ConnectionError:
            self._failed(engine, LOST, 0.0)
        except Exception as exc:
            log.exception("Joining the engine for %r failed", engine.preset.name)
            self._failed(engine, f"The engine for {engine.preset.name} could not be reached ({exc}).", 5.0)

    async def _join(self, engine: Engine, slot: EngineSlot, generation: int) -> None:
        if engine.llm is not None:  # a client of the core's earlier start
            await engine.abort_streams(RESTARTING)
            await engine.close()
        engine.slot, engine.generation = slot, generation
        engine.phase = "joining the shared engine"
        await asyncio.to_thread(engine.build, lambda _: None)
        engine.phase = "warming up"
        try:
            await engine.warm_up()
        except Exception:
            log.info("Warming up the engine for %r failed", engine.preset.name, exc_info=True)
        engine.state, engine.ready_at = EngineState.READY, time.monotonic()
        log.info("Joined the engine for %r (slot %d)", engine.preset.name, slot.index)

    def _failed(self, engine: Engine, message: str, retry_in: float) -> None:
        engine.state, engine.error = EngineState.FAILED, message
        engine.failures += 1
        engine.retry_at = time.monotonic() + retry_in

    async def obey(self, message: dict[str, Any]) -> None:
        """What the owner says: answer a question, or learn what happened to an engine."""
        op, key = message.get("op"), str(message.get("key", ""))
        engine = self._engines.get(key)
        if op == "drain":
            asyncio.get_running_loop().create_task(self._drain(message))
        elif op in ("resume", "asleep") and engine is not None:
            if op == "asleep":
                engine.state = EngineState.SLEEPING
            self._release(engine)
        elif op == "detach":
            if engine is not None:
                await self.unload(engine, str(message.get("reason") or "This model was unloaded."))
                self._release(engine)
            await self.link.send({"op": "answer", "id": message["id"]})
        elif op == "died" and engine is not None and engine.generation == message.get("generation"):
            engine.state, engine.error, engine.retry_at = EngineState.FAILED, RESTARTING, 0.0
            await engine.abort_streams(RESTARTING)
            await engine.close()
            engine.state = EngineState.FAILED  # as restart() leaves it: the next request joins the new core
            self._release(engine)
        elif op == "capacity_stop":
            for stop in self.link.on_capacity_stop:
                stop()

    async def _drain(self, message: dict[str, Any]) -> None:
        """Whether an engine is idle here; if it is, hold new requests for it until the owner says
        what became of it. A reply counts from the moment it picks the engine (`Engine.in_use`), so
        no request is between the pick and its stream when the answer is "idle"."""
        engine = self._engines.get(str(message.get("key", "")))
        idle = engine is None or (engine.state is not EngineState.STARTING and not engine.in_use)
        if idle and engine is not None and engine.held is None:
            engine.held = asyncio.Event()
        await self.link.send({"op": "answer", "id": message["id"], "idle": idle})

    @staticmethod
    def _release(engine: Engine) -> None:
        held, engine.held = engine.held, None
        if held is not None:
            held.set()

    async def report(self) -> None:
        """Tell the owner twice a second what this worker knows (until cancelled)."""
        while True:
            now, mono = time.time(), time.monotonic()
            engines = {}
            for engine in self:
                if engine.llm is None:
                    continue
                load = engine.load
                engines[engine.key] = {
                    "generation": engine.generation, "streams": engine.streams, "unfinished": engine.num_unfinished(),
                    "running": load.running, "waiting": load.waiting, "kv_cache_usage": load.kv_cache_usage,
                    "updated_at": load.updated_at, "generated_tokens": load.generated_tokens,
                    "idle_s": mono - engine.last_used}
            fresh = [(preset, seconds) for at, preset, seconds in metrics.RECENT_FIRST_TOKENS
                     if at > self._sent_first_tokens]
            self._sent_first_tokens = mono
            with contextlib.suppress(ConnectionError):
                await self.link.send({"op": "report", "at": now, "engines": engines, "first_tokens": fresh,
                                      "settled": self.settled()})
            await asyncio.sleep(REPORT_EVERY_S)

    def settled(self) -> bool:
        """Whether this worker has an engine and none of its engines is still starting (joining a
        core, warming up): until then its event loop shares the processor with that work."""
        engines = list(self)
        return bool(engines) and not any(e.state is EngineState.STARTING for e in engines)

    def overview(self, first_tokens: bool = False) -> list[EngineView]:
        engines = self.link.snapshot.get("engines")
        if engines is None:  # before the owner's first word: what this worker knows
            return super().overview(first_tokens)
        return [EngineView(**view) for view in engines]

    def workers(self) -> list[dict[str, Any]]:
        return list(self.link.snapshot.get("workers", []))
