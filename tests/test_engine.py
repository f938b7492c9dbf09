"""Engine ownership on the real CPU engine: presets sharing one engine process, and the CPU engine's
settings. The memory budget's decisions are tests/test_registry.py's (stand-in engine)."""

from __future__ import annotations

import psutil
import pytest

from chat.presets import load_presets
from tests.test_stream import reply_to

pytestmark = pytest.mark.engine


def engine_processes() -> list[psutil.Process]:
    """The engine cores this process started (not those of apps that tests launch, which are their
    children: conftest launches the next test's app ahead while a test runs)."""
    found = []
    for child in psutil.Process().children():
        try:
            if "EngineCore" in " ".join(child.cmdline()) or child.name().startswith("VLLM::EngineCor"):
                found.append(child)
        except psutil.Error:
            continue
    return found


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
