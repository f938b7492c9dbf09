"""One vLLM `AsyncLLM`, shared by every user of one model configuration: with chat/engine_core.py
(engine cores that several processes share) and chat/engine_load.py (the scheduler's reports), the
app's door to vLLM.

An `Engine` goes STARTING -> READY, or -> FAILED (with a message for people), and -> CLOSED when
unloaded (chat/registry.py decides when). It owns what it knows about its requests (streams in
flight, last use, whether it is too busy to take more) and translates vLLM at its boundary:
prompts go in as chat messages and come back as a typed `Prompt`; outputs come out as typed
`Chunk`s; vLLM's errors leave as `chat.errors`. Nothing else in the app imports vLLM to serve a reply
(chat/engine_args.py reads vLLM's engine arguments to check a preset's). What these modules use of
vLLM beyond its documented API, and the vLLM builds they have run on, are listed in chat/engine_vllm.py.

The engine is built in a worker thread (construction blocks while the model loads) and its
coroutines are only ever awaited from the server's event loop, which it binds to on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
import time
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from chat.engine_core import CORE_STOP_S, EngineSlot, SharedCore, engine_args, engine_arguments, join_core, on_cpu
from chat.engine_load import EngineLoad, load_recorder
from chat.errors import EngineBusy, EngineError, EngineFailed, SettingsError
from chat.models import resolve_model, weights_bytes
from chat.presets import Preset
from chat.sampling import KNOBS, Sampling

if TYPE_CHECKING:
    from vllm.v1.engine.async_llm import AsyncLLM

log = logging.getLogger(__name__)

BUSY = "The demo is busy, try again in a moment."
FAILED_REPLY = "The engine could not write this reply; please try again."  # vLLM failed the request
RESTARTING = "The model's engine stopped working and is being restarted; your next message will wait for it."


class EngineState(enum.Enum):
    STARTING = "starting"
    READY = "ready"
    SLEEPING = "sleeping"  # CUDA sleep mode: weights parked in CPU memory, GPU memory free
    FAILED = "failed"
    CLOSED = "closed"


@dataclass(frozen=True)
class Prompt:
    """A conversation rendered through the model's chat template, ready for `Engine.generate`."""

    token_ids: Sequence[int]
    rendered: Any  # what vLLM takes; opaque outside this module

    @property
    def tokens(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class EngineTimes:
    """One request's time inside the engine, from the engine's own clock."""

    queue_s: float | None  # waiting for a free slot
    prefill_s: float | None  # reading the prompt
    decode_s: float | None  # first token to last token


@dataclass(frozen=True)
class Chunk:
    """New output of one request: text, how many tokens it holds, and how the request ended."""

    text: str
    tokens: int
    finished: bool = False
    finish_reason: str | None = None  # stop, length, abort, repetition, error
    stop_string: bool = False  # it stopped on a stop string (not end of sequence)
    cached_tokens: int = 0  # prompt tokens served from the prefix cache (on the last chunk)
    times: EngineTimes | None = None  # on the last chunk


def _times(metrics: Any, generated: int) -> EngineTimes | None:
    if metrics is None or not getattr(metrics, "scheduled_ts", 0):
        return None
    queue_s = max(metrics.scheduled_ts - metrics.queued_ts, 0.0)
    prefill_s = decode_s = None
    if metrics.first_token_ts:
        prefill_s = max(metrics.first_token_ts - metrics.scheduled_ts, 0.0)
        if metrics.last_token_ts and generated > 1:
            decode_s = max(metrics.last_token_ts - metrics.first_token_ts, 0.0)
    return EngineTimes(queue_s, prefill_s, decode_s)


def sampling_params(sampling: Sampling, max_tokens: int, ignore_eos: bool = False) -> Any:
    """vLLM's SamplingParams for these values (the knob table says how each maps), streaming only new text."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind

    values = {knob.name: knob.engine_value(getattr(sampling, knob.name)) for knob in KNOBS}
    values["max_tokens"] = max_tokens
    try:
        return SamplingParams(**values, output_kind=RequestOutputKind.DELTA, ignore_eos=ignore_eos)
    except VLLMValidationError as exc:
        parameter = getattr(exc, "parameter", None) or "a setting"
        raise SettingsError(
            f"The engine refused {parameter} = {getattr(exc, 'value', '?')}; pick a value within the slider's range."
        ) from exc


def memory_need(arguments: Mapping[str, Any], folder: Path, gpu_share: float) -> float:
    """What an engine with these arguments takes from the memory budget: on a CPU, bytes of KV cache
    and weights; on a GPU, its share of GPU memory (`gpu_share` where the preset sets none)."""
    if on_cpu():
        return (arguments.get("kv_cache_memory_bytes") or 4 << 30) + weights_bytes(folder, arguments.get("dtype"))
    return float(arguments.get("gpu_memory_utilization", gpu_share))


WARM_UP_BATCH = 256  # on a GPU: the batch sizes a start's warm-up walks through, at most (max_num_seqs)


async def warm_up_requests(llm: Any, prompt: Any, sampling: Sampling, count: int, tag: str) -> None:
    """`count` requests at once, the i-th writing i tokens, so that the batch shrinks one by one from
    `count` to 1: every batch size the sampler will see up to there runs once before the first reader.
    On a GPU the first 256-reader round after a start ran at 0.76-0.92x of the next, the raw engine's
    too (what was cold was not found; vLLM compiles its sampler's Triton kernel at first use). The
    app's engines start with this, and bench/raw_engine.py's with --warm-up."""

    async def one(index: int) -> None:
        params = sampling_params(sampling, max_tokens=index + 1, ignore_eos=True)
        async with contextlib.aclosing(llm.generate(prompt, params, f"{tag}-{index}")) as outputs:
            async for _ in outputs:
                pass

    await asyncio.gather(*(one(i) for i in range(count)))


@dataclass
class Engine:
    """One AsyncLLM and what the app knows about it."""

    preset: Preset  # the first preset that asked for this configuration
    state: EngineState = EngineState.STARTING
    phase: str = "waiting to start"
    error: str | None = None
    llm: AsyncLLM | None = None
    model_dir: Path | None = None
    max_model_len: int = 0
    max_num_seqs: int = 0
    max_waiting: int = 256  # streams beyond max_num_seqs that may wait; more are refused at once
    memory_need: float = 0.0  # in the budget's unit: bytes on CPU, a share of GPU memory on GPU
    load: EngineLoad = field(default_factory=EngineLoad)
    started_at: float = field(default_factory=time.monotonic)
    ready_at: float | None = None
    last_used: float = field(default_factory=time.monotonic)
    failures: int = 0
    retry_at: float = 0.0
    refusal: EngineBusy | None = None  # why it was not started (no room); asking again may work
    start_delay_s: float = 0.0  # a restart after a crash waits this long first
    on_death: Callable[[Engine], object] | None = None  # set by the registry: restart it
    slot: EngineSlot | None = None  # a client of a core that another process owns (chat/owner.py)
    core: SharedCore | None = None  # the core this process started for other processes to join
    generation: int = 0  # which start of the shared core the client is on (chat/owner.py counts them)
    held: asyncio.Event | None = None  # set while the owner makes room with this engine: new requests wait
    replies: int = 0  # replies that picked this engine and have not ended (chat/service.py counts them)
    _streams: dict[str, Callable[[str], None]] = field(default_factory=dict)  # request id -> end it, with a reason
    task: asyncio.Task[None] | None = None  # starting or waking it (the registry runs it)

    @property
    def key(self) -> str:
        return self.preset.engine_key

    @property
    def can_sleep(self) -> bool:
        """Presets opt in with `enable_sleep_mode: true`; vLLM supports it on CUDA only."""
        return bool(self.preset.engine.get("enable_sleep_mode")) and not on_cpu() and self.slot is None

    @property
    def start_seconds(self) -> float | None:
        return None if self.ready_at is None else self.ready_at - self.started_at

    @property
    def streams(self) -> int:
        """Requests streaming from this engine now."""
        return len(self._streams)

    @property
    def in_use(self) -> bool:
        """Whether a reply is on it: streaming, or picked it and still preparing its prompt (no
        stream yet). Only an engine not in use may be put to sleep or unloaded to make room."""
        return bool(self._streams) or self.replies > 0

    def is_streaming(self, request_id: str) -> bool:
        return request_id in self._streams

    @property
    def loaded(self) -> bool:
        """Whether its model is loaded in this process (a client of it, at least): from the build's end to the unload."""
        return self.llm is not None

    def status(self) -> str:
        """One line for people: what this engine is doing."""
        if self.state is EngineState.STARTING:
            verb = "Restarting" if self.start_delay_s else "Starting"
            return f"{verb} the engine for {self.preset.name}: {self.phase}… {time.monotonic() - self.started_at:.0f} s"
        if self.state is EngineState.FAILED:
            return self.error or "The engine failed to start."
        if self.state is EngineState.CLOSED:
            return "This engine was unloaded."
        if self.state is EngineState.SLEEPING:
            return "Asleep to make room for another model; it wakes in seconds with the next message."
        busy = f"{self.load.running} being written" + (f", {self.load.waiting} waiting" if self.load.waiting else "")
        return f"Ready · {busy} · KV cache {self.load.kv_cache_usage:.0%} used"

    def num_unfinished(self) -> int:
        """Requests the engine's front end still tracks (0 when nothing leaked)."""
        return 0 if self.llm is None else self.llm.output_processor.get_num_unfinished_requests()

    # --- serving: the vLLM boundary ------------------------------------------------------------

    def _running(self) -> AsyncLLM:
        if self.llm is None:
            raise EngineError(self.error or "The engine is not running; please try again.")
        return self.llm

    async def render(self, messages: list[dict[str, str]]) -> Prompt:
        """The conversation through the model's chat template, as vLLM's own server renders it."""
        from vllm.renderers.params import ChatParams, TokenizeParams

        # No length limit here: the caller counts the tokens to say how long the conversation is.
        renderer = self._running().renderer
        args = ([cast(Any, messages)], ChatParams(chat_template_kwargs={"add_generation_prompt": True, "tokenize": False}),
                TokenizeParams(max_total_tokens=None, add_special_tokens=False))
        if self._streams:  # others stream through this process: render beside them, in vLLM's thread pool
            _, prompts = await renderer.render_chat_async(*args)
        else:
            # Nothing else waits for this event loop: render on it, at once. In the pool, the result
            # waited for the loop (busy with Gradio's turn) and the thread for the GIL: about 4 ms
            # of one stream's first token (bench.frontend --levels 1 --doors browser).
            _, prompts = renderer.render_chat(*args)
        prompt = prompts[0]
        return Prompt(prompt["prompt_token_ids"], prompt)

    async def generate(
        self,
        prompt: Prompt,
        sampling: Sampling,
        *,
        max_tokens: int,
        request_id: str,
        on_unload: Callable[[str], None],
        ignore_eos: bool = False,
        priority: int = 0,
    ) -> AsyncGenerator[Chunk, None]:
        """Stream one request's output. Refuses with EngineBusy when too many are in flight.

        `priority` is vLLM's (lower first), used where the preset sets `scheduling_policy: priority`.
        `on_unload(reason)` is called if the engine is unloaded under the request. Closing or
        cancelling the iterator aborts the request in vLLM. Raises EngineFailed when the engine's
        process died (it is then restarted) and EngineError when vLLM failed this request.
        """
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        llm = self._running()
        if len(self._streams) >= self.max_num_seqs + self.max_waiting:
            raise EngineBusy(BUSY)
        params = sampling_params(sampling, max_tokens, ignore_eos)
        self._streams[request_id] = on_unload
        self.load.on_change()
        generated = 0
        try:
            async with contextlib.aclosing(llm.generate(prompt.rendered, params, request_id, priority=priority)) as outputs:
                async for out in outputs:
                    completion = out.outputs[0]
                    generated += len(completion.token_ids)
                    if not out.finished:
                        yield Chunk(completion.text, len(completion.token_ids))
                        continue
                    yield Chunk(
                        completion.text,
                        len(completion.token_ids),
                        finished=True,
                        finish_reason=completion.finish_reason,
                        stop_string=isinstance(completion.stop_reason, str),
                        cached_tokens=out.num_cached_tokens or 0,
                        times=_times(out.metrics, generated),
                    )
        except EngineDeadError as exc:
            log.error("Engine for %r died under a stream: %r", self.preset.name, exc)
            if self.on_death is not None and self.state is EngineState.READY:
                self.on_death(self)
            raise EngineFailed(RESTARTING) from exc
        except EngineGenerateError as exc:
            log.exception("Request %s failed in the engine", request_id)
            raise EngineError(FAILED_REPLY) from exc
        finally:
            self._streams.pop(request_id, None)
            self.last_used = time.monotonic()
            self.load.on_change()

    async def warm_up(self) -> None:
        """The first readers must not pay for this engine's first requests: a request with the preset's
        own sampling renders and writes once (about half a second of a fresh UI worker's first reply),
        and on a GPU the process that started the core walks its batch through every size first
        (`warm_up_requests`)."""
        prompt = await self.render([{"role": "user", "content": "Hi"}])
        count = 1 if on_cpu() or self.slot is not None else min(self.max_num_seqs, WARM_UP_BATCH)
        await warm_up_requests(self._running(), prompt.rendered, self.preset.sampling.defaults, count,
                               f"warm-up-{id(self)}")

    def abort(self, request_id: str) -> None:
        """Abort a request in flight, without waiting; its stream then ends with finish_reason abort."""
        if self.llm is not None and request_id in self._streams:
            asyncio.get_running_loop().create_task(self.llm.abort(request_id))

    async def abort_streams(self, reason: str) -> None:
        """End every stream in flight with `reason` shown to its reader, then abort them."""
        for end in list(self._streams.values()):
            end(reason)
        if self.llm is not None and self._streams:
            await self.llm.abort(list(self._streams))

    # --- life cycle ------------------------------------------------------------------------

    def build(self, make_room: Callable[[Engine], None], shared_slots: int = 0, sockets: Path | None = None) -> None:
        """Blocking: find the model, make room for it, start vLLM. Runs in a worker thread.

        With `slot` set this joins a core that another process started; with `shared_slots` it
        starts a core for that many clients (this process takes slot 0) in the folder `sockets`."""
        from vllm.v1.engine.async_llm import AsyncLLM

        self.phase = "finding the model"
        folder = resolve_model(self.preset, report=self._report)
        self.model_dir = folder
        stat_loggers = [load_recorder(self.load)]
        if self.slot is not None:  # the engine's memory is the owner's, not this budget's
            self.phase = "joining the shared engine"
            self.llm = join_core(self.preset, folder, self.slot, stat_loggers)
        else:
            args = engine_args(self.preset, folder)
            self.memory_need = memory_need(engine_arguments(self.preset, folder), folder, args.gpu_memory_utilization)
            make_room(self)
            self.phase = "loading the model into vLLM"
            log.info("Starting the engine for preset %r (model %s)", self.preset.name, folder)
            if shared_slots:
                assert sockets is not None
                self.core = SharedCore(self.preset, folder, shared_slots, sockets)
                self.core.wait_ready()
                self.llm = join_core(self.preset, folder, self.core.slot(0), stat_loggers)
            else:
                self.llm = AsyncLLM.from_engine_args(args, stat_loggers=stat_loggers)
        self.max_model_len = self.llm.model_config.max_model_len
        self.max_num_seqs = self.llm.vllm_config.scheduler_config.max_num_seqs

    def _report(self, line: str) -> None:
        self.phase = line[0].lower() + line[1:] if line else line
        log.info("%s: %s", self.preset.name, line)

    @property
    def died(self) -> bool:
        """The engine's process stopped while it was READY (found by the registry's watch, which only a
        process serving alone runs: a UI worker's engines are clients of the owner's cores, which the
        owner watches itself, and such a client is never told)."""
        return self.state is EngineState.READY and self.llm is not None and bool(self.llm.errored)

    async def sleep(self) -> None:
        """CUDA sleep mode: weights to CPU memory, KV cache dropped."""
        await self._running().sleep(level=1)
        self.state = EngineState.SLEEPING

    async def wake_up(self) -> None:
        await self._running().wake_up()
        self.state = EngineState.READY

    def shutdown(self) -> None:
        """Blocking: free the engine's memory. Abort streams first or they hang forever. Called
        from a thread, prefer `close`, which lets the client's output handler end first."""
        llm, self.llm = self.llm, None
        core, self.core = self.core, None
        self.state = EngineState.CLOSED
        if llm is not None:
            llm.shutdown(timeout=CORE_STOP_S)
        if core is not None:
            core.shutdown()

    async def close(self) -> None:
        """Free the engine's memory without blocking the event loop: this process's client first,
        then the core it started, if it started one. The client's output handler is cancelled here
        first: vLLM's shutdown closes the client's sockets before it cancels the handler, which then
        reads the closing as the engine's death and logs a traceback (seen with shared cores)."""
        llm, self.llm = self.llm, None
        core, self.core = self.core, None
        self.state = EngineState.CLOSED
        if llm is not None:
            handler = getattr(llm, "output_handler", None)
            if isinstance(handler, asyncio.Task) and not handler.done():
                handler.cancel()
                await asyncio.wait({handler}, timeout=5)
            await asyncio.to_thread(llm.shutdown, timeout=CORE_STOP_S)
        if core is not None:
            await asyncio.to_thread(core.shutdown)
