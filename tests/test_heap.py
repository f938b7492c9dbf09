"""The start-up heap frozen once the first engine's start has ended (chat/heap.py). That it removes the
serving process's long pauses is measured by bench/frontend_rates.py (its "gc" and "stalls" figures)."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from chat import heap

pytestmark = pytest.mark.unit


@pytest.fixture
def thawed():
    """Each test starts and ends with nothing frozen (a frozen test process would keep its garbage)."""
    gc.unfreeze()
    yield
    gc.unfreeze()


class Node:
    def __init__(self) -> None:
        self.other: Node | None = None


def cycle() -> weakref.ref[Node]:
    a, b = Node(), Node()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_freeze_keeps_what_is_alive_out_of_collections_and_collects_what_comes_later(thawed) -> None:
    kept = [Node() for _ in range(100)]
    frozen = heap.freeze()
    assert frozen == gc.get_freeze_count() >= len(kept)
    assert all(gc.is_tracked(n) for n in kept)
    assert not any(n is k for n in gc.get_objects() for k in kept[:1])  # collections no longer walk them
    later = cycle()
    gc.collect()
    assert later() is None  # garbage made after the freeze is still collected


async def test_it_waits_for_the_engine_and_freezes_after_a_failed_start_too(thawed) -> None:
    started: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(heap.freeze_when_ready(started, settle_s=0.01))
    await asyncio.sleep(0.05)
    assert gc.get_freeze_count() == 0 and not waiting.done()
    started.set_exception(RuntimeError("the engine failed to start"))
    await asyncio.wait_for(waiting, 5)
    assert gc.get_freeze_count() > 0
