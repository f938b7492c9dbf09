"""The engine owner's decisions with several UI workers, over its real line (chat/control.py): an engine is taken
away only when every worker says it is idle there, and every worker learns what became of it.
vLLM sleeps only on CUDA, so the engines here have a stand-in for AsyncLLM's sleep and wake-up (as
in tests/test_registry.py); tests/test_workers.py runs the real engines on the CPU."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses

import pytest

from chat.engine import Engine, EngineState
from chat.owner import EngineOwner
from chat.owner_link import OwnerLink
from chat.presets import PresetCatalog
from chat.registry import EngineRegistry
from tests.conftest import eventually
from tests.test_registry import SleepyLLM as SleepOnly

pytestmark = pytest.mark.unit


class SleepyLLM(SleepOnly):
    """AsyncLLM's sleep mode and its count of unfinished requests (what /healthz shows)."""

    class output_processor:  # noqa: N801 - AsyncLLM's attribute
        @staticmethod
        def get_num_unfinished_requests() -> int:
            return 0


class Worker:
    """One UI worker's side: its registry and its line to the owner."""

    def __init__(self, registry: EngineRegistry, link: OwnerLink) -> None:
        self.registry, self.link = registry, link


@pytest.fixture
async def owner_and_workers(monkeypatch, default_preset, tmp_path):
    monkeypatch.setattr("chat.engine.on_cpu", lambda: False)  # sleep mode is offered on CUDA only
    presets = [dataclasses.replace(default_preset, name=name,
                                   engine={**default_preset.engine, "enable_sleep_mode": True, "seed": ord(name)})
               for name in ("A", "B")]
    owner = EngineOwner(PresetCatalog({p.name: p for p in presets}, {}), tmp_path, workers=2, memory_budget=1.0)
    owner_engines = {}
    for preset, state in zip(presets, (EngineState.READY, EngineState.SLEEPING), strict=True):
        engine = Engine(preset=preset, state=state, memory_need=0.6, generation=1)
        engine.llm = SleepyLLM()  # type: ignore[assignment]
        owner.registry._engines[engine.key] = owner_engines[preset.name] = engine
    serving = asyncio.get_running_loop().create_task(owner.serve())
    workers = []
    for index in range(2):
        link = OwnerLink(tmp_path, index)
        registry = EngineRegistry(sharing=link)
        engine = Engine(preset=presets[0], state=EngineState.READY, generation=1)  # each worker joined A's core
        engine.llm = SleepyLLM()  # type: ignore[assignment]
        engine.last_used = 0.0
        registry._engines[engine.key] = engine
        await link.open(registry)
        workers.append(Worker(registry, link))
    assert await eventually(lambda: len(owner.peers) == 2, within_s=5)
    yield owner, owner_engines, workers
    for worker in workers:
        worker.link.close()
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)


async def test_an_engine_in_use_on_any_worker_is_not_put_to_sleep(owner_and_workers):
    owner, engines, (first, second) = owner_and_workers
    busy = second.registry.peek(engines["A"].preset)
    busy._streams["a reply"] = lambda reason: None
    owner.registry.prepare(engines["B"].preset)
    await engines["B"].task
    assert engines["A"].state is EngineState.READY and engines["A"].llm.calls == []
    assert engines["B"].state is EngineState.SLEEPING and engines["B"].refusal is not None
    # The workers asked to hold A's new requests were told to go on.
    assert await eventually(lambda: all(w.registry.peek(engines["A"].preset).held is None for w in (first, second)), 5)


async def test_an_engine_idle_on_every_worker_sleeps_and_every_worker_learns_it(owner_and_workers):
    owner, engines, workers = owner_and_workers
    owner.registry.prepare(engines["B"].preset)
    await engines["B"].task
    assert engines["A"].llm.calls == ["sleep"] and engines["B"].llm.calls == ["wake"]
    assert engines["B"].state is EngineState.READY
    for worker in workers:
        assert await eventually(lambda w=worker: w.registry.peek(engines["A"].preset).state is EngineState.SLEEPING, 5)
        assert worker.registry.peek(engines["A"].preset).held is None
    assert await eventually(
        lambda: {v.preset: v.state for v in workers[0].registry.overview()} == {"A": "sleeping", "B": "ready"}, 5)


async def test_one_capacity_test_at_a_time_across_workers(owner_and_workers):
    from chat.errors import InputError

    owner, _, (first, second) = owner_and_workers
    await first.link.take_capacity(["A"], 60, "alice")
    with pytest.raises(InputError, match="already running"):
        await second.link.take_capacity(["A"], 60, "bob")
    assert await eventually(lambda: (second.link.capacity_elsewhere() or {}).get("presets") == ["A"], 5)
    stopped = []
    first.link.on_capacity_stop.append(lambda: stopped.append(True))
    await second.link.stop_capacity_elsewhere()
    assert await eventually(lambda: stopped == [True], 5)
    first.link.give_back_capacity()
    assert await eventually(lambda: second.link.capacity_elsewhere() is None, 5)
    await second.link.take_capacity(["A"], 60, "bob")


async def test_a_visitors_share_and_failed_sign_ins_are_counted_for_the_whole_app(owner_and_workers):
    """Both workers' replies count against one share, and sign-ins against one limit (chat/tallies.py,
    kept by the owner); what a worker held is given back when it goes."""
    from chat.auth import FailedLogins

    owner, _, (first, second) = owner_and_workers
    assert [await first.link.hold("replies:v", 3), await second.link.hold("replies:v", 3),
            await first.link.hold("replies:v", 3)] == [0, 1, 2]
    assert await second.link.hold("replies:v", 3) is None  # the share is the app's, not one worker's
    second.link.release("replies:v")
    assert await eventually(lambda: owner.tallies.held("replies:v") == 2, 5)
    logins = [FailedLogins(w.link, users=frozenset({"demo"}), per_address=4) for w in (first, second)]
    for n in range(4):
        assert await logins[0].refusal("203.0.113.9") is None
        await logins[n % 2].failed("203.0.113.9", "demo")
    assert await logins[0].refusal("203.0.113.9") is not None and await logins[1].refusal("203.0.113.9") is not None
    owner.forget(0)  # the first worker's process ended: its two are given back
    assert owner.tallies.held("replies:v") == 0


