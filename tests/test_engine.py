"""Engine ownership on the real CPU engine: sharing, starting once, and the memory budget."""

from __future__ import annotations

import asyncio

import psutil
import pytest

from chat.engine import EngineState
from chat.errors import EngineBusy
from chat.presets import load_preset, load_presets
from chat.registry import EngineRegistry
from chat.stats import Finish
from tests.conftest import eventually, small_preset
from tests.test_stream import reply_to

pytestmark = pytest.mark.engine


def engine_processes() -> list[psutil.Process]:
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "EngineCore" in " ".join(child.cmdline()) or child.name().startswith("VLLM::EngineCor"):
                found.append(child)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def small_presets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("presets")
    return [load_preset(small_preset(folder, name, context=context)) for name, context in (("Small A", 1024), ("Small B", 1536))]


async def test_presets_on_one_model_and_engine_share_one_engine_process(registry, engine):
    deterministic = load_presets().get("smollm2-135m-cpu-deterministic")
    before = {p.pid for p in engine_processes()}
    shared = await registry.get(deterministic)
    assert shared is engine
    assert {p.pid for p in engine_processes()} == before
    reply = reply_to(shared, deterministic, "Say yes.", max_tokens=3)
    async for _ in reply.stream():
        pass
    assert reply.stats.preset == deterministic.name


async def test_the_cpu_engine_runs_with_the_fastest_settings_for_this_processor(engine):
    import os

    import torch

    from chat import cpu

    assert engine.llm.model_config.dtype == getattr(torch, cpu.best_dtype())
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) <= cpu.SMALL_MACHINE_CORES:
        # vLLM pins each OpenMP thread of the model's worker to one core: every core has one.
        workers = [c for p in engine_processes() for c in p.children(recursive=True) if "Worker" in c.name()]
        affinities = [psutil.Process(t.id).cpu_affinity() for w in workers for t in w.threads()]
        pinned = {cores_of[0] for cores_of in affinities if len(cores_of) == 1}
        assert workers and pinned == set(cores), "the engine's threads may use every core"


async def test_budget_concurrency_and_unloading(small_presets):
    """One registry whose budget holds one small engine, exercised step by step."""
    first, second = small_presets
    before = {p.pid for p in engine_processes()}
    registry = EngineRegistry(memory_budget=1.3e9)  # one small engine (~0.8 GB) fits, two do not
    try:
        # Many sessions asking at once start the engine once.
        engines = await asyncio.gather(*(registry.get(first) for _ in range(6)))
        assert all(e is engines[0] for e in engines)
        engine_a = engines[0]
        started = [p for p in engine_processes() if p.pid not in before]
        assert len(started) == 1
        assert 0.5e9 < engine_a.memory_need < 1.3e9

        # An engine with a stream in flight is not unloaded to make room.
        # Long enough to be in flight while the second preset is refused (at once), short enough to
        # read to its end quickly: the refusal must not have disturbed it.
        reply = reply_to(engine_a, first, "Tell me a long story about owls.", max_tokens=48, temperature=0.8)
        stream = reply.stream()
        await anext(stream)
        with pytest.raises(EngineBusy) as caught:
            await registry.get(second)
        assert caught.value.message == (
            "Small B cannot be loaded while the other loaded models are in use; "
            "try again in a minute or pick a preset that is already loaded."
        )
        assert engine_a.state is EngineState.READY
        async for _ in stream:
            pass
        assert reply.stats.finish is Finish.MAX_TOKENS

        # Idle, it is the least recently used one: it is unloaded and its process ends.
        engine_b = await registry.get(second)
        assert engine_a.state is EngineState.CLOSED and engine_b.state is EngineState.READY

        def new_engines() -> list[psutil.Process]:
            return [p for p in engine_processes() if p.pid not in before]

        assert await eventually(lambda: len(new_engines()) == 1)
        assert new_engines()[0].pid != started[0].pid

        # Unloading on purpose ends streams in flight with a plain message, without hanging.
        reply = reply_to(engine_b, second, "Tell me a long story about foxes.", max_tokens=400, temperature=0.8)
        stream = reply.stream()
        await anext(stream)
        unload = asyncio.create_task(registry.unload(engine_b, "The operator unloaded this model to free memory."))
        async for _ in stream:
            pass
        await asyncio.wait_for(unload, 60)
        assert reply.stats.finish is Finish.UNLOADED
        assert reply.notice == "The operator unloaded this model to free memory."
        assert engine_b.state is EngineState.CLOSED
    finally:
        await registry.close_all()
    assert await eventually(lambda: {p.pid for p in engine_processes()} <= before)
