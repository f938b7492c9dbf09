"""The registry's sleep-mode decisions. vLLM sleeps only on CUDA, so these unit tests give two engines
a stand-in for AsyncLLM's sleep and wake-up; bench/gpu_ops.py runs the real thing on a GPU."""

from __future__ import annotations

import dataclasses

import pytest

from chat.engine import Engine, EngineState
from chat.registry import EngineRegistry


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
