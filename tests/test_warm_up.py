"""The engine's start-time warm-up (chat/engine.py): readers' own sampling, and on a GPU a batch that walks
down through every size, so that vLLM compiles its sampler's kernels before the first reader, not in
the first round (issue 48, part 4: that round ran at 0.70x on an H100 without it)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

import pytest

from chat.engine import WARM_UP_BATCH, Engine, EngineState, Prompt, warm_up_requests
from chat.engine_core import EngineSlot

USES_VLLM = True  # vLLM's SamplingParams, no engine started (tests/conftest.py: the engine tier)


class CountingLLM:
    """AsyncLLM.generate as the warm-up uses it: a token per step for each request, every request in
    flight advancing together; it records the batch size of each step."""

    def __init__(self) -> None:
        self.params: list[Any] = []
        self.running = 0
        self.batch_sizes: list[int] = []

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[str]:
        self.params.append(params)
        self.running += 1
        try:
            for _ in range(params.max_tokens):
                await asyncio.sleep(0)  # every request in flight takes its step before the next
                self.batch_sizes.append(self.running)
                yield request_id
        finally:
            self.running -= 1


async def test_the_batch_walks_down_through_every_size_with_the_readers_sampling(default_preset):
    llm = CountingLLM()
    sampling = dataclasses.replace(default_preset.sampling.defaults, temperature=0.7, top_p=0.9)

    await warm_up_requests(llm, "Hi", sampling, 5, "warm-up")

    assert sorted(p.max_tokens for p in llm.params) == [1, 2, 3, 4, 5]
    assert sorted(set(llm.batch_sizes)) == [1, 2, 3, 4, 5]  # each size from 5 down to 1 ran
    assert {(p.temperature, p.top_p) for p in llm.params} == {(0.7, 0.9)}


@pytest.mark.parametrize(("gpu", "joined", "expected"), [(True, False, WARM_UP_BATCH), (True, True, 1), (False, False, 1)])
async def test_only_a_gpu_core_s_starter_sends_the_batch(monkeypatch, default_preset, gpu, joined, expected):
    """A UI worker joins the owner's warmed core (one request warms its own process); on the CPU the
    sampler has no kernel to compile."""
    monkeypatch.setattr("chat.engine.on_cpu", lambda: not gpu)
    llm = CountingLLM()
    engine = Engine(preset=default_preset, state=EngineState.STARTING, max_num_seqs=1024)
    engine.llm = llm  # type: ignore[assignment]
    engine.slot = EngineSlot("ipc://in", "ipc://out", 2, 1, None) if joined else None

    async def render(messages: list[dict[str, str]]) -> Prompt:
        return Prompt(token_ids=[1, 2], rendered="Hi")

    monkeypatch.setattr(engine, "render", render)
    await engine.warm_up()

    assert len(llm.params) == expected
    assert {p.temperature for p in llm.params} == {default_preset.sampling.defaults.temperature}
