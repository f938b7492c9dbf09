"""Running a capacity test: simulated users sending replies through the app's own reply pipeline.

    lab = CapacityLab(service)                  # one per app: one test at a time
    run = lab.begin(plan, by="alice")           # InputError while another test runs
    async for progress in run.run():            # a snapshot about twice a second
        progress.line()
    run.report()                                # chat.capacity.Report: exports and verdicts
    run.stop()                                  # aborts every request of the test at once (one stop key)

The synthetic users are ordinary `ReplyRequest`s, so they are timed exactly like a visitor's reply.
Real visitors go first, three ways: every test request carries a lower vLLM priority (which the
engine honours where the preset sets `scheduling_policy: priority`); a quarter of the engine's slots
(`max_num_seqs`) are never used by the test; and while a visitor's request waits for a slot, the
test sends nothing new. The test is bounded: at most MAX_RUN_S in all and MAX_REQUESTS requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from chat.capacity import MAX_REQUESTS, MAX_RUN_S, Plan, Report, StepResult, StepTally, machine
from chat.engine import Engine
from chat.errors import ChatError, InputError, Stopped
from chat.presets import Preset
from chat.service import ChatService, Failed, Finished, ReplyRequest, Writing

ALREADY_RUNNING = "A capacity test is already running; wait for it to end, or press Stop."

log = logging.getLogger(__name__)

SYNTHETIC_PRIORITY = 100  # vLLM serves lower numbers first; visitors' requests have 0 to 99 (chat/service.py)
RESERVED_SHARE = 4  # 1/4 of an engine's slots stay free for visitors
TICK_S = 0.1  # how often a step looks at the engine's queue
FAILURE_PAUSE_S = 0.5
STORY = ("the old ship left the quiet port at dawn and sailed north past the last light on the cliffs while the crew "
         "sang and the wind turned cold over the grey water")


def prompt_text(tokens: int, user: int, number: int) -> str:
    """About `tokens` tokens of prompt (these words are one token each for common tokenizers). The
    request's own number comes first, so the prefix cache cannot serve the rest of it."""
    words = STORY.split()
    body = " ".join(words[i % len(words)] for i in range(max(tokens - 12, 1)))
    return f"Request {user}.{number}. Continue this story at length, in plain prose: {body}"


