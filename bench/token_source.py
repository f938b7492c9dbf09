"""A stand-in for vLLM's engine core that emits tokens at GPU rates, to measure the front end on a CPU.

On a GPU host the app's process runs vLLM's front end (`AsyncLLM`: prompt processing,
detokenization, per-request output queues, stats) and the engine core runs in a process of its own,
pushing one `EngineCoreOutputs` per engine step. `install()` replaces only that engine-core process,
at the one place `AsyncLLM.__init__` starts it (`EngineCoreClient.make_async_mp_client`), with a
`TokenSource` living in the app's event loop. Everything the app touches (`generate`, `abort`, the
renderer, `RequestOutput`s with their metrics, the stat loggers) stays vLLM's own code, so the app's
process does the same work per token as beside a GPU, and nothing in `chat/` or `app.py` changes.

The schedule is the engine's, not the app's: every `step_s` all running requests get one token
(up to `max_num_seqs`; the rest wait), like a GPU engine in its decode phase. Steps follow a
wall-clock timeline that the app's loop cannot slow down: when the loop is late, the steps it missed
are handed over back to back, as vLLM's output socket would have queued them. Each request's own
timing at the source (arrival, first and last token, how late the app picked its tokens up) is
appended as one JSON line to `log_path` when it ends, so the benchmark can compare what a reader
saw with what the engine offered.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import re
import time
import traceback
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("bench.token_source")

# Emitted in a cycle, so that the detokenizer turns real tokens into real words.
TEXT = (
    " The lighthouse keeper walked down to the shore every morning before the sun came up. He"
    " counted the boats in the harbour, wrote the weather in a small notebook and listened to the"
    " gulls argue over the fish that the night had left on the sand. One morning he found a green"
    " bottle wedged between two rocks, its cork sealed with wax. Inside was a letter written in"
    " careful, old-fashioned handwriting, asking whoever found it to light the lamp one hour early"
    " on the last day of summer. He did not know who had written it, or why, but he decided that"
    " such a small favour was worth doing. When the day came, he climbed the spiral stairs, wound"
    " the clockwork and lit the lamp while the sky was still bright, and far out at sea a single"
    " sail turned slowly toward the light."
)


class NotSimulated(AttributeError):
    """The app used a part of vLLM's engine core that the token source does not provide."""


@dataclass(frozen=True)
class Reply:
    """A scripted reply: to a prompt whose latest cue is `cue` (or to any prompt, with cue ""), the
    source writes `text`, then the end of sequence ("finished"), or stops at Max tokens first. An
    `endless` reply, or a request that ignores the end of sequence, gets `text` again until Max tokens."""

    cue: str
    text: str
    endless: bool = False


@dataclass
class SourceRecord:
    """One request as the source saw it (monotonic seconds, the machine's clock)."""

    id: str
    prompt_tokens: int
    max_tokens: int
    added: float  # add_request_async was called
    first_token: float | None = None  # end of the step that produced its first token (engine time)
    last_token: float | None = None
    first_handed: float | None = None  # when the app's loop actually took that step's output
    tokens: int = 0
    lag_sum: float = 0.0  # sum over its steps of (taken - step end): how far behind the loop was
    finish: str = "length"
    script: tuple[int, ...] = ()  # a scripted reply's tokens (empty: the story, from an offset, to Max tokens)
    endless: bool = False  # the script again and again, to Max tokens
    priority: int = 0  # vLLM's request priority: lower goes first
    tag: str = ""  # what the source's `tag` pattern found in the prompt (the benchmark's request number)

    @property
    def lag_mean(self) -> float:
        return self.lag_sum / self.tokens if self.tokens else 0.0


@dataclass(frozen=True)
class Emitted:
    """One token a step gave one request: `new` on its first step, `finish` ("stop": the end of
    sequence, "length": Max tokens) on its last."""

    record: SourceRecord
    token: int
    new: bool
    finish: str | None


@dataclass(frozen=True)
class Step:
    """One engine step on the timeline (monotonic seconds): when it started and ended, when the
    app's loop took it, and the token it gave each running request."""

    start: float
    end: float
    taken: float
    emitted: list[Emitted]
    running: int
    waiting: int
    number: int


