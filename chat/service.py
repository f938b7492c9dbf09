"""The reply pipeline: every message, from the Chat tab, Compare or the API, takes this one path.

    request = ReplyRequest("Write a haiku.", preset="SmolLM2 135M (CPU)", sampling={"max_tokens": 64})
    async for event in service.reply(request):
        ...   # Waiting(status) while an engine starts, Writing(reply, line) per redraw, then Finished or Failed

`ChatService.reply` checks the message, resolves the preset and its settings (once), waits for the
engine with progress, applies the system-prompt policy, streams the reply with paced redraws,
records the metrics and takes Stop; callers only turn events into their own output. Nothing from a
browser or API client names a file, a model or an engine argument: they pick a preset by name and
send sampling values, which are checked against that preset's ranges.

    browser / API ─> live.start (Chat tab, /chat) · CompareService.send · reply_api.reply
                       └─> ChatService.reply ─> registry.ready, then paced_reply (chat.stream)
                                                                   └─> Engine.render / Engine.generate ─> vLLM
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from chat import metrics
from chat.engine import BUSY, Engine
from chat.errors import UNEXPECTED_ERROR, ChatError, EngineBusy, InputError, Stopped, VisitorBusy
from chat.history import check_text, to_model_messages
from chat.pacing import RedrawPacer
from chat.presets import Preset, PresetCatalog
from chat.registry import EngineRegistry
from chat.sampling import Sampling
from chat.stream import Reply, paced_reply
from chat.tallies import AppTallies, InProcess

log = logging.getLogger(__name__)
UNKNOWN_PRESET = "(unknown preset)"


@dataclass(frozen=True)
class ReplyRequest:
    """One message to answer, as any front end hands it over."""

    message: str
    history: Sequence[Mapping[str, Any]] = ()  # earlier turns (Gradio's messages or plain role/content)
    preset: str | None = None  # None: the default preset
    system_prompt: str | None = None  # None: the preset's own; "" none at all
    sampling: Mapping[str, object] | Sampling = field(default_factory=dict)  # missing knobs take the preset's defaults
    stop_key: str | None = None  # `ChatService.stop(key)` stops every reply given this key
    visitor: str = ""  # who asked (`chat.voters.visitor_of`), for their share; "" counts as nobody's
    submitted_at: float = field(default_factory=time.monotonic)
    # vLLM's scheduling priority, lower first; only engines whose preset sets `scheduling_policy:
    # priority` use it (the capacity test sends its synthetic users at a higher number).
    priority: int = 0


@dataclass(frozen=True)
class Waiting:
    """The engine is not ready yet (starting, waking); `status` says what it is doing."""

    status: str


@dataclass(frozen=True)
class Writing:
    """New text to show: `reply.text` so far, and `line`, the line beneath it as it stood then."""

    reply: Reply
    line: str


@dataclass(frozen=True)
class Finished:
    """The reply ended (by itself, by Stop, by a timeout): `reply.stats` and `reply.notice` say how."""

    reply: Reply


@dataclass(frozen=True)
class Failed:
    """It could not be written, or not to the end; `error.message` is the sentence to show.

    `reply` holds what was written before a failure mid-way (None when refused before the engine).
    `error` is `Stopped` when the reader pressed Stop before the engine took the request.
    """

    error: ChatError
    reply: Reply | None = None


ReplyEvent = Waiting | Writing | Finished | Failed


STOPPED_BEFORE_START = "Stopped by you before the reply started."
VISITOR_PRIORITY_STEPS = 99  # a visitor's replies at once beyond this count as this many (capacity tests run at 100)


class _Ticket:
    """One reply in the pipeline, so that Stop reaches it at whatever stage it is."""

    def __init__(self, key: str | None) -> None:
        self.key = key or ""  # the stop key that reaches it ("": none)
        self.stopped = False
        self.reply: Reply | None = None
        self.waiting: asyncio.Future[str | None] | None = None  # its place in line for a slot (`Admission`)
        self.slot: str | None = None  # the slot's ticket, once it has one

    def stop(self) -> None:
        self.stopped = True
        if self.reply is not None:
            self.reply.stop()
        if self.waiting is not None:
            self.waiting.cancel()

    def check(self) -> None:
        if self.stopped:
            raise Stopped(STOPPED_BEFORE_START)


class Admission:
    """At most `limit` replies written at once by the whole app, whichever front end or UI worker
    asked (`--concurrency-limit`); the others wait in order, at most `max_waiting` of them (more are
    refused at once). The slots and the line are the app's counts (chat/tallies.py): in this process,
    or with UI workers in the engine owner."""

    KEY = "replies-at-once"

    def __init__(self, limit: int, max_waiting: int, tallies: AppTallies) -> None:
        self.limit, self.max_waiting, self.tallies = limit, max_waiting, tallies

    async def enter(self, ticket: _Ticket) -> AsyncGenerator[None, None]:
        """Take a slot; yields once if the reply must wait in line for it. Stop while waiting raises
        Stopped, a full line EngineBusy; closed while waiting, it gives up its place. The slot's
        ticket is kept on `ticket` for `leave`."""
        queued = asyncio.Event()
        entering = asyncio.ensure_future(self.tallies.enter(self.KEY, self.limit, self.max_waiting, queued.set))
        ticket.waiting = entering
        try:
            told = asyncio.ensure_future(queued.wait())
            try:
                await asyncio.wait([entering, told], return_when=asyncio.FIRST_COMPLETED)
            finally:
                told.cancel()
            if not entering.done():
                yield
            slot = await entering
        except asyncio.CancelledError:
            if ticket.stopped:  # Stop cancelled its place in line
                raise Stopped(STOPPED_BEFORE_START) from None
            raise
        finally:
            ticket.waiting = None
            entering.cancel()  # still in line: out of it
        if slot is None:
            raise EngineBusy(BUSY)
        ticket.slot = slot

    def leave(self, ticket: _Ticket) -> None:
        if ticket.slot is not None:
            self.tallies.leave(self.KEY, ticket.slot)
            ticket.slot = None


@dataclass
class ChatService:
    catalog: PresetCatalog
    registry: EngineRegistry
    default_preset: str
    has_gpu: bool = False
    pacer: RedrawPacer = field(default_factory=RedrawPacer)
    admission: Admission | None = None  # None: every reply goes to the engine at once (vLLM batches them)
    per_visitor: int = 0  # --replies-per-visitor: one visitor's replies on their way at once (0: no cap)
    # Where visitors' replies on their way are counted: here, or for the whole app in the engine owner.
    tallies: AppTallies = field(default_factory=InProcess)
    _tickets: dict[str, set[_Ticket]] = field(default_factory=dict)  # stop key -> its replies on their way

    # --- presets ---------------------------------------------------------------------------

    def preset(self, name: str | None) -> Preset:
        """A preset this machine can run, by name (None: the default); PresetError says why not otherwise."""
        return self.catalog.runnable(name, self.default_preset, self.has_gpu)

    def preset_names(self) -> list[str]:
        """Usable presets, the default first."""
        names = list(self.catalog.usable(self.has_gpu))
        default = self.preset(None).name
        return [default] + [name for name in names if name != default]

    def unavailable(self) -> dict[str, str]:
        return self.catalog.unusable(self.has_gpu)

    def engine_line(self, preset_name: str | None) -> str:
        """The line beneath the chat: what the chosen preset's engine is doing."""
        try:
            preset = self.preset(preset_name)
        except ChatError as exc:
            return exc.message
        view = self.registry.view(preset)
        return f"Engine: {view.status}" if view else "Engine: not loaded yet (it starts with the first message)"

    # --- the pipeline ----------------------------------------------------------------------

    async def reply(self, request: ReplyRequest) -> AsyncGenerator[ReplyEvent, None]:
        """Answer one message: Waiting*, Writing*, then exactly one Finished or Failed.

        Never raises for anything a person can cause; unexpected errors are logged with their
        traceback and end as Failed with a generic sentence. Closing the iterator aborts the reply.
        """
        ticket = self._issue(request.stop_key)
        engine: Engine | None = None
        admitted: Admission | None = None
        counted = ""  # the visitor whose share this reply holds
        preset_name = UNKNOWN_PRESET  # a metrics label: never what a stranger typed (unbounded, maybe not even text)
        try:
            preset = self.preset(request.preset)
            preset_name = preset.name
            check_text(request.message, "Your message", new_message=True)
            check_text(request.system_prompt or "", "The system prompt")
            system_prompt = preset.system_prompt if request.system_prompt is None else request.system_prompt
            messages = to_model_messages(request.history, request.message, system_prompt)
            for message in messages:  # what the model will read (unanswered messages are left out)
                check_text(message["content"], "A message in this conversation")
            sampling = request.sampling
            if not isinstance(sampling, Sampling):
                sampling = preset.sampling.resolve(sampling)
            ahead = await self._take_share(request.visitor)
            counted = request.visitor
            if self.admission is not None:
                admitted = self.admission
                async with contextlib.aclosing(admitted.enter(ticket)) as line:
                    async for _ in line:
                        yield Waiting(f"Waiting for a free slot: this demo writes {admitted.limit} replies at once…")
            async for step in self.registry.ready(preset):  # status lines, then the ready engine
                if isinstance(step, Engine):
                    # In use from this moment (no await in between): preparing the prompt comes
                    # before the stream, and the engine must not be put to sleep under it.
                    engine = step
                    engine.replies += 1
                ticket.check()
                if not isinstance(step, Engine):
                    yield Waiting(step)
            assert engine is not None
            now = time.monotonic()
            redraws = paced_reply(
                engine, preset, messages, sampling, self.pacer.interval,
                submitted_at=now,
                # Time spent waiting for the engine to start is reported apart from time to first token.
                engine_wait_s=max(now - request.submitted_at, 0.0),
                # A visitor's n-th reply at once waits behind everyone's first (vLLM's priority
                # scheduling, where the preset has it), never behind a capacity test's users.
                priority=request.priority + min(ahead, VISITOR_PRIORITY_STEPS),
            )
            async with contextlib.aclosing(self._stream(preset, ticket, redraws)) as writing:
                async for event in writing:
                    yield event
            assert ticket.reply is not None
            yield Finished(ticket.reply)
        except Stopped as exc:
            yield Failed(exc)
        except ChatError as exc:
            if ticket.reply is None or not ticket.reply.generating:
                metrics.rejected(preset_name, _reason(exc))
            yield Failed(exc, ticket.reply)
        except Exception:
            log.exception("Unexpected error while replying")
            yield Failed(ChatError(UNEXPECTED_ERROR), ticket.reply)
        finally:
            if engine is not None:
                engine.replies -= 1
            if admitted is not None:
                admitted.leave(ticket)
            if counted:
                self.tallies.release(share_key(counted))
            self._release(ticket)
            if ticket.reply is not None and ticket.reply.stats is not None:
                metrics.reply_finished(ticket.reply.stats)

    async def _stream(self, preset: Preset, ticket: _Ticket,
                      redraws: AsyncGenerator[Reply, None]) -> AsyncGenerator[Writing, None]:
        """The reply `redraws` makes (kept on the ticket, for Stop and the end) as Writing events, one per redraw."""
        in_flight = metrics.STREAMS_IN_FLIGHT.labels(preset.name)
        in_flight.inc()
        self.pacer.started()
        first_token_counted = False
        try:
            async with contextlib.aclosing(redraws):  # closing it aborts
                async for reply in redraws:
                    if ticket.reply is None:  # the first: made, not started
                        ticket.reply = reply
                        if ticket.stopped:
                            reply.stop()
                        continue
                    if not first_token_counted and reply.progress.first_token_at is not None:
                        first_token_counted = True
                        metrics.first_token(reply.preset.name, reply.progress.first_token_at - reply.submitted_at)
                    yield Writing(reply, reply.progress.line(time.monotonic()))
        finally:
            self.pacer.ended()
            in_flight.dec()

    async def _take_share(self, visitor: str) -> int:
        """Count a reply of `visitor`'s as on its way; how many they had already. VisitorBusy where
        that is their whole share."""
        if not visitor:
            return 0
        held = await self.tallies.hold(share_key(visitor), self.per_visitor)
        if held is None:
            raise VisitorBusy(f"You have {self.per_visitor} replies being written already, as many as one visitor "
                              "may; wait for one to finish (or stop one), then send this again.")
        return held

    # --- Stop ------------------------------------------------------------------------------

    def stop(self, key: str | None) -> bool:
        """Stop every reply given this stop key, streaming or on its way; False when there is none."""
        tickets = self._tickets.get(key or "")
        if not tickets:
            return False
        for ticket in list(tickets):
            ticket.stop()
        return True

    def _issue(self, key: str | None) -> _Ticket:
        ticket = _Ticket(key)
        if ticket.key:
            self._tickets.setdefault(ticket.key, set()).add(ticket)
        return ticket

    def _release(self, ticket: _Ticket) -> None:
        tickets = self._tickets.get(ticket.key, set())
        tickets.discard(ticket)
        if not tickets:
            self._tickets.pop(ticket.key, None)


def share_key(visitor: str) -> str:
    """The tally of a visitor's replies on their way (chat/tallies.py)."""
    return f"replies:{visitor}"


def _reason(exc: ChatError) -> str:
    """The `reason` label of chat_requests_rejected_total."""
    if isinstance(exc, VisitorBusy):
        return "visitor_share"
    if isinstance(exc, EngineBusy):
        return "busy"
    if isinstance(exc, InputError):
        return "input"
    return type(exc).__name__
