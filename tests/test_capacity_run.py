"""The capacity test through the reply pipeline, on the stand-in engine (tests/stand_in.py; the capacity
test on the real engine is tests/test_browser_capacity.py's): steps of 1 to 4 simulated users, Stop,
and visitors first (the engine's priority scheduling, and the pause)."""

from __future__ import annotations

import asyncio
import contextlib
import json

import pytest

from chat.capacity import Metric, make_plan
from chat.capacity_run import SYNTHETIC_PRIORITY, CapacityLab, Progress
from chat.errors import InputError
from chat.presets import load_presets
from chat.service import ChatService, Failed, Finished, ReplyRequest, Writing
from tests.conftest import eventually, small_preset, stand_in_ready
from tests.stand_in_fixtures import engine, registry, service  # noqa: F401 - on the stand-in engine

pytestmark = pytest.mark.engine


PRIORITY_PRESET = "Two slots, visitors first"


@pytest.fixture(scope="module")
async def two_slots(registry, tmp_path_factory):
    """A preset of the embedded model with two slots, priority scheduling and fixed reply lengths."""
    folder = tmp_path_factory.mktemp("presets")
    small_preset(folder, PRIORITY_PRESET, ignore_eos=True, timeout_s=600,  # waiting for a slot is not idleness
                 engine={"dtype": "float32", "max_model_len": 1024, "kv_cache_memory_bytes": 268435456,
                         "enforce_eager": True, "max_num_seqs": 2, "scheduling_policy": "priority"})
    presets = load_presets(folder)
    engine = await stand_in_ready(registry, presets.get(PRIORITY_PRESET))
    yield ChatService(presets, registry, PRIORITY_PRESET)
    await registry.unload(engine)  # the session's registry is the other modules' too


async def drive(run) -> list[Progress]:
    return [progress async for progress in run.run()]


async def test_a_short_test_measures_each_step_of_one_to_four_users(service, engine):
    lab = CapacityLab(service)
    # Replies short enough to finish inside a step (only finished ones count prompt tokens): the
    # stand-in writes 8 tokens in a quarter of a second.
    plan = make_plan([service.default_preset], max_users=4, step_s=2, prompt_tokens=32, reply_tokens=8)
    run = await lab.begin(plan, by="test")
    with pytest.raises(InputError, match="A capacity test is already running"):
        await lab.begin(plan)
    seen = await drive(run)
    assert run.ended == "finished" and lab.running is None and lab.banner() == ""
    assert {(p.step, p.users) for p in seen} >= {(1, 1), (2, 2), (3, 4)}
    assert [s.users for s in run.steps] == [1, 2, 4]
    for step in run.steps:
        assert step.requests >= step.users and step.failed == 0, step
        assert step.first_token_p50_s is not None and step.first_token_p95_s >= step.first_token_p50_s > 0, step
        assert step.tokens > 0 and step.tokens_per_s_total > 0 and step.tokens_per_s_per_user, step
        assert step.seconds == 2.0, step
    assert any(step.prompt_tokens_median and step.prompt_tokens_median >= 32 for step in run.steps), run.steps
    # More users share the engine: together they write more than one alone.
    assert run.steps[-1].tokens_per_s_total > run.steps[0].tokens_per_s_total
    report = json.loads(run.report().to_json())
    assert report["presets"][service.default_preset]["sampling"]["max_tokens"] == 8
    assert report["verdicts"][0].startswith(service.default_preset)
    print("\n" + "\n".join(f"{s.users} users: first token p50 {s.first_token_p50_s * 1000:.0f} ms, "
                           f"p95 {s.first_token_p95_s * 1000:.0f} ms, {s.tokens_per_s_per_user:.1f} tok/s per user, "
                           f"{s.tokens_per_s_total:.1f} tok/s in total" for s in run.steps))


async def test_stop_aborts_every_request_of_the_test_at_once(service, engine):
    lab = CapacityLab(service)
    run = await lab.begin(make_plan([service.default_preset], max_users=4, step_s=3, prompt_tokens=32, reply_tokens=400))
    driving = asyncio.ensure_future(drive(run))
    assert await eventually(lambda: run.progress.users == 4 and engine.streams >= 3, within_s=30), run.progress
    assert lab.banner().startswith("A capacity test is running on SmolLM2 135M (CPU): replies may be slower for")
    run.stop()
    await asyncio.wait_for(driving, timeout=60)
    assert run.ended == "stopped by you" and [s.users for s in run.steps] == [1, 2]
    assert "The step under way when the test stopped is left out." in run.notes
    assert await eventually(lambda: engine.streams == 0 and engine.num_unfinished() == 0, within_s=30)