async def test_replies_at_once_are_limited_for_the_whole_app_and_wait_in_one_line(owner_and_workers):
    """--concurrency-limit with UI workers: one set of slots and one line, kept by the owner, first come
    first served whichever worker asked; a full line refuses, a reply that gives up leaves the line,
    and a worker that goes gives its slots to those in line."""
    owner, _, (first, second) = owner_and_workers
    key, told = "replies-at-once", []
    taken = await first.link.enter(key, 1, 2, lambda: told.append("first"))
    assert taken is not None and not told
    waiting = []
    for worker in (second, first):  # one after the other: each worker's messages come on a socket of its own
        waiting.append(asyncio.get_running_loop().create_task(
            worker.link.enter(key, 1, 2, lambda w=worker: told.append(w.link.worker))))
        assert await eventually(lambda: len(told) == len(waiting), 5), "it was told it waits in line"
    assert await second.link.enter(key, 1, 2, lambda: None) is None, "the line is full"
    first.link.leave(key, taken)
    assert await asyncio.wait_for(waiting[0], 5) is not None  # the second worker's, first in line
    assert not waiting[1].done()
    waiting[1].cancel()  # the first worker's reply gives up its place
    with contextlib.suppress(asyncio.CancelledError):
        await waiting[1]
    assert await eventually(lambda: not owner.tallies._lines, 5)
    third = asyncio.get_running_loop().create_task(first.link.enter(key, 1, 2, lambda: None))
    await asyncio.sleep(0.2)
    assert not third.done()
    owner.forget(second.link.worker)  # the worker holding the slot went: it goes to the one in line
    assert await asyncio.wait_for(third, 5) is not None
    assert owner.tallies.held(key) == 1


class GatedSleep(SleepyLLM):
    """Sleep that takes as long as the test says."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()

    async def sleep(self, level: int = 1) -> None:
        await self.gate.wait()
        await super().sleep(level)


class Core:
    """A shared core's slots, as the owner hands them out."""

    sentinels: list[int] = []

    def slot(self, index: int) -> object:
        from chat.engine_core import EngineSlot

        return EngineSlot(f"ipc://in-{index}", f"ipc://out-{index}", 7, index)


async def test_a_worker_asking_for_an_engine_being_put_to_sleep_gets_it_woken_not_a_sleeping_one(owner_and_workers):
    owner, engines, (first, _) = owner_and_workers
    a, b = engines["A"], engines["B"]
    a.llm = GatedSleep()  # type: ignore[assignment]
    a.core = b.core = Core()  # type: ignore[assignment]
    owner._free = {a.key: [3, 4], b.key: [3, 4]}
    owner.registry.prepare(b.preset)  # B wakes; A, idle everywhere, is being put to sleep to make room
    assert await eventually(lambda: a.key in owner._taking, 5)
    newcomer = Engine(preset=a.preset)  # a worker's client, not joined yet
    asking = asyncio.get_running_loop().create_task(first.link._acquire(newcomer, None))
    await asyncio.sleep(0.2)
    assert not asking.done(), "it waits while A is taken"
    a.llm.gate.set()
    granted = await asyncio.wait_for(asking, 10)
    assert a.llm.calls == ["sleep", "wake"] and a.state is EngineState.READY  # woken again for the newcomer
    assert b.state is EngineState.SLEEPING
    assert granted.slot is not None and granted.slot.index == 3


async def test_a_worker_counts_as_started_once_its_first_engine_has_joined_and_warmed_up(owner_and_workers):
    """What the supervisor waits for before a worker is "serving" (and /healthz says ok at start):
    a worker still joining its core shares its processor with that work."""
    owner, engines, (first, _) = owner_and_workers
    settled: list[int] = []
    owner.on_settled = settled.append
    joining = first.registry.peek(engines["A"].preset)
    joining.state = EngineState.STARTING
    first.link.changed(joining)
    assert await eventually(lambda: any(p.worker == 0 and p.report for p in owner.peers.values()), 5)
    assert settled == []
    joining.state = EngineState.READY
    first.link.changed(joining)
    assert await eventually(lambda: settled == [0], 5)  # the other worker has said nothing yet


class ClosingLLM(SleepyLLM):
    """And its shutdown, which an unload ends with."""

    def shutdown(self, timeout: float | None = None) -> None:
        self.calls.append("shutdown")


async def test_the_apps_stop_closes_every_engine_without_asking_the_workers_it_stopped(owner_and_workers):
    """The supervisor stops the UI workers first; one gone without the owner seeing it yet was still
    asked to let go of each engine, and a loaded machine's stop waited 30 s for its answer
    (tests/test_stop.py's two workers, twice). Here no worker answers at all."""
    owner, engines, workers = owner_and_workers
    for engine in engines.values():
        engine.llm = ClosingLLM()  # type: ignore[assignment]

    async def silent(news: object) -> None:
        await asyncio.Event().wait()

    for worker in workers:
        worker.link._obey = silent  # type: ignore[method-assign]
    await asyncio.wait_for(owner.close(), timeout=5)
    assert [e.state for e in engines.values()] == [EngineState.CLOSED, EngineState.CLOSED]
    assert not owner.peers