class Schedule:
    """The engine's schedule, without vLLM: requests in, one `Step` out every `step_s` (plain
    Python, so that tests/stand_in.py's engine can stream from it without importing vLLM).
    `tokenizer` needs `encode(text, add_special_tokens=False)`, `decode(ids)`, `eos_token_id` and
    `all_special_ids` (a Hugging Face tokenizer has them)."""

    def __init__(self, tokenizer: Any, max_num_seqs: int, by_priority: bool = False, step_s: float = 0.025,
                 log_path: Path | None = None, replies: tuple[Reply, ...] = (), tag: str = "") -> None:
        self.step_s = step_s
        self.tag = re.compile(tag) if tag else None  # its last match's first group goes into each record
        self.tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_token_id
        # Each scripted reply's tokens, encoded once (the detokenizer turns them back into its text).
        self.replies = [(reply, tuple(tokenizer.encode(reply.text, add_special_tokens=False))) for reply in replies]
        self._idle_report = False  # a step is owed that reports nothing running (after an abort)
        self.max_num_seqs = max_num_seqs
        self.by_priority = by_priority  # the engine's priority scheduling; else first come, first served
        ids = tokenizer.encode(TEXT, add_special_tokens=False)
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        self.tokens = [t for t in ids if t not in special]
        self._waiting: collections.deque[SourceRecord] = collections.deque()
        self._running: dict[str, SourceRecord] = {}
        self._clock = 0.0  # end of the latest step on the engine's timeline
        self._steps = 0
        self._arrived = asyncio.Event()
        self._log = open(log_path, "a", buffering=1) if log_path else None  # noqa: SIM115 - for the process's life

    def add(self, request_id: str, prompt_token_ids: Any, max_tokens: int, priority: int = 0,
            ignore_eos: bool = False) -> SourceRecord:
        script, endless = self._script(prompt_token_ids, ignore_eos)
        record = SourceRecord(request_id, len(prompt_token_ids), max_tokens, time.monotonic(),
                              script=script, endless=endless, priority=priority)
        if self.tag is not None:  # which of the benchmark's requests this is (the prompt's last match)
            found = self.tag.findall(self.tokenizer.decode(list(prompt_token_ids)))
            record.tag = found[-1] if found else ""
        # The engine's priority scheduling (only with the preset's scheduling_policy: priority, as vLLM's):
        # a lower value goes first, in order of arrival among equals.
        after = None
        if self.by_priority:
            after = next((i for i, waiting in enumerate(self._waiting) if waiting.priority > record.priority), None)
        if after is None:
            self._waiting.append(record)
        else:
            self._waiting.insert(after, record)
        self._arrived.set()
        return record

    def abort(self, request_ids: Any) -> None:
        for request_id in request_ids:
            record = self._running.pop(request_id, None)
            if record is None:
                record = next((r for r in self._waiting if r.id == request_id), None)
                if record is not None:
                    self._waiting.remove(record)
            if record is not None:
                record.finish = "abort"
                self._write(record)
        # vLLM's scheduler runs one more step after an abort, whose report says what still runs; with
        # nothing else running, the app would otherwise keep counting the aborted request as running.
        self._idle_report = True
        self._arrived.set()

    async def step(self) -> Step:
        """The next step, at the moment it ends on the engine's timeline."""
        start = await self._step_start()
        end = start + self.step_s
        admitted = {record.id for record in self._admit(start)}
        # When the loop is behind, the missed steps are handed over one per loop turn, as vLLM's
        # output socket reader (a task of this loop) would pass them on, not all at once.
        await asyncio.sleep(max(0.0, end - time.monotonic()))
        taken = time.monotonic()
        emitted = [self._advance(record, end, taken, record.id in admitted) for record in list(self._running.values())]
        self._clock = end
        self._steps += 1
        return Step(start, end, taken, emitted, len(self._running), len(self._waiting), self._steps)

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def _script(self, prompt_token_ids: Any, ignore_eos: bool) -> tuple[tuple[int, ...], bool]:
        """The tokens of the reply whose cue comes latest in the whole prompt (the system prompt and
        earlier turns count too: the last user message's cue wins only when it is there), or the
        catch-all reply's, and whether it is endless; none without scripted replies."""
        if not self.replies:
            return (), False
        prompt = self.tokenizer.decode(list(prompt_token_ids))
        chosen, latest = None, -2
        for reply, tokens in self.replies:
            at = prompt.rfind(reply.cue) if reply.cue else -1
            if (at >= 0 or not reply.cue) and at > latest:
                chosen, latest = (reply, tokens), at
        if chosen is None:
            return (), False
        reply, tokens = chosen
        return tokens, reply.endless or ignore_eos

    async def _step_start(self) -> float:
        """When the next step starts: right after the last one while busy; when idle, at the next
        request's arrival (a real engine starts a step as soon as it has work)."""
        while not self._running:
            if self._waiting:
                return max(self._clock, self._waiting[0].added)
            if self._idle_report:
                self._idle_report = False
                return max(self._clock, time.monotonic())
            self._arrived.clear()
            await self._arrived.wait()
        return self._clock

    def _admit(self, start: float) -> list[SourceRecord]:
        """Waiting requests that had arrived by the step's start, while there are free slots."""
        admitted = []
        while self._waiting and self._waiting[0].added <= start and len(self._running) < self.max_num_seqs:
            record = self._waiting.popleft()
            self._running[record.id] = record
            admitted.append(record)
        return admitted

    def _advance(self, record: SourceRecord, end: float, taken: float, new: bool) -> Emitted:
        ended = bool(record.script) and record.tokens >= len(record.script) and not record.endless
        if ended:
            token = self.eos_token_id
        elif record.script:
            token = record.script[record.tokens % len(record.script)]
        else:
            token = self.tokens[(hash(record.id) + record.tokens) % len(self.tokens)]
        record.tokens += 1
        record.last_token = end
        record.lag_sum += taken - end
        if new:
            record.first_token, record.first_handed = end, taken
        finish = "stop" if ended else "length" if record.tokens >= record.max_tokens else None
        if finish is not None:
            record.finish = finish
            del self._running[record.id]
            self._write(record)
        return Emitted(record, token, new, finish)

    def _write(self, record: SourceRecord) -> None:
        if self._log is not None:
            self._log.write(json.dumps(asdict(record)) + "\n")


