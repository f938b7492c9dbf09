"""What a full garbage collection walks in the serving process: the start-up heap frozen once the first
engine's start has ended (chat/heap.py), and nothing left behind by visitors who have gone (issue 48).
That it removes the serving process's long pauses is measured by bench/frontend_rates.py (its "gc"
and "stalls" figures)."""

from __future__ import annotations

import asyncio
import gc
import os
import re
import signal
import time
import weakref

import pytest

from chat import heap
from tests.conftest import RESUME_GRACE_S, RunningApp


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


# Each visitor who has come and gone left ~200 objects of Gradio's session state (kept for 10,000
# sessions) and ~80 of a finished reply's socket (kept 120 s) that every full collection walked, ~290
# a visit in all (bench/frontend_timeline.py's census); what stays now is bounded: a finished reply's
# events (256 replies at most), Gradio's per-session message queues (2,000 sessions) and the like.
VISITS = 30
OBJECTS_PER_VISIT = 100  # a generous bound on what stays, well under what stayed
HEAP_LINE = re.compile(r"^stand-in heap: (\d+) objects$", re.M)


def heap_objects(app: RunningApp, within_s: float = 30.0) -> int:
    """The objects the app's collector tracks, frozen or not (tests/stand_in.py counts them on SIGUSR1)."""
    start = app.log_path.stat().st_size
    os.kill(app.process.pid, signal.SIGUSR1)
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with open(app.log_path, errors="replace") as log:
            log.seek(start)
            if found := HEAP_LINE.search(log.read()):
                return int(found.group(1))
        time.sleep(0.1)
    raise AssertionError(f"the stand-in app did not count its objects within {within_s} s:\n{app.log_tail()}")


def visit(app: RunningApp, count: int) -> None:
    """`count` new visitors, as bench/frontend_rates.py's: each loads the page, mounts it (heartbeat,
    load events, the page's socket), sends a message as the page does, reads the reply and leaves."""
    from bench.frontend_client import Request, take_turns

    requests = [Request(f"Visitor {i}: answer in a single word.", 8, [], {"knob-max_tokens": 8}) for i in range(count)]
    turns = take_turns(app.url, "visitor", requests, concurrency=count, rate=10.0)
    assert not [t.error for t in turns if t.error]


def test_visitors_who_have_gone_leave_next_to_nothing_behind(app_server):
    visit(app_server, 5)  # every path once: what is built on first use is there before the count
    before = heap_objects(app_server)
    visit(app_server, VISITS)
    deadline = time.monotonic() + RESUME_GRACE_S + 30  # a page gone this long loses its Gradio session
    while (grown := heap_objects(app_server) - before) > VISITS * OBJECTS_PER_VISIT and time.monotonic() < deadline:
        time.sleep(1.0)
    assert grown <= VISITS * OBJECTS_PER_VISIT, (
        f"{VISITS} visitors who have gone left {grown} objects behind ({grown / VISITS:.0f} each) that every full "
        f"garbage collection walks; bench/frontend_timeline.py's census (SIGUSR1) finds what holds them")
