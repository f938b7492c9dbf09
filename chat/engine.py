"""Engine ownership: one vLLM `AsyncLLM` per distinct (model, engine arguments), shared by all users.

An `Engine` goes STARTING -> READY, or -> FAILED (with a message for people), and -> CLOSED when
unloaded. The `EngineRegistry` starts each engine at most once however many sessions ask at the
same moment, keeps the loaded ones within a memory budget by unloading the least recently used
idle engine, and never unloads an engine under streams in flight unless asked to.

The engine is built in a worker thread (construction blocks while the model loads) and its
coroutines are only ever awaited from the server's event loop, which it binds to on first use.
"""

from __future__ import annotations

import asyncio
import enum
import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chat import cpu, metrics
from chat.errors import ChatError, EngineBusy, EngineError, EngineFailed
from chat.models import resolve_model, weights_bytes
from chat.presets import Preset

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

RETRY_DELAYS_S = (5.0, 15.0, 60.0, 300.0)  # after a failed start, back off before trying again
RESTART_DELAYS_S = (1.0, 5.0, 15.0, 60.0, 300.0)  # after consecutive crashes, wait this long to restart
HEALTHY_UPTIME_S = 300.0  # an engine that ran this long before dying starts its back-off afresh
RESTARTING = "The model's engine stopped working and is being restarted; your next message will wait for it."


class EngineState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    SLEEPING = "sleeping"  # CUDA sleep mode: weights parked in CPU memory, GPU memory free
    FAILED = "failed"
    CLOSED = "closed"


@dataclass
class EngineLoad:
    """The scheduler's view after its latest step (written by vLLM's stats hook)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0  # 0..1
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    generated_tokens: int = 0  # since the engine started


def _load_recorder(load: EngineLoad) -> Callable[..., Any]:
    """A vLLM per-engine stat-logger factory that copies scheduler stats into `load`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LoadRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if iteration_stats is not None:
                load.generated_tokens += iteration_stats.num_generation_tokens
            if scheduler_stats is None:
                return
            load.running = scheduler_stats.num_running_reqs
            load.waiting = scheduler_stats.num_waiting_reqs
            load.kv_cache_usage = scheduler_stats.kv_cache_usage
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                load.prefix_cache_hits += prefix.hits
                load.prefix_cache_queries += prefix.queries

        def log_engine_initialized(self) -> None:
            pass

    return LoadRecorder


def on_cpu() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu()


def engine_arguments(preset: Preset, folder: Path) -> dict[str, Any]:
    """The preset's engine arguments completed for this machine. On a CPU, a preset that names no
    dtype gets the fastest one for the processor, and the engine's processes the environment that
    suits it (chat/cpu.py)."""
    engine_args = dict(preset.engine)
    engine_args.setdefault("served_model_name", preset.model if preset.model_kind == "hub" else folder.name)
    if on_cpu():
        engine_args.setdefault("dtype", cpu.best_dtype())
        cpu.tune_environment()
    return engine_args