class TokenSource:
    """What `AsyncLLM` holds as `engine_core`: requests in, one `EngineCoreOutputs` per step out
    (the schedule's steps in vLLM's types)."""

    def __init__(self, vllm_config: Any, tokenizer: Any, step_s: float = 0.025,
                 log_path: Path | None = None, replies: tuple[Reply, ...] = (), tag: str = "") -> None:
        scheduler = vllm_config.scheduler_config
        self.schedule = Schedule(tokenizer, scheduler.max_num_seqs, scheduler.policy == "priority", step_s,
                                 log_path, replies, tag)
        self.max_num_seqs = scheduler.max_num_seqs
        self.engine_ranks_managed = [0]  # read by AsyncLLM's stat-logger setup
        self.resources = _Resources()  # AsyncLLM.errored reads resources.engine_dead

    # --- what AsyncLLM calls -------------------------------------------------------------------

    async def get_supported_tasks_async(self) -> tuple[str, ...]:
        return ("generate",)

    async def add_request_async(self, request: Any) -> None:
        params = request.sampling_params
        self.schedule.add(request.request_id, request.prompt_token_ids or (),
                          (params.max_tokens if params is not None else None) or 16,
                          getattr(request, "priority", 0) or 0, bool(params is not None and params.ignore_eos))

    async def abort_requests_async(self, request_ids: Any) -> None:
        self.schedule.abort(request_ids)

    async def get_output_async(self) -> Any:
        """The next step's outputs, at the moment that step ends on the engine's timeline."""
        from vllm.v1.engine import EngineCoreOutputs
        from vllm.v1.metrics.stats import SchedulerStats

        step = await self.schedule.step()
        stats = SchedulerStats(num_running_reqs=step.running, num_waiting_reqs=step.waiting, step_counter=step.number,
                               kv_cache_usage=step.running / self.max_num_seqs)
        return EngineCoreOutputs(engine_index=0, outputs=[self._output(emitted, step) for emitted in step.emitted],
                                 scheduler_stats=stats, timestamp=step.end)

    def shutdown(self, timeout: float | None = None) -> None:
        self.resources.engine_dead = True
        self.schedule.close()

    def __getattr__(self, name: str) -> Any:
        # Anything else the app reaches through AsyncLLM would need the real engine core: say so
        # in the bench log instead of letting a benchmark silently measure something else.
        if name.startswith("__"):
            raise AttributeError(name)
        message = (f"bench token source: the app used engine_core.{name}, which the benchmark does not "
                   "simulate; add it to bench/token_source.py")
        log.error("%s\n%s", message, "".join(traceback.format_stack(limit=8)))
        raise NotSimulated(message)

    @staticmethod
    def _output(emitted: Emitted, step: Step) -> Any:
        from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason
        from vllm.v1.metrics.stats import PrefillStats

        record = emitted.record
        events = prefill = None
        if emitted.new:  # the engine reports when it queued and first scheduled the request, and its prefill
            events = [EngineCoreEvent(EngineCoreEventType.QUEUED, record.added),
                      EngineCoreEvent(EngineCoreEventType.SCHEDULED, step.start)]
            prefill = PrefillStats(num_prompt_tokens=record.prompt_tokens, num_computed_tokens=record.prompt_tokens)
        finish = {"stop": FinishReason.STOP, "length": FinishReason.LENGTH}.get(emitted.finish or "")
        return EngineCoreOutput(request_id=record.id, new_token_ids=[emitted.token], events=events,
                                prefill_stats=prefill, finish_reason=finish)


