"""The engines of this process: one per distinct (model, engine arguments), within a memory budget.

The `EngineRegistry` starts each engine at most once however many sessions ask at the same moment,
keeps the loaded ones within a memory budget by unloading (or, on CUDA, putting to sleep) the least
recently used idle engine, never unloads an engine under streams in flight unless asked to, backs
off after failed starts, and restarts an engine whose process died.

What differs when other processes share the engines is given to the registry as its `Sharing`:
with several UI workers the supervisor's `EngineOwner` (chat/owner.py) makes the same decisions
once, for all of them, asking the workers before it takes an engine away, and each worker's
`OwnerLink` (chat/owner_link.py) asks the owner for an engine instead of starting one itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncGenerator, Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from chat import metrics
from chat.engine import RESTARTING, Engine, EngineState
from chat.errors import ChatError, EngineBusy, EngineError, first_line
from chat.presets import Preset
from chat.stats import percentile

log = logging.getLogger(__name__)

RETRY_DELAYS_S = (5.0, 15.0, 60.0, 300.0)  # after a failed start, back off before trying again
RESTART_DELAYS_S = (1.0, 5.0, 15.0, 60.0, 300.0)  # after consecutive crashes, wait this long to restart
HEALTHY_UPTIME_S = 300.0  # an engine that ran this long before dying starts its back-off afresh


FIRST_TOKENS_WINDOW_S = 60.0  # an engine's view carries the time to first token over this long


@dataclass(frozen=True)
class EngineView:
    """What the whole app knows about one engine, for /healthz, the engine line and Monitor: the
    same with one process or several (chat/owner.py adds up what every worker saw)."""

    key: str
    preset: str
    state: str  # an EngineState value
    status: str  # a line for people (Engine.status)
    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    unfinished: int = 0  # requests vLLM's clients still track (0 when nothing leaked)
    streams: int = 0  # replies being streamed now
    start_seconds: float | None = None
    generated_tokens: int = 0
    ttft_p50_s: float | None = None  # over the last minute
    ttft_p95_s: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def first_token_percentiles(samples: Iterable[tuple[float, str, float]], preset: str,
                            now: float) -> tuple[float | None, float | None]:
    """Median and 95th percentile of `preset`'s recent (monotonic time, preset, seconds) samples."""
    recent = sorted(s for t, name, s in samples if name == preset and now - t <= FIRST_TOKENS_WINDOW_S)
    return percentile(recent, 50), percentile(recent, 95)


class Sharing:
    """How a registry's engines are shared with other processes: here, not at all (one process).

    The registry calls these at the points where sharing changes what happens; chat/owner.py and
    chat/owner_link.py each give their registry one of their own."""

    async def prepare(self, engine: Engine) -> None:
        """Before an engine is built: nothing here (a UI worker asks the owner for a client slot)."""

    def build(self, engine: Engine, make_room: Callable[[Engine], None]) -> None:
        """Blocking (in a worker thread): start vLLM for `engine`, or join the core its slot names."""
        engine.build(make_room)

    async def wake(self, engine: Engine) -> None:
        await engine.wake_up()

    async def may_take(self, engine: Engine) -> bool:
        """Whether an engine may be put to sleep or unloaded now to make room: nobody is using it."""
        return not engine.in_use

    def taken(self, engine: Engine) -> None:
        """An engine `may_take` allowed is asleep or unloaded now (or the attempt failed)."""

    async def before_unload(self, engine: Engine, reason: str) -> None:
        """Before an engine's processes stop: nothing here (the owner lets its clients go first)."""

    def died(self, engine: Engine) -> bool:
        """An engine's process died: whether this registry restarts it (a UI worker leaves that to the owner)."""
        return True

    def changed(self, engine: Engine) -> None:
        """An engine's start or wake ended, or it went to sleep or was unloaded."""

    def views(self, own: list[EngineView], first_tokens: bool) -> list[EngineView]:
        """The app's engines, from this process's `own` views."""
        return own

    def workers(self) -> list[dict[str, Any]]:
        """The UI workers serving the app and their states (none: this process serves alone)."""
        return []