@dataclass
class Engine:
    """One AsyncLLM and what the app knows about it."""

    preset: Preset  # the first preset that asked for this configuration
    state: EngineState = EngineState.STARTING
    phase: str = "waiting to start"
    error: str | None = None
    llm: AsyncLLM | None = None
    model_dir: Path | None = None
    max_model_len: int = 0
    max_num_seqs: int = 0
    max_waiting: int = 256  # streams beyond max_num_seqs that may wait; more are refused at once
    memory_need: float = 0.0  # in the budget's unit: bytes on CPU, a share of GPU memory on GPU
    load: EngineLoad = field(default_factory=EngineLoad)
    streams: dict[str, Callable[[str], None]] = field(default_factory=dict)  # request id -> end it
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    last_used: float = field(default_factory=time.monotonic)
    failures: int = 0
    retry_at: float = 0.0
    refusal: EngineBusy | None = None  # why it was not started (no room); asking again may work
    start_delay_s: float = 0.0  # a restart after a crash waits this long first
    on_death: Callable[[Engine], object] | None = None  # set by the registry: restart it
    _task: asyncio.Task | None = None

    @property
    def key(self) -> str:
        return self.preset.engine_key

    @property
    def can_sleep(self) -> bool:
        """Presets opt in with `enable_sleep_mode: true`; vLLM supports it on CUDA only."""
        return bool(self.preset.engine.get("enable_sleep_mode")) and not on_cpu()

    @property
    def start_seconds(self) -> float | None:
        return None if self.ready_at is None else self.ready_at - self.started_at

    def status(self) -> str:
        """One line for people: what this engine is doing."""
        if self.state is EngineState.STARTING:
            verb = "Restarting" if self.start_delay_s else "Starting"
            return f"{verb} the engine for {self.preset.name}: {self.phase}… {time.monotonic() - self.started_at:.0f} s"
        if self.state is EngineState.FAILED:
            return self.error or "The engine failed to start."
        if self.state is EngineState.CLOSED:
            return "This engine was unloaded."
        if self.state is EngineState.SLEEPING:
            return "Asleep to make room for another model; it wakes in seconds with the next message."
        busy = f"{self.load.running} being written" + (f", {self.load.waiting} waiting" if self.load.waiting else "")
        return f"Ready · {busy} · KV cache {self.load.kv_cache_usage:.0%} used"

    async def wait_ready(self) -> None:
        if self._task is not None:
            await asyncio.shield(self._task)
        if self.refusal is not None:
            raise EngineBusy(self.refusal.message)
        if self.state is not EngineState.READY:
            raise EngineError(self.error or f"The engine for {self.preset.name} is not running; try again.")

    def num_unfinished(self) -> int:
        """Requests the engine's front end still tracks (0 when nothing leaked)."""
        return 0 if self.llm is None else self.llm.output_processor.get_num_unfinished_requests()

    async def abort_streams(self, reason: str) -> None:
        """End every stream in flight with `reason` shown to its reader, then abort them."""
        for end in list(self.streams.values()):
            end(reason)
        if self.llm is not None and self.streams:
            await self.llm.abort(list(self.streams))

    def _build(self, make_room: Callable[[Engine], None]) -> None:
        """Blocking: find the model, make room for it, start vLLM. Runs in a worker thread."""
        from vllm import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.phase = "finding the model"
        folder = resolve_model(self.preset, report=self._report)
        self.model_dir = folder
        engine_args = engine_arguments(self.preset, folder)
        args = AsyncEngineArgs(model=str(folder), **engine_args)
        if on_cpu():
            kv_bytes = engine_args.get("kv_cache_memory_bytes") or 4 << 30
            self.memory_need = kv_bytes + weights_bytes(folder, engine_args.get("dtype"))
        else:
            self.memory_need = float(args.gpu_memory_utilization)
        make_room(self)
        self.phase = "loading the model into vLLM"
        log.info("Starting the engine for preset %r (model %s)", self.preset.name, folder)
        self.llm = AsyncLLM.from_engine_args(args, stat_loggers=[_load_recorder(self.load)])
        self.max_model_len = self.llm.model_config.max_model_len
        self.max_num_seqs = self.llm.vllm_config.scheduler_config.max_num_seqs

    def _report(self, line: str) -> None:
        self.phase = line[0].lower() + line[1:] if line else line
        log.info("%s: %s", self.preset.name, line)

    def shutdown(self) -> None:
        """Blocking: free the engine's memory. Abort streams first or they hang forever."""
        llm, self.llm = self.llm, None
        self.state = EngineState.CLOSED
        if llm is not None:
            llm.shutdown()


