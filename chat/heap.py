"""The serving process's start-up heap, kept out of the garbage collector's way.

A UI process holds vLLM's front end (AsyncLLM and what it imports: torch, transformers), Gradio and
the page: about 775,000 objects that Python's cyclic garbage collector tracks once the first engine
is up (bench/frontend_rates.py, on the token source). A full collection (generation 2) walks every
one of them with the interpreter held: 0.4-0.8 s on a 2-core Xeon, during which nothing in the
process runs. Python starts one whenever the objects that survived younger collections reach a
quarter of the old generation, which a steady stream of new visitors (page loads, sessions, turns)
brings about every few seconds: every reply then waiting for its first text waits the whole pause,
and those replies' text arrives together (issue 48).

`freeze_when_ready` does what vLLM's own API server does after its start
(`vllm.utils.gc_utils.freeze_gc_heap`): once the first engine is ready (or failed: the imports are
made either way), one full collection, then `gc.freeze()`, which moves every object alive into the
permanent generation that later collections skip. Objects made later are collected as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Awaitable

log = logging.getLogger(__name__)

SETTLE_S = 2.0  # after the engine is ready: its last start-up work (stat loggers, the first page) is done by then


def freeze() -> int:
    """Collect once, then freeze whatever is alive; returns the number of objects frozen."""
    started = time.monotonic()
    gc.collect()
    gc.freeze()
    frozen = gc.get_freeze_count()
    log.debug("Froze the start-up heap (%d objects) in %.2f s: full garbage collections skip it from now on",
             frozen, time.monotonic() - started)
    return frozen


async def freeze_when_ready(ready: Awaitable[object], settle_s: float = SETTLE_S) -> None:
    """`freeze()` once `ready` (the first engine's start) has ended, however it ended, and `settle_s` later."""
    with contextlib.suppress(Exception):  # a failed start has made its imports too; it is reported where it failed
        await ready
    await asyncio.sleep(settle_s)
    freeze()
