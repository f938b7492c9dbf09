"""The registry's decisions. Sleep mode: vLLM sleeps only on CUDA, so these unit tests give two engines
a stand-in for AsyncLLM's sleep and wake-up; bench/gpu_ops.py runs the real thing on a GPU. The memory
budget, starting once and unloading: on the stand-in engine (tests/stand_in.py)."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from chat.engine import Engine, EngineState
from chat.errors import EngineBusy
from chat.registry import EngineRegistry
from chat.stats import Finish
from tests.conftest import small_preset
from tests.test_stream import reply_to


class SleepyLLM:
    """AsyncLLM's sleep mode, as far as the registry sees it."""

    errored = False

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def sleep(self, level: int = 1) -> None:
        self.calls.append("sleep")

    async def wake_up(self) -> None:
        self.calls.append("wake")


@pytest.fixture
def two_sleepy_engines(monkeypatch, default_preset):
    monkeypatch.setattr("chat.engine.on_cpu", lambda: False)  # sleep mode is offered on CUDA only
    engines = []
    for name in ("A", "B"):
        preset = dataclasses.replace(
            default_preset, name=name, engine={**default_preset.engine, "enable_sleep_mode": True, "seed": ord(name)}
        )
        engine = Engine(preset=preset, state=EngineState.READY, memory_need=0.6)
        engine.llm = SleepyLLM()  # type: ignore[assignment]
        engines.append(engine)
    registry = EngineRegistry(memory_budget=1.0)  # room for one of the two
    for engine in engines:
        registry._engines[engine.key] = engine
    return registry, *engines


async def test_making_room_puts_the_idle_engine_to_sleep(two_sleepy_engines):
    registry, a, b = two_sleepy_engines
    b.state = EngineState.STARTING
    a.last_used = 0.0
    await registry.make_room(b)
    assert a.state is EngineState.SLEEPING and a.llm.calls == ["sleep"]  # asleep, not unloaded: it wakes in seconds


async def test_picking_a_sleeping_preset_wakes_it_and_the_other_sleeps(two_sleepy_engines):
    registry, a, b = two_sleepy_engines
    a.state = EngineState.SLEEPING
    engine = registry.prepare(a.preset)
    assert engine is a and a.state is EngineState.STARTING and "waking" in a.phase
    assert registry.prepare(a.preset) is a  # a second visitor picking it does not wake it twice
    await a.task
    assert a.state is EngineState.READY and a.llm.calls == ["wake"]
    assert b.state is EngineState.SLEEPING and b.llm.calls == ["sleep"]


async def test_an_engine_with_replies_in_flight_is_not_put_to_sleep(two_sleepy_engines):
    from chat.errors import EngineBusy

    registry, a, b = two_sleepy_engines
    b.state = EngineState.SLEEPING
    a._streams["a reply"] = lambda reason: None
    registry.prepare(b.preset)
    await b.task
    assert a.state is EngineState.READY and a.llm.calls == []
    assert b.state is EngineState.SLEEPING and isinstance(b.refusal, EngineBusy)


@pytest.fixture
def small_presets(tmp_path):
    from chat.presets import load_preset

    return [load_preset(small_preset(tmp_path, name, context=context), check_engine=False) for name, context in (("Small A", 1024), ("Small B", 1536))]


@pytest.mark.engine
async def test_budget_concurrency_and_unloading(small_presets):
    """One registry whose budget holds one small engine, exercised step by step, on the stand-in
    engine (each engine started is one token source; the real engine's unload is
    tests/test_workers.py's)."""
    from bench.token_source import install, uninstall
    from tests.stand_in import STEP_MS, replies

    first, second = small_presets
    started = install(step_s=STEP_MS / 1000, replies=replies())
    registry = EngineRegistry(memory_budget=1.3e9)  # one small engine (~0.8 GB) fits, two do not
    try:
        # Many sessions asking at once start the engine once.
        engines = await asyncio.gather(*(registry.get(first) for _ in range(6)))
        assert all(e is engines[0] for e in engines)
        engine_a = engines[0]
        assert len(started) == 1
        assert 0.5e9 < engine_a.memory_need < 1.3e9

        # An engine with a stream in flight is not unloaded to make room.
        reply = reply_to(engine_a, first, "Tell me a long story about owls.", max_tokens=48)
        stream = reply.stream()
        await anext(stream)
        with pytest.raises(EngineBusy) as caught:
            await registry.get(second)
        assert caught.value.message == (
            "Small B cannot be loaded while the other loaded models are in use; "
            "try again in a minute or pick a preset that is already loaded."
        )
        assert engine_a.state is EngineState.READY and len(started) == 1
        async for _ in stream:
            pass
        assert reply.stats.finish is Finish.MAX_TOKENS  # the refusal did not disturb it

        # Idle, it is the least recently used one: it is unloaded and the other starts.
        engine_b = await registry.get(second)
        assert engine_a.state is EngineState.CLOSED and engine_b.state is EngineState.READY
        assert list(registry) == [engine_b] and len(started) == 2

        # Unloading on purpose ends streams in flight with a plain message, without hanging.
        reply = reply_to(engine_b, second, "Tell me a long story about foxes.", max_tokens=400)
        stream = reply.stream()
        await anext(stream)
        unload = asyncio.create_task(registry.unload(engine_b, "The operator unloaded this model to free memory."))
        async for _ in stream:
            pass
        await asyncio.wait_for(unload, 60)
        assert reply.stats.finish is Finish.UNLOADED
        assert reply.notice == "The operator unloaded this model to free memory."
        assert engine_b.state is EngineState.CLOSED and not list(registry)
    finally:
        uninstall()
        await registry.close_all()
