"""Comparisons as a service, beside `ChatService`: what the Compare tab and the /compare API do with
a comparison, in one place and without Gradio.

    compare = CompareService(service)
    async for event in compare.send(comparison, picked, blind, prompt, settings, session):
        ...   # Begun(comparison, jobs), Wrote(job, writing)* and Redraw()* as the columns are written, Ended()
    compare.stop(session)                                # every column of that session

One turn at a time per session (`Busy`, raised before anything is yielded). A prompt and its
settings are checked here, once (`send` raises ChatError with the sentence and adds nothing); then
every column's reply goes through the one reply pipeline (`ChatService.reply`) in its own task, so
one person's comparison is batched by the engine like everyone else's replies. Each column's new
text is handed on as it comes (`Wrote`: a page's live text), and the redraws of all columns are
coalesced into one (`Redraw`), so a comparison costs the server one redraw stream, not one per
column. Closing the iterator cancels the replies, which aborts their engine requests. The record
is `chat.compare`, votes go through `chat.ballot`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from chat.compare import ComparedReply, Comparison
from chat.errors import InputError, Stopped
from chat.history import check_text
from chat.presets import Preset
from chat.sampling import Sampling
from chat.service import ChatService, Failed, Finished, ReplyEvent, ReplyRequest, Writing
from chat.share_link import encode_link

RERUN_FIRST = "Send a prompt first; then each column can rerun it."


class Busy(InputError):
    """This session's comparison is still writing a turn; `again`: the prompt asked for is that turn's
    (a Send clicked twice), which a page need not answer."""

    def __init__(self, again: bool = False) -> None:
        super().__init__("Wait until every column has finished, or stop them.")
        self.again = again


@dataclass(eq=False)
class _Hold:
    """A session's turn being written (`prompt`: a new turn's; None for a rerun)."""

    prompt: str | None


@dataclass
class Job:
    """One reply to write: the record entry it fills, and the request that writes it."""

    entry: ComparedReply
    request: ReplyRequest
    event: ReplyEvent | None = None  # the latest news from the pipeline

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


@dataclass(frozen=True)
class Begun:
    """The turn (or rerun) is in the record: the comparison as it stands, one job per reply to write,
    and the share link of the setup it was sent with (when `send` was asked for it)."""

    comparison: Comparison
    jobs: list[Job]
    link: str = ""


@dataclass(frozen=True)
class Wrote:
    """New text in one column, as the pipeline yielded it."""

    job: Job
    writing: Writing


@dataclass(frozen=True)
class Redraw:
    """Time to redraw the columns: each job's `event` as it stands now (a Writing's line as of now)."""


@dataclass(frozen=True)
class Ended:
    """Every column has ended: the record holds each reply (`Job.record`)."""


CompareEvent = Begun | Wrote | Redraw | Ended


class CompareService:
    def __init__(self, service: ChatService) -> None:
        self.service = service
        self.writing: dict[str, _Hold] = {}  # sessions whose turn is being written

    async def send(self, comparison: Comparison | None, picked: Sequence[str], blind: bool, prompt: str,
                   settings: Sequence[Mapping[str, Any]], session: str, every_s: float = 0.0,
                   link: bool = False, visitor: str = "") -> AsyncGenerator[CompareEvent, None]:
        """Add the prompt as a turn of `comparison` (or of a new one with the picked presets) and write
        every column's reply at once, redrawing at most once per `every_s` (or per the service's
        pacing interval if longer). With `link`, `Begun` carries the share link of the picked presets
        and settings (with the comparison's first prompt). Raises Busy, or ChatError with a sentence
        for the person (nothing is added then). Each column's reply counts in `visitor`'s share."""
        with self._turn_of(session, prompt) as over:
            query = self.link(picked, comparison.blind if comparison else blind,
                              comparison.turns[0].prompt if comparison and comparison.turns else prompt,
                              settings) if link else ""
            comparison, jobs = self._begin(comparison, picked, blind, prompt, settings, session, visitor)
            yield Begun(comparison, jobs, query)
            async with contextlib.aclosing(self._written(jobs, every_s, over)) as events:  # closing `send` ends the columns
                async for event in events:
                    yield event

    async def rerun(self, comparison: Comparison | None, turn: int | None, column: int, session: str,
                    every_s: float = 0.0, visitor: str = "") -> AsyncGenerator[CompareEvent, None]:
        """That turn's prompt (the latest when None) again in one column, with its preset and exact
        settings: events as `send`'s."""
        if comparison is None:
            raise InputError(RERUN_FIRST)
        with self._turn_of(session) as over:
            if not comparison.turns or not 0 <= column < len(comparison.columns):
                raise InputError(RERUN_FIRST)
            index = len(comparison.turns) - 1 if turn is None else int(turn)
            entry = comparison.add_rerun(index, column)
            jobs = [self._job(comparison, entry, index, session, time.monotonic(), visitor)]
            yield Begun(comparison, jobs)
            async with contextlib.aclosing(self._written(jobs, every_s, over)) as events:  # closing `rerun` ends the columns
                async for event in events:
                    yield event

    def link(self, picked: Sequence[str], blind: bool, prompt: str, settings: Sequence[Mapping[str, Any]]) -> str:
        """The share link's query of this setup: the picked presets, each with its slot's settings."""
        presets = [self._preset(name) for name in picked]
        return encode_link(presets, [sampling_of(preset, picked, settings) for preset in presets], prompt, blind)

    def stop(self, session: str) -> None:
        """Stop every column of this session's comparison (not its Chat tab's reply)."""
        self.service.stop(stop_key(session))

    def _preset(self, name: str) -> Preset:
        """A preset by name, as the reply pipeline looks it up (`ChatService.preset`), without entering it."""
        return self.service.catalog.runnable(name, self.service.default_preset, self.service.has_gpu)

    @contextlib.contextmanager
    def _turn_of(self, session: str, prompt: str | None = None) -> Iterator[Callable[[], None]]:
        """Hold the session's one turn at a time (taken at once, before any await: a second Send
        during the first is refused with `Busy`); what it gives ends the hold early, once only for
        this turn (never the next one's)."""
        if (held := self.writing.get(session)) is not None:
            raise Busy(again=held.prompt is not None and (prompt or "").strip() == held.prompt.strip())
        self.writing[session] = turn = _Hold(prompt)

        def over() -> None:
            if self.writing.get(session) is turn:
                del self.writing[session]

        try:
            yield over
        finally:
            over()

    async def _written(self, jobs: Sequence[Job], every_s: float,
                       over: Callable[[], None]) -> AsyncGenerator[CompareEvent, None]:
        """`_write`'s events; the turn is over for the next Send as soon as its last column has ended,
        before the page has drawn the end (a Send pressed then is not refused)."""
        async with contextlib.aclosing(self._write(jobs, every_s)) as events:
            async for event in events:
                if isinstance(event, Ended):
                    over()
                yield event

    def _begin(self, comparison: Comparison | None, picked: Sequence[str], blind: bool, prompt: str,
               settings: Sequence[Mapping[str, Any]], session: str, visitor: str) -> tuple[Comparison, list[Job]]:
        """The turn added: one job per column, with that column's preset and settings (`settings[i]`
        for `picked[i]`; blind, `settings[0]` for every column, or they could be told apart)."""
        text = check_text(prompt, "Your message", new_message=True)
        comparison = comparison or Comparison.start([self._preset(name) for name in picked], blind)
        presets = [self._preset(column.preset) for column in comparison.columns]
        if comparison.hides_stats:
            base = self._preset(picked[0]) if picked else presets[0]
            shared = base.sampling.resolve(settings[0] if settings else {}).as_dict()
            sampling = [preset.sampling.resolve(shared) for preset in presets]
        else:
            sampling = [sampling_of(preset, picked, settings) for preset in presets]
        turn = comparison.add_turn(text, sampling)
        now = time.monotonic()  # one moment for all columns: their first-token times compare
        return comparison, [self._job(comparison, entry, len(comparison.turns) - 1, session, now, visitor)
                            for entry in turn.replies]

    def _job(self, comparison: Comparison, entry: ComparedReply, turn: int, session: str, submitted_at: float,
             visitor: str) -> Job:
        """The request that writes one column's reply to a turn, with that column's preset and settings."""
        column = comparison.columns[entry.column]
        return Job(entry, ReplyRequest(
            comparison.turns[turn].prompt, comparison.history(entry.column, turn), preset=column.preset,
            system_prompt=column.system_prompt, sampling=entry.sampling, stop_key=stop_key(session),
            submitted_at=submitted_at, visitor=visitor,
        ))

    async def _write(self, jobs: Sequence[Job], every_s: float) -> AsyncGenerator[Wrote | Redraw | Ended, None]:
        """Write every job's reply at once: each column's new text as it comes, and a redraw when a
        column's first text arrives or the last column ends, otherwise at most once per interval."""
        loop = asyncio.get_running_loop()
        news = asyncio.Event()
        wrote: deque[Wrote] = deque()  # new text not yet handed on
        changed = urgent = False  # something to redraw; something to redraw at once
        due: float | None = None  # when the news since the last redraw is drawn (None: no news yet)

        async def write(job: Job) -> None:
            nonlocal changed, urgent
            try:
                async with contextlib.aclosing(self.service.reply(job.request)) as events:
                    async for event in events:
                        if isinstance(event, Writing):
                            # drawn at once: the page starts following the live text then
                            urgent = urgent or not isinstance(job.event, Writing)
                            wrote.append(Wrote(job, event))
                        job.event, changed = event, True
                        news.set()
            finally:
                job.record()
                # A column that ends while news is held back is drawn at once, with that news.
                changed, urgent = True, urgent or due is not None
                news.set()

        tasks = [loop.create_task(write(job)) for job in jobs]
        last = 0.0
        try:
            while True:
                while wrote:
                    yield wrote.popleft()
                finished = all(job.entry.finished for job in jobs)
                if changed:  # the columns' news coalesced into one redraw
                    due = last + max(every_s, self.service.pacer.interval()) if due is None else due
                    if urgent or finished or loop.time() >= due:
                        changed = urgent = False
                        due, last = None, loop.time()
                        now = time.monotonic()
                        for job in jobs:  # each column's line as it stands at this redraw, not at its latest news
                            if isinstance(job.event, Writing):
                                job.event = Writing(job.event.reply, job.event.reply.progress.line(now))
                        yield Redraw()
                        continue
                if finished:
                    yield Ended()
                    return
                news.clear()
                with contextlib.suppress(TimeoutError):  # not wait_for, which loses a cancel (chat/stream.py `paced`)
                    async with asyncio.timeout_at(due):
                        await news.wait()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def sampling_of(preset: Preset, picked: Sequence[str], settings: Sequence[Mapping[str, Any]]) -> Sampling:
    """A picked preset's settings (those of its slot), checked against its ranges."""
    if preset.name not in picked:
        raise InputError(f"{preset.name} is not among the picked presets; press New comparison to change them.")
    slot = list(picked).index(preset.name)
    return preset.sampling.resolve(settings[slot] if slot < len(settings) else {})


def stop_key(session: str) -> str:
    return f"compare:{session}"