@dataclass
class _Resources:
    engine_dead: bool = False


_ORIGINAL: list[tuple[Any, str, Any]] = []  # (owner, name, vLLM's own) for each thing replaced


class _NoCoreProcesses:
    """What `launch_core_engines` hands back as its engine manager when no core process is started."""

    processes: list[Any] = []  # noqa: RUF012 - read only: no sentinel to watch

    def shutdown(self, timeout: float | None = None) -> None:
        pass


@dataclass
class _Launched:  # vLLM 0.32's launch_core_engines result
    engine_manager: Any
    coordinator: Any = None


def _replace(owner: Any, name: str, value: Any) -> None:
    _ORIGINAL.append((owner, name, owner.__dict__[name]))
    setattr(owner, name, value)


def install(step_s: float = 0.025, log_path: Path | None = None, replies: tuple[Reply, ...] = (),
            start_s: float = 0.0, tag: str = "") -> list[TokenSource]:
    """Make every AsyncLLM created from now on in this process stream from a TokenSource
    (until `uninstall()`), with `replies` scripted, each taking `start_s` to start (as an engine core
    loading its model would), each record tagged with what the regular expression `tag` finds in its
    prompt. Returns the list the sources are appended to as engines are built.

    A core shared by several processes (vLLM's `launch_core_engines`, chat/engine_core.py) starts no
    process either: it takes `start_s` at its start-up barrier, and each process that joins it (an
    AsyncLLM given client addresses) gets a TokenSource of its own at once, so processes share no
    schedule. Install it in every process that makes an AsyncLLM (tests/stand_in.py does so in the
    processes the app spawns)."""
    from vllm.v1.engine import core_client
    from vllm.v1.engine import utils as engine_utils

    sources: list[TokenSource] = []

    def make_async_mp_client(vllm_config: Any, executor_class: Any, log_stats: bool, *args: Any,
                             renderer: Any = None, **kwargs: Any) -> TokenSource:
        if renderer is None:
            raise NotSimulated("bench token source: AsyncLLM no longer hands its renderer to the engine core client")
        if kwargs.get("client_addresses") is None:  # its own core: the start blocks the thread that builds it
            time.sleep(start_s)
        source = TokenSource(vllm_config, renderer.tokenizer, step_s, log_path, replies, tag)
        sources.append(source)
        log.warning("vLLM's engine core replaced by the bench token source: a token for every running request "
                    "every %.1f ms, at most %d running", 1e3 * step_s, source.max_num_seqs)
        return source

    @contextlib.contextmanager
    def launch_core_engines(vllm_config: Any, executor_class: Any, log_stats: bool, addresses: Any,
                            *older: Any, **kwargs: Any) -> Iterator[Any]:
        manager = _NoCoreProcesses()
        yield (manager, None, addresses, None) if older else _Launched(manager)  # vLLM 0.25: a tuple
        time.sleep(start_s)  # the barrier on exit: the core has loaded its model

    if not _ORIGINAL:
        _replace(core_client.EngineCoreClient, "make_async_mp_client", staticmethod(make_async_mp_client))
        _replace(engine_utils, "launch_core_engines", launch_core_engines)
    return sources


def uninstall() -> None:
    """vLLM's own engine core again for AsyncLLMs created from now on."""
    while _ORIGINAL:
        owner, name, original = _ORIGINAL.pop()
        setattr(owner, name, original)
