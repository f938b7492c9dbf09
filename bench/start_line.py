"""One start for a burst split over client processes: each process gets ready (its imports, the
page's config, its tabs' cookies) and waits at the line, so that neither a process's start nor a
page load falls inside the measured burst; the raw engine's burst has neither."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing import get_context
from typing import Any

READY_TIMEOUT_S = 300.0  # a client process that is not ready by then breaks the run, not hangs it
START_S = 0.1  # at steady rates: from every client process being at the line to the first arrival


@contextmanager
def start_line(parties: int) -> Iterator[Any]:
    """A barrier the client processes of one burst can share (None for one process)."""
    if parties <= 1:
        yield None
        return
    with get_context("spawn").Manager() as manager:
        yield manager.Barrier(parties, timeout=READY_TIMEOUT_S)


async def wait_at(line: Any) -> None:
    if line is not None:
        await asyncio.to_thread(line.wait)
