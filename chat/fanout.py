"""Writing one prompt's replies in several presets at once, for the Compare tab.

Each reply runs in its own task (driven by `chat.stream.paced`); the caller is woken whenever any
of them has news, coalesced to one redraw per `flush_s` across all of them, so one person's
comparison is batched by the engine like everyone else's replies.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import dataclass

from chat import metrics
from chat.compare import ComparedReply
from chat.errors import UNEXPECTED_ERROR, ChatError
from chat.history import Message
from chat.presets import Preset
from chat.service import ChatService
from chat.stream import Reply, paced

log = logging.getLogger(__name__)

STOPPED_EARLY = "Stopped by you before the reply started."


@dataclass
class Job:
    """One reply to write: the record entry it fills, its preset, and the conversation it answers."""

    entry: ComparedReply
    preset: Preset
    messages: list[Message]
    reply: Reply | None = None
    waiting: str = "Waiting for the engine…"


@dataclass
class Writing:
    """The replies one session is writing now, so that Stop reaches every column."""

    jobs: list[Job]
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True
        for job in self.jobs:
            if job.reply is not None:
                job.reply.stop()


async def write_all(service: ChatService, writing: Writing, flush_s: float) -> AsyncGenerator[None, None]:
    """Write every job's reply at once, each in its own task; yield whenever the view should redraw.

    Redraws are coalesced to one per `flush_s` across all columns. Closing this generator cancels
    the tasks, which aborts their engine requests.
    """
    loop = asyncio.get_running_loop()
    changed: asyncio.Queue[Job] = asyncio.Queue()
    submitted = time.monotonic()  # one moment for all columns: their first-token times compare

    async def write(job: Job) -> None:
        try:
            async for status in service.engine_progress(job.preset):
                job.waiting = status
                changed.put_nowait(job)
                if writing.stopped:
                    break
            if writing.stopped:
                job.entry.error = STOPPED_EARLY
                return
            engine = await service.engine(job.preset)
            job.reply = service.open_reply(engine, job.preset, job.messages, job.entry.sampling.as_dict(), submitted_at=submitted)
            if writing.stopped:
                job.reply.stop()
            async with contextlib.aclosing(paced(job.reply, flush_s=flush_s)) as redraws:
                async for _ in redraws:
                    changed.put_nowait(job)
        except ChatError as exc:
            if job.reply is None:  # refused before reaching the engine (the stream counts its own)
                metrics.rejected(job.preset.name, type(exc).__name__)
            job.entry.error = exc.message
        except Exception:
            log.exception("Unexpected error while writing a compared reply")
            job.entry.error = UNEXPECTED_ERROR
        finally:
            if job.reply is not None:
                job.entry.text, job.entry.stats, job.entry.notice = job.reply.text, job.reply.stats, job.reply.notice
            job.entry.finished = True
            changed.put_nowait(job)

    tasks = [loop.create_task(write(job)) for job in writing.jobs]
    last = 0.0
    try:
        while not all(job.entry.finished for job in writing.jobs):
            await changed.get()
            await asyncio.sleep(max(0.0, flush_s - (loop.time() - last)))
            while not changed.empty():
                changed.get_nowait()
            last = loop.time()
            yield
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
