"""Writing one prompt's replies in several presets at once, for the Compare tab.

Each column's reply goes through the one reply pipeline (`ChatService.reply`) in its own task; the
caller is woken whenever any column has news, coalesced to one redraw per interval across all of
them, so one person's comparison is batched by the engine like everyone else's replies and costs
the server one redraw stream, not one per column.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Sequence
from dataclasses import dataclass

from chat.compare import ComparedReply
from chat.errors import Stopped
from chat.service import ChatService, Failed, Finished, ReplyEvent, ReplyRequest, Writing


@dataclass
class Job:
    """One reply to write: the record entry it fills, and the request that writes it."""

    entry: ComparedReply
    request: ReplyRequest
    event: ReplyEvent | None = None  # the latest news from the pipeline
    on_writing: Callable[[Writing], None] | None = None  # told of every new piece of the reply (a page's live text)

    def record(self) -> None:
        """Copy the finished reply into the comparison's record."""
        event = self.event
        reply = event.reply if isinstance(event, Finished | Failed) else None
        if reply is not None:
            self.entry.text, self.entry.stats, self.entry.notice = reply.text, reply.stats, reply.notice
        if isinstance(event, Failed):
            self.entry.error = event.error.message
            self.entry.stopped_early = isinstance(event.error, Stopped)
        self.entry.finished = True


async def write_all(service: ChatService, jobs: Sequence[Job], every_s: float = 0.0) -> AsyncGenerator[None, None]:
    """Write every job's reply at once; yield whenever the view should be redrawn (at most once per
    `every_s`, or per the service's pacing interval if longer).

    Closing this generator cancels the replies, which aborts their engine requests.
    """
    loop = asyncio.get_running_loop()
    changed, first_text = asyncio.Event(), asyncio.Event()

    async def write(job: Job) -> None:
        try:
            async with contextlib.aclosing(service.reply(job.request)) as events:
                async for event in events:
                    if isinstance(event, Writing) and not isinstance(job.event, Writing):
                        first_text.set()  # drawn at once: the page starts following the live text then
                    job.event = event
                    if job.on_writing is not None and isinstance(event, Writing):
                        job.on_writing(event)
                    changed.set()
        finally:
            job.record()
            changed.set()

    tasks = [loop.create_task(write(job)) for job in jobs]
    last = 0.0
    try:
        while not all(job.entry.finished for job in jobs):
            await changed.wait()
            # Coalesce the columns' news into one redraw, unless a column ends or starts writing meanwhile.
            pending = [task for task in tasks if not task.done()]
            if pending and not first_text.is_set():
                woken = loop.create_task(first_text.wait())
                timeout = max(0.0, last + max(every_s, service.pacer.interval()) - loop.time())
                await asyncio.wait([*pending, woken], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                woken.cancel()
            changed.clear()
            first_text.clear()
            last = loop.time()
            now = time.monotonic()
            for job in jobs:  # each column's line as it stands at this redraw, not at its latest news
                if isinstance(job.event, Writing):
                    job.event = Writing(job.event.reply, job.event.reply.progress.line(now))
            yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