async def wait_ready(engine: Engine) -> None:
    """Return once the engine's start or wake (the registry's task) has ended with it ready; raise
    EngineBusy when it was refused for lack of room, EngineError when it failed or was unloaded."""
    if engine.task is not None:
        await asyncio.shield(engine.task)
    if engine.refusal is not None:
        raise EngineBusy(engine.refusal.message)
    if engine.state is not EngineState.READY:
        raise EngineError(engine.error or f"The engine for {engine.preset.name} is not running; try again.")


class EngineRegistry:
    """The engines of this process, keyed by configuration, within one memory budget."""

    # What an engine is made of: vLLM's, or the engine layer's stand-in for tests whose subject is
    # not the engine (tests/stand_in.py sets it in the processes it starts).
    engine_type: type[Engine] = Engine

    def __init__(self, memory_budget: float | None = None, max_waiting: int = 256,
                 sharing: Sharing | None = None) -> None:
        self._engines: dict[str, Engine] = {}
        self.sharing = sharing or Sharing()
        self.memory_budget = memory_budget  # None: no limit
        self.max_waiting = max_waiting
        self.closing = False  # the app is shutting down: an engine start that fails now was stopped
        self.building: dict[str, Engine] = {}  # by key: engines whose vLLM processes are being started (in threads)

    def __iter__(self) -> Iterator[Engine]:
        return iter(list(self._engines.values()))

    def peek(self, preset: Preset) -> Engine | None:
        return self._engines.get(preset.engine_key)

    def start(self, preset: Preset) -> Engine:
        """Begin loading the preset's engine if it is not loaded or loading; never blocks."""
        engine = self._engines.get(preset.engine_key)
        now = time.monotonic()
        if engine is not None and engine.state is EngineState.FAILED and now >= engine.retry_at:
            engine = None  # back-off over: try again
        if engine is not None and engine.state is not EngineState.CLOSED:
            return engine
        failures = 0 if engine is None else engine.failures
        return self._launch(self.engine_type(preset=preset, failures=failures))

    def _launch(self, engine: Engine, replacing: Engine | None = None) -> Engine:
        engine.on_death = self.restart
        engine.max_waiting = self.max_waiting
        self._engines[engine.key] = engine
        engine.task = asyncio.get_running_loop().create_task(
            self._run_start(engine, replacing), name=f"start {engine.preset.name}"
        )
        return engine

    def restart(self, dead: Engine) -> Engine:
        """Replace an engine whose process died; requests meanwhile wait for the new one."""
        current = self._engines.get(dead.key)
        if current is not dead:
            return current or self.start(dead.preset)  # already being replaced
        dead.state, dead.error = EngineState.FAILED, RESTARTING
        if not self.sharing.died(dead):
            return dead
        healthy = dead.ready_at is not None and time.monotonic() - dead.ready_at > HEALTHY_UPTIME_S
        crashes = 1 if healthy else dead.failures + 1
        delay = RESTART_DELAYS_S[min(crashes, len(RESTART_DELAYS_S)) - 1]
        log.error("The engine for %r died; restarting it in %.0f s (crash %d in a row)", dead.preset.name, delay, crashes)
        metrics.ENGINE_RESTARTS.labels(dead.preset.name).inc()
        return self._launch(self.engine_type(preset=dead.preset, failures=crashes, start_delay_s=delay), replacing=dead)

    async def watch(self, every_s: float = 2.0) -> None:
        """Notice engines whose process died while idle (a stream notices at once by itself; vLLM only
        sets a flag). A process serving alone runs it; a UI worker's cores are the owner's, which sees them end."""
        while True:
            await asyncio.sleep(every_s)
            for engine in list(self._engines.values()):
                if engine.died:
                    self.restart(engine)

    def prepare(self, preset: Preset) -> Engine:
        """Begin loading the preset's engine, or waking it, as soon as someone picks it; never blocks."""
        engine = self.start(preset)
        if engine.state is EngineState.SLEEPING:
            self._wake(engine)
        return engine

    async def wait_until_ready(self, preset: Preset, every_s: float = 1.0) -> AsyncGenerator[str, None]:
        """Yield a status line every `every_s` while the preset's engine starts or wakes; return once
        it is ready. Raises EngineError (EngineBusy when there is no room for it now). An engine
        `held` (the owner of shared engines may be taking it away) is asked for again once released."""
        engine = self.prepare(preset)
        while engine.state is EngineState.STARTING or engine.held is not None:
            held = engine.held
            yield engine.status() if held is None else f"Waiting for the engine for {preset.name}…"
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(every_s):  # not wait_for, which loses a cancel (chat/stream.py `paced`)
                    await (wait_ready(engine) if held is None else held.wait())
            if held is not None and engine.held is None:  # released: it may be asleep or unloaded now
                engine = self.prepare(preset)
        await wait_ready(engine)

    async def ready(self, preset: Preset, every_s: float = 1.0) -> AsyncGenerator[str | Engine, None]:
        """`wait_until_ready`'s status lines, then the preset's engine, ready, as the last item: one
        call takes a reply from "pick a preset" to "an engine to write with". Raises as `wait_until_ready`."""
        async for status in self.wait_until_ready(preset, every_s):
            yield status
        engine = self.start(preset)
        engine.last_used = time.monotonic()
        yield engine

    async def get(self, preset: Preset) -> Engine:
        """The preset's engine, ready; starts it (once) if needed, or wakes it if asleep."""
        async for step in self.ready(preset):
            if isinstance(step, Engine):
                return step
        raise AssertionError("EngineRegistry.ready ended without an engine")

    def _wake(self, engine: Engine) -> None:
        if engine.task is not None and not engine.task.done():
            return  # another session is already waking it
        engine.state, engine.phase = EngineState.STARTING, "waking up"
        engine.task = asyncio.get_running_loop().create_task(self._run_wake(engine))

    async def _run_wake(self, engine: Engine) -> None:
        engine.refusal = None
        try:
            await self.make_room(engine)
            await self.sharing.wake(engine)
        except EngineBusy as exc:
            engine.state, engine.refusal = EngineState.SLEEPING, exc
        except ChatError as exc:  # said in words already (a UI worker's owner could not wake it)
            self._mark_failed(engine, exc.message)
        except Exception as exc:
            log.exception("Waking the engine for %r failed", engine.preset.name)
            self._mark_failed(engine, f"The engine for {engine.preset.name} could not wake up ({exc}).")
        finally:
            self.sharing.changed(engine)

    async def _run_start(self, engine: Engine, replacing: Engine | None = None) -> None:
        loop = asyncio.get_running_loop()
        make_room = functools.partial(self._make_room_threadsafe, loop)
        try:
            if replacing is not None:
                engine.phase = "cleaning up after the crash"
                try:
                    await replacing.close()
                except Exception:
                    log.warning("Shutting down the dead engine for %r failed", replacing.preset.name, exc_info=True)
            if engine.start_delay_s:
                engine.phase = f"waiting {engine.start_delay_s:.0f} s before trying again"
                await asyncio.sleep(engine.start_delay_s)
            await self.sharing.prepare(engine)
            await asyncio.to_thread(self._build_unless_closing, engine, make_room)
        except EngineBusy as exc:
            engine.refusal, engine.state = exc, EngineState.CLOSED
            if self._engines.get(engine.key) is engine:
                del self._engines[engine.key]
        except ChatError as exc:
            self._mark_failed(engine, exc.message)
        except Exception as exc:  # vLLM raises many kinds at start; the message is kept for the log
            if self.closing:  # its processes were ended under it (chat/server.py's Shutdown)
                engine.state = EngineState.CLOSED
                log.info("The engine for %r was stopped while it started", engine.preset.name)
                return
            log.exception("The engine for preset %r failed to start", engine.preset.name)
            self._mark_failed(engine, f"The engine for {engine.preset.name} could not start ({first_line(exc)[:300]}).")
        else:
            engine.phase = "warming up"
            try:
                await engine.warm_up()
            except Exception:  # a reader's first request then pays for it; nothing else depends on it
                log.info("Warming up the engine for %r failed", engine.preset.name, exc_info=True)
            engine.state = EngineState.READY
            engine.ready_at = time.monotonic()
            log.info("Engine for %r ready in %.1f s", engine.preset.name, engine.start_seconds)
        finally:
            self.sharing.changed(engine)

    def _mark_failed(self, engine: Engine, message: str) -> None:
        engine.state = EngineState.FAILED
        engine.failures += 1
        delay = RETRY_DELAYS_S[min(engine.failures, len(RETRY_DELAYS_S)) - 1]
        engine.retry_at = time.monotonic() + delay
        engine.error = message
        log.warning("%s (retrying on the next request after %.0f s)", message, delay)

    def _make_room_threadsafe(self, loop: asyncio.AbstractEventLoop, engine: Engine) -> None:
        asyncio.run_coroutine_threadsafe(self.make_room(engine), loop).result()

    async def make_room(self, incoming: Engine) -> None:
        """Unload least recently used idle engines until `incoming` fits the budget."""
        if self.memory_budget is None:
            return

        def held() -> float:
            return sum(
                e.memory_need
                for e in self._engines.values()
                if e is not incoming and e.state in (EngineState.READY, EngineState.STARTING)
            )

        while held() + incoming.memory_need > self.memory_budget:
            idle = sorted((e for e in self._engines.values() if e is not incoming and e.state is EngineState.READY),
                          key=lambda e: e.last_used)
            victim = None
            for candidate in idle:
                if await self.sharing.may_take(candidate):
                    victim = candidate
                    break
            if victim is None:
                raise EngineBusy(
                    f"{incoming.preset.name} cannot be loaded while the other loaded models are in use; "
                    "try again in a minute or pick a preset that is already loaded."
                )
            try:
                if victim.can_sleep and victim.loaded:
                    log.info("Putting %r to sleep to make room for %r", victim.preset.name, incoming.preset.name)
                    await victim.sleep()
                    self.sharing.changed(victim)
                else:
                    log.info("Unloading %r to make room for %r", victim.preset.name, incoming.preset.name)
                    await self.unload(victim)
            finally:
                self.sharing.taken(victim)

    async def unload(self, engine: Engine, reason: str = "This model was unloaded by the operator.") -> None:
        """Unload an engine; streams in flight end with `reason` (aborted first, or they hang)."""
        await engine.abort_streams(reason)
        await self.sharing.before_unload(engine, reason)
        await engine.close()
        if self._engines.get(engine.key) is engine:
            del self._engines[engine.key]
        self.sharing.changed(engine)

    async def close_all(self) -> None:
        """Unload every engine, all at once: each waits seconds for its processes to end."""
        self.closing = True
        # One still starting is in its worker thread, which cannot be cancelled: the stop ends its
        # processes after this (chat/server.py end_starting_engines), and its start then fails.
        closing = [e for e in self._engines.values() if e.task is None or e.task.done()]
        outcomes = await asyncio.gather(*(self.unload(engine, "The demo is shutting down.") for engine in closing),
                                        return_exceptions=True)  # one that fails does not keep the others
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome

    def loaded(self) -> list[Engine]:
        return [e for e in self._engines.values() if e.state is EngineState.READY]

    def overview(self, first_tokens: bool = False) -> list[EngineView]:
        """Every engine of the app, as people and load balancers see it (with the recent times to
        first token only when asked: they take a sort of up to 10,000 samples)."""
        now = time.monotonic()
        views = []
        for engine in self._engines.values():
            p50 = p95 = None
            if first_tokens:
                p50, p95 = first_token_percentiles(metrics.RECENT_FIRST_TOKENS, engine.preset.name, now)
            views.append(EngineView(
                engine.key, engine.preset.name, engine.state.value, engine.status(), engine.load.running,
                engine.load.waiting, engine.load.kv_cache_usage, engine.num_unfinished(), engine.streams,
                engine.start_seconds, engine.load.generated_tokens, p50, p95))
        return self.sharing.views(views, first_tokens)

    def workers(self) -> list[dict[str, Any]]:
        """The UI workers serving the app and their states (none: this process serves alone)."""
        return self.sharing.workers()

    def view(self, preset: Preset) -> EngineView | None:
        return next((v for v in self.overview() if v.key == preset.engine_key), None)

    def _build_unless_closing(self, engine: Engine, make_room: Callable[[Engine], None]) -> None:
        """A start asked for as the app stops (a page's first message, the default engine of an app
        stopped during its own start) never starts vLLM; one under way is seen in `building` by the
        stop, which ends its processes (chat/server.py end_starting_engines)."""
        if self.closing:
            raise RuntimeError("the app is stopping")
        self.building[engine.key] = engine
        try:
            self.sharing.build(engine, make_room)
        finally:
            self.building.pop(engine.key, None)