def room_for(max_num_seqs: int) -> int:
    """The most simulated users an engine with this many slots takes (the rest are the visitors')."""
    return max(1, max_num_seqs - max(1, max_num_seqs // RESERVED_SHARE))


@dataclass(frozen=True)
class Progress:
    """Where a test is, in words and numbers."""

    step: int = 0  # 1-based; 0 before the first starts
    steps: int = 0
    preset: str = ""
    users: int = 0
    seconds_left: float = 0.0
    replies: int = 0  # requests sent so far in this test
    status: str = "Starting the capacity test…"
    paused: bool = False

    def line(self) -> str:
        if not self.step:
            return self.status
        users = f"{self.users} simulated user{'s' if self.users != 1 else ''}"
        line = (f"Step {self.step} of {self.steps}: {self.preset} with {users} · {self.seconds_left:.0f} s left · "
                f"{self.replies:,} test request{'s' if self.replies != 1 else ''} so far.")
        if self.paused:
            line += " Paused: visitors are waiting for the engine, so no new test requests are sent."
        return line


class CapacityRun:
    """One test: its plan, its progress and the steps measured so far."""

    def __init__(self, service: ChatService, plan: Plan, by: str = "") -> None:
        self.service, self.plan, self.by = service, plan, by
        self.key = f"capacity:{uuid.uuid4().hex}"  # one stop key for every request of the test
        self.steps: list[StepResult] = []
        self.notes: list[str] = []
        self.progress = Progress(steps=len(plan.users()) * len(plan.presets))
        self.started_at = datetime.now(UTC).isoformat(timespec="seconds")
        self.ended: str | None = None  # how it ended, in words
        self.done = False
        self.requests = 0
        self._began = time.monotonic()
        self._deadline = self._began + MAX_RUN_S
        self._own: dict[str, int] = {}  # engine key -> this test's requests on their way
        self._clear = asyncio.Event()  # set while no visitor waits for a slot
        self._clear.set()
        self._presets: dict[str, Preset] = {}
        self._warm: set[str] = set()
        self.on_done: Callable[[], None] | None = None  # give back the app-wide right to run a test

    def stop(self, why: str = "stopped by you") -> None:
        """End the test now: every request of it is aborted at once."""
        if self.ended is None:
            self.ended = why
        self.service.stop(self.key)
        self._clear.set()  # wake users held back for visitors, so they see the stop

    @property
    def stopped(self) -> bool:
        return self.ended is not None

    async def run(self) -> AsyncGenerator[Progress, None]:
        """Drive the test, yielding progress; closing this iterator stops the test."""
        task = asyncio.get_running_loop().create_task(self._drive(), name=f"capacity test {self.key}")
        try:
            while not task.done():
                yield self.progress
                await asyncio.wait({task}, timeout=0.5)
            task.result()
            yield self.progress
        finally:
            if not task.done():
                self.stop("stopped: the page running it was closed")
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
            self.done = True
            if self.on_done is not None:
                self.on_done()

    async def _drive(self) -> None:
        plan = self.plan
        try:
            presets = [self.service.preset(name) for name in plan.presets]
            for preset in presets:
                preset.sampling.resolve({"max_tokens": plan.reply_tokens})  # SettingsError names the range
                self._presets[preset.name] = preset
            order = [(users, preset) for users in plan.users() for preset in presets]
            capped: set[str] = set()
            for index, (users, preset) in enumerate(order, 1):
                if self.stopped:
                    break
                engine = await self._engine(preset)
                if users > room_for(engine.max_num_seqs):
                    if preset.name not in capped:
                        capped.add(preset.name)
                        most = room_for(engine.max_num_seqs)
                        self.notes.append(
                            f"{preset.name} was tested up to {most} simulated user{'s' if most != 1 else ''}: its "
                            f"engine has {engine.max_num_seqs} slots and a quarter of them stay free for visitors.")
                    continue
                step = await self._step(index, len(order), preset, engine, users)
                if step is not None:
                    self.steps.append(step)
        except ChatError as exc:
            self.stop(f"stopped: {exc.message}")
        if self.ended is None:
            self.ended = "finished"
        self.progress = replace(self.progress, status=f"The capacity test {self.ended}.", seconds_left=0, paused=False)

    async def _engine(self, preset: Preset) -> Engine:
        """The preset's engine, ready and warm: the first request after a start is slow (buffers
        are allocated), and would count against the first step."""
        engine: Engine | None = None
        async for step in self.service.registry.ready(preset):  # status lines, then the ready engine
            if isinstance(step, Engine):
                engine = step
            else:
                self.progress = replace(self.progress, status=step, step=0)
        assert engine is not None
        if preset.name not in self._warm:
            self._warm.add(preset.name)
            self.progress = replace(self.progress, status=f"Warming up {preset.name}…", step=0)
            request = ReplyRequest(prompt_text(self.plan.prompt_tokens, 0, 0), preset=preset.name,
                                   sampling={"max_tokens": 2}, stop_key=self.key, priority=SYNTHETIC_PRIORITY)
            async with contextlib.aclosing(self.service.reply(request)) as events:
                async for _ in events:
                    pass
        return engine

    async def _step(self, index: int, total: int, preset: Preset, engine: Engine, users: int) -> StepResult | None:
        """Keep `users` simulated users busy for one step; None when the test was stopped during it."""
        start = time.monotonic()
        ends = min(start + self.plan.step_s, self._deadline)
        tally = StepTally(preset.name, users, started=start, ends=ends)
        self._own.setdefault(engine.key, 0)
        tasks = [asyncio.get_running_loop().create_task(self._user(preset, engine, tally, user))
                 for user in range(1, users + 1)]
        try:
            while (now := time.monotonic()) < ends and not self.stopped and not all(t.done() for t in tasks):
                view = self.service.registry.view(preset)  # the whole app's, with several UI workers
                streams, waiting = (view.streams, view.waiting) if view else (engine.streams, engine.load.waiting)
                visitors = max(streams - self._own[engine.key], 0)
                tally.visitors_max = max(tally.visitors_max, visitors)
                held = waiting > 0 and visitors > 0
                if held:
                    tally.paused_s += TICK_S
                    self._clear.clear()
                else:
                    self._clear.set()
                self.progress = Progress(index, total, preset.name, users, ends - now, self.requests, paused=held)
                await asyncio.wait(tasks, timeout=TICK_S)
        finally:
            self._clear.set()
            for task in tasks:
                task.cancel()  # a reply being written is aborted (closing the pipeline's iterator aborts it)
            for outcome in await asyncio.gather(*tasks, return_exceptions=True):
                if isinstance(outcome, Exception):
                    log.error("A simulated user failed", exc_info=outcome)
        if time.monotonic() >= self._deadline and not self.stopped:
            self.stop(f"stopped at the {MAX_RUN_S / 60:.0f}-minute limit")
        if self.stopped and time.monotonic() < ends:
            self.notes.append("The step under way when the test stopped is left out.")
            return None
        return tally.result(time.monotonic())

    async def _user(self, preset: Preset, engine: Engine, tally: StepTally, user: int) -> None:
        """One simulated user: prompt, read the whole reply, prompt again, until the step ends."""
        number = 0
        while not self.stopped and time.monotonic() < tally.ends:
            with contextlib.suppress(TimeoutError):  # not wait_for, which may lose a Stop (chat/stream.py `paced`)
                async with asyncio.timeout(max(tally.ends - time.monotonic(), 0)):
                    await self._clear.wait()
            if self.stopped or time.monotonic() >= tally.ends:
                return
            if self.requests >= MAX_REQUESTS:
                self.stop(f"stopped at the limit of {MAX_REQUESTS:,} test requests")
                return
            number += 1
            self.requests += 1
            request = ReplyRequest(prompt_text(self.plan.prompt_tokens, user, number), preset=preset.name,
                                   sampling={"max_tokens": self.plan.reply_tokens}, stop_key=self.key,
                                   priority=SYNTHETIC_PRIORITY)
            record = tally.sent(time.monotonic())
            self._own[engine.key] += 1
            failed = False
            try:
                async with contextlib.aclosing(self.service.reply(request)) as events:
                    async for event in events:
                        now = time.monotonic()
                        if isinstance(event, Writing):
                            progress = event.reply.progress
                            tally.wrote(record, progress.tokens, progress.first_token_at, now)
                        elif isinstance(event, Finished):
                            reply, stats = event.reply, event.reply.stats
                            tally.finished(record, reply.progress.tokens, reply.progress.first_token_at, now,
                                           stats.tokens_per_s if stats else None, stats.prompt_tokens if stats else 0)
                        elif isinstance(event, Failed) and not isinstance(event.error, Stopped):
                            tally.failed_with(record, event.error.message)
                            failed = True
            finally:
                self._own[engine.key] -= 1
            if failed:
                await asyncio.sleep(FAILURE_PAUSE_S)  # a refusal comes at once: do not turn it into a busy loop

    def report(self) -> Report:
        presets = {}
        for name in self.plan.presets:
            preset = self._presets.get(name)
            if preset is None:
                continue
            presets[name] = {
                "model": preset.model, "engine": dict(preset.engine),
                "sampling": preset.sampling.resolve({"max_tokens": self.plan.reply_tokens}).as_dict(),
                "scheduling": "visitors first (vLLM priority scheduling)"
                if preset.engine.get("scheduling_policy") == "priority"
                else "first come, first served; test requests held back while visitors wait",
            }
        notes = list(self.notes)
        busy = [s for s in self.steps if s.visitors_max]
        if busy:
            notes.append(f"Visitors were using the engine during {len(busy)} of {len(self.steps)} steps; "
                         "those steps' numbers include their load.")
        return Report(self.plan, presets, machine(), tuple(self.steps), self.started_at,
                      self.ended or "still running", tuple(notes))


class CapacityLease(Protocol):
    """One capacity test at a time for the whole app, when several UI workers serve it: the engine
    owner lends the right to run one (chat/owner_link.py)."""

    on_capacity_stop: list[Callable[[], None]]

    async def take_capacity(self, presets: list[str], nominal_s: float, by: str) -> None: ...

    def give_back_capacity(self) -> None: ...

    def capacity_elsewhere(self) -> dict[str, Any] | None: ...

    async def stop_capacity_elsewhere(self) -> None: ...


class CapacityLab:
    """The app's capacity tests: one at a time, and what the page tells every visitor about it."""

    def __init__(self, service: ChatService, lease: CapacityLease | None = None) -> None:
        self.service = service
        self.lease = lease
        self.current: CapacityRun | None = None
        if lease is not None:
            lease.on_capacity_stop.append(self._stop_asked)

    @property
    def running(self) -> CapacityRun | None:
        run = self.current
        return run if run is not None and not run.done else None

    async def begin(self, plan: Plan, by: str = "") -> CapacityRun:
        if self.running is not None:
            raise InputError(ALREADY_RUNNING)
        if self.lease is not None:
            await self.lease.take_capacity(list(plan.presets), plan.nominal_s, by)
        await asyncio.to_thread(machine)  # its GPUs are asked of nvidia-smi once per process: not on the event loop
        run = self.current = CapacityRun(self.service, plan, by)
        if self.lease is not None:
            run.on_done = self.lease.give_back_capacity
        return run

    def busy(self) -> bool:
        """Whether a test runs, here or in another UI worker (so Stop has something to stop)."""
        return self.running is not None or (self.lease is not None and self.lease.capacity_elsewhere() is not None)

    async def stop(self) -> bool:
        """Stop the test running here or in another UI worker; False when none runs."""
        if self.running is not None:
            self.running.stop()
            return True
        if self.lease is not None and self.lease.capacity_elsewhere() is not None:
            await self.lease.stop_capacity_elsewhere()
            return True
        return False

    def _stop_asked(self) -> None:
        if self.running is not None:
            self.running.stop()

    def banner(self) -> str:
        """A sentence for every visitor while a test runs; empty otherwise."""
        run = self.running
        if run is not None:
            presets, left = list(run.plan.presets), run.plan.nominal_s - (time.monotonic() - run._began)
        elif self.lease is not None and (elsewhere := self.lease.capacity_elsewhere()) is not None:
            presets, left = list(elsewhere.get("presets", [])), float(elsewhere.get("ends_at", 0)) - time.time()
        else:
            return ""
        minutes = round(left / 60)
        when = "for less than a minute more" if minutes < 1 else f"for about {minutes} more minute{'s' if minutes > 1 else ''}"
        return f"A capacity test is running on {' and '.join(presets)}: replies may be slower {when}."