class EngineRegistry:
    """The engines of this process, keyed by configuration, within one memory budget."""

    def __init__(self, memory_budget: float | None = None, max_waiting: int = 256) -> None:
        self._engines: dict[str, Engine] = {}
        self.memory_budget = memory_budget  # None: no limit
        self.max_waiting = max_waiting

    def __iter__(self):
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
        return self._launch(Engine(preset=preset, failures=failures))

    def _launch(self, engine: Engine, replacing: Engine | None = None) -> Engine:
        engine.on_death = self.restart
        engine.max_waiting = self.max_waiting
        self._engines[engine.key] = engine
        engine._task = asyncio.get_running_loop().create_task(
            self._run_start(engine, replacing), name=f"start {engine.preset.name}"
        )
        return engine

    def restart(self, dead: Engine) -> Engine:
        """Replace an engine whose process died; requests meanwhile wait for the new one."""
        current = self._engines.get(dead.key)
        if current is not dead:
            return current or self.start(dead.preset)  # already being replaced
        dead.state, dead.error = EngineState.FAILED, RESTARTING
        healthy = dead.ready_at is not None and time.monotonic() - dead.ready_at > HEALTHY_UPTIME_S
        crashes = 1 if healthy else dead.failures + 1
        delay = RESTART_DELAYS_S[min(crashes, len(RESTART_DELAYS_S)) - 1]
        log.error("The engine for %r died; restarting it in %.0f s (crash %d in a row)", dead.preset.name, delay, crashes)
        metrics.ENGINE_RESTARTS.labels(dead.preset.name).inc()
        return self._launch(Engine(preset=dead.preset, failures=crashes, start_delay_s=delay), replacing=dead)

    async def watch(self, every_s: float = 2.0) -> None:
        """Notice engines whose process died while idle (a stream notices at once by itself)."""
        while True:
            await asyncio.sleep(every_s)
            for engine in list(self._engines.values()):
                if engine.state is EngineState.READY and engine.llm is not None and engine.llm.errored:
                    self.restart(engine)

    async def get(self, preset: Preset) -> Engine:
        """The preset's engine, ready; starts it (once) if needed, or wakes it if asleep."""
        engine = self.start(preset)
        if engine.state is EngineState.SLEEPING:
            await self._wake(engine)
        await engine.wait_ready()
        engine.last_used = time.monotonic()
        return engine

    async def _wake(self, engine: Engine) -> None:
        if engine._task is not None and not engine._task.done():
            await asyncio.shield(engine._task)  # another session is already waking it
            return
        engine.state, engine.phase = EngineState.STARTING, "waking up"
        engine._task = asyncio.get_running_loop().create_task(self._run_wake(engine))
        await asyncio.shield(engine._task)

    async def _run_wake(self, engine: Engine) -> None:
        engine.refusal = None
        try:
            await self.make_room(engine)
            assert engine.llm is not None
            await engine.llm.wake_up()
            engine.state = EngineState.READY
        except EngineBusy as exc:
            engine.state, engine.refusal = EngineState.SLEEPING, exc
        except Exception as exc:
            log.exception("Waking the engine for %r failed", engine.preset.name)
            self._mark_failed(engine, f"The engine for {engine.preset.name} could not wake up ({exc}).")
    async def _run_start(self, engine: Engine, replacing: Engine | None = None) -> None:
        loop = asyncio.get_running_loop()
        make_room = functools.partial(self._make_room_threadsafe, loop)
        try:
            if replacing is not None:
                engine.phase = "cleaning up after the crash"
                try:
                    await asyncio.to_thread(replacing.shutdown)
                except Exception:
                    log.warning("Shutting down the dead engine for %r failed", replacing.preset.name, exc_info=True)
            if engine.start_delay_s:
                engine.phase = f"waiting {engine.start_delay_s:.0f} s before trying again"
                await asyncio.sleep(engine.start_delay_s)
            await asyncio.to_thread(engine._build, make_room)
        except EngineBusy as exc:
            engine.refusal, engine.state = exc, EngineState.CLOSED
            if self._engines.get(engine.key) is engine:
                del self._engines[engine.key]
        except ChatError as exc:
            self._mark_failed(engine, exc.message)
        except Exception as exc:  # vLLM raises many kinds at start; the message is kept for the log
            log.exception("The engine for preset %r failed to start", engine.preset.name)
            first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self._mark_failed(engine, f"The engine for {engine.preset.name} could not start ({first_line[:300]}).")
        else:
            engine.state = EngineState.READY
            engine.ready_at = time.monotonic()
            log.info("Engine for %r ready in %.1f s", engine.preset.name, engine.start_seconds)

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
            idle = [
                e
                for e in self._engines.values()
                if e is not incoming and e.state is EngineState.READY and not e.streams
            ]
            if not idle:
                raise EngineBusy(
                    f"{incoming.preset.name} cannot be loaded while the other loaded models are in use; "
                    "try again in a minute or pick a preset that is already loaded."
                )
            victim = min(idle, key=lambda e: e.last_used)
            if victim.can_sleep and victim.llm is not None:
                log.info("Putting %r to sleep to make room for %r", victim.preset.name, incoming.preset.name)
                await victim.llm.sleep(level=1)  # weights to CPU memory, KV cache dropped
                victim.state = EngineState.SLEEPING
            else:
                log.info("Unloading %r to make room for %r", victim.preset.name, incoming.preset.name)
                await self.unload(victim)

    async def unload(self, engine: Engine, reason: str = "This model was unloaded by the operator.") -> None:
        """Unload an engine; streams in flight end with `reason` (aborted first, or they hang)."""
        await engine.abort_streams(reason)
        await asyncio.to_thread(engine.shutdown)
        if self._engines.get(engine.key) is engine:
            del self._engines[engine.key]

    async def close_all(self) -> None:
        for engine in list(self._engines.values()):
            if engine._task is not None and not engine._task.done():
                continue  # still in its worker thread; the process exit ends its child processes
            await self.unload(engine, "The demo is shutting down.")

    def loaded(self) -> list[Engine]:
        return [e for e in self._engines.values() if e.state is EngineState.READY]


def engine_failed(engine: Engine, exc: BaseException) -> EngineFailed:
    """An engine's process died under a stream: have it restarted, and say so plainly."""
    log.error("Engine for %r died under a stream: %r", engine.preset.name, exc)
    if engine.on_death is not None and engine.state is EngineState.READY:
        engine.on_death(engine)
    return EngineFailed(RESTARTING)