async def test_closing_the_capacity_tabs_turn_stops_its_test_at_once(service, engine):
    """The tab's Run closed as Gradio's /cancel closes it (a page closed, or its connection lost)."""
    import gradio as gr

    from chat.admin import Admins
    from chat.ui.capacity_tab import CapacityTab

    lab = CapacityLab(service)
    with gr.Blocks(), gr.Tab("Capacity"):
        tab = CapacityTab(service, lab, Admins(frozenset({"admin"})))
    request = gr.Request(username="admin", session_hash="capacity-tab")
    updates = tab.run(request, service.default_preset, None, 4, 3, 32, 400, Metric.FIRST_TOKEN_P95.value, 800)
    progress = None
    async for update in updates:
        progress = update.get(tab.progress, progress)
        if engine.streams >= 2:
            break
    assert engine.streams >= 2, f"the test's users are being answered: {progress}"
    await updates.aclose()
    assert lab.running is None and engine.streams == 0 and engine.num_unfinished() == 0, "the test ended with the close"


async def first_token_at(service, request) -> float | None:
    async with contextlib.aclosing(service.reply(request)) as events:
        async for event in events:
            if isinstance(event, Writing) and event.reply.progress.first_token_at is not None:
                first = event.reply.progress.first_token_at
                async for _ in events:  # read to the end, as a reader does
                    pass
                return first
            if isinstance(event, Failed | Finished):
                return None
    return None


async def test_a_visitor_goes_before_test_requests_waiting_for_a_slot(two_slots, registry):
    """Two test requests fill both slots and a third waits; a visitor who comes after it is served first."""
    preset = two_slots.preset(None)
    engine = await registry.get(preset)

    def ask(priority: int, tokens: int) -> ReplyRequest:
        return ReplyRequest("Tell me a story about the sea.", preset=preset.name, sampling={"max_tokens": tokens},
                            priority=priority)

    # 256 tokens (~3.8 s on the stand-in) keep both slots taken while the next two are asked for and seen
    # waiting (96, ~1.4 s, left a loaded machine little room).
    running = [asyncio.ensure_future(first_token_at(two_slots, ask(SYNTHETIC_PRIORITY, 256))) for _ in range(2)]
    assert await eventually(lambda: engine.load.running == 2, within_s=20)
    waiting = asyncio.ensure_future(first_token_at(two_slots, ask(SYNTHETIC_PRIORITY, 8)))
    assert await eventually(lambda: engine.streams == 3 and engine.load.waiting == 1, within_s=10)
    visitor = asyncio.ensure_future(first_token_at(two_slots, ask(0, 8)))
    # Both waiting in the engine's scheduler (`streams` counts a request before vLLM has it) while the
    # two slots are still taken: then which goes first is the scheduler's choice, not who came in time.
    assert await eventually(lambda: engine.streams == 4 and engine.load.waiting == 2, within_s=10)
    times = await asyncio.gather(*running, waiting, visitor)
    assert all(times), times
    assert times[3] < times[2], "the visitor's first token should come before the waiting test request's"


async def test_the_test_holds_back_while_visitors_wait_and_says_they_were_there(two_slots, registry):
    preset = two_slots.preset(None)
    engine = await registry.get(preset)
    lab = CapacityLab(two_slots)
    run = await lab.begin(make_plan([preset.name], max_users=4, step_s=4, prompt_tokens=16, reply_tokens=24))
    busy = True

    async def visitor() -> None:  # keeps asking until the test ends
        while busy:
            await first_token_at(two_slots, ReplyRequest("Tell me a story.", preset=preset.name,
                                                         sampling={"max_tokens": 24}))

    visitors: list[asyncio.Future[None]] = []
    driving = asyncio.ensure_future(drive(run))
    assert await eventually(lambda: run.progress.step == 1, within_s=20)
    visitors = [asyncio.ensure_future(visitor()) for _ in range(2)]
    await asyncio.wait_for(driving, timeout=30)
    busy = False
    await asyncio.gather(*visitors)
    # Two slots: one simulated user at most (a quarter, at least one slot, stays free for visitors).
    assert [s.users for s in run.steps] == [1]
    assert any("tested up to 1 simulated user:" in note for note in run.notes), run.notes
    step = run.steps[0]
    assert step.visitors_max == 2 and step.paused_s > 0, step
    assert any("Visitors were using the engine during 1 of 1 steps" in note for note in run.report().notes)
    assert await eventually(lambda: engine.streams == 0, within_s=5)
