"""One reply: render the conversation, stream the model's text, time it, and say why it ended.

    reply = Reply(engine, preset, messages, sampling)
    async for delta in reply.stream():
        ...                      # new text, as the engine produced it
    reply.stats                  # ReplyStats: what the person waited for and why it stopped

`reply.stop()` ends it as "stopped by you" (the engine request is aborted and the final stats are
still produced); cancelling or closing the stream aborts the engine request too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import AsyncGenerator
from typing import Any, cast

from chat import metrics
from chat.engine import Engine, engine_failed
from chat.errors import EngineBusy, EngineError, InputError, SettingsError
from chat.history import Message
from chat.presets import Preset
from chat.sampling import Sampling
from chat.stats import Finish, ReplyProgress, ReplyStats

log = logging.getLogger(__name__)

DEFAULT_IDLE_TIMEOUT_S = 30.0  # no new token for this long: the request is given up
TOTAL_TIMEOUT_S = 600.0  # and no reply may take longer than this in all
FLUSH_S = 0.04  # a streaming reply is redrawn at most this often (--flush-ms)
BUSY = "The demo is busy, try again in a moment."


def sampling_params(sampling: Sampling, max_tokens: int, ignore_eos: bool = False) -> Any:
    """vLLM's SamplingParams for these values, streaming only new text."""
    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import RequestOutputKind

    try:
        return SamplingParams(
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            max_tokens=max_tokens,
            repetition_penalty=sampling.repetition_penalty,
            seed=None if sampling.seed < 0 else sampling.seed,
            output_kind=RequestOutputKind.DELTA,
            ignore_eos=ignore_eos,
        )
    except VLLMValidationError as exc:
        parameter = getattr(exc, "parameter", None) or "a setting"
        raise SettingsError(f"The engine refused {parameter} = {getattr(exc, 'value', '?')}; pick a value within the slider's range.") from exc


async def render_prompt(engine: Engine, messages: list[Message]) -> dict[str, Any]:
    """The conversation through the model's chat template, as vLLM's own server renders it."""
    from vllm.renderers.params import ChatParams, TokenizeParams

    assert engine.llm is not None
    # No length limit here: we count the tokens ourselves to say how long the conversation is.
    _, prompts = await engine.llm.renderer.render_chat_async(
        [cast(Any, messages)],
        ChatParams(chat_template_kwargs={"add_generation_prompt": True, "tokenize": False}),
        TokenizeParams(max_total_tokens=None, add_special_tokens=False),
    )
    return prompts[0]


class Reply:
    """Streams one reply from a shared engine and records its stats."""

    def __init__(
        self,
        engine: Engine,
        preset: Preset,
        messages: list[Message],
        sampling: Sampling,
        *,
        request_id: str | None = None,
        submitted_at: float | None = None,
        idle_timeout_s: float | None = None,
        engine_wait_s: float = 0.0,
    ) -> None:
        self.engine = engine
        self.preset = preset
        self.messages = messages
        self.sampling = sampling
        self.request_id = request_id or f"chat-{uuid.uuid4().hex}"
        self.submitted_at = time.monotonic() if submitted_at is None else submitted_at
        self.engine_wait_s = engine_wait_s
        self.idle_timeout_s = idle_timeout_s or preset.timeout_s or DEFAULT_IDLE_TIMEOUT_S
        self.total_timeout_s = max(TOTAL_TIMEOUT_S, self.idle_timeout_s)
        self.text = ""
        self.progress = ReplyProgress(max_tokens=sampling.max_tokens, started=self.submitted_at)
        self.stats: ReplyStats | None = None
        self.notice: str | None = None  # a plain sentence to show with the reply (timeout, unload)
        self._ended_by: Finish | None = None
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self.engine_metrics: Any = None

    def stop(self) -> None:
        """The reader pressed Stop: abort the engine request; stream() then ends normally."""
        self._end(Finish.STOPPED_BY_USER)

    def _end(self, finish: Finish, notice: str | None = None) -> None:
        if self._ended_by is None:
            self._ended_by = finish
            self.notice = notice
            if self.engine.llm is not None and self.request_id in self.engine.streams:
                asyncio.get_running_loop().create_task(self.engine.llm.abort(self.request_id))

    async def stream(self) -> AsyncGenerator[str, None]:
        """Yield new text as it arrives; afterwards `stats` holds the numbers.

        Raises InputError or SettingsError before anything is generated when the conversation or
        settings cannot be used, and EngineError when the engine fails.
        """
        from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

        engine = self.engine
        llm = engine.llm
        if llm is None:
            raise EngineError(engine.error or "The engine is not running; please try again.")
        if len(engine.streams) >= engine.max_num_seqs + engine.max_waiting:
            metrics.rejected(self.preset.name, "busy")
            raise EngineBusy(BUSY)
        prompt = await render_prompt(engine, self.messages)
        self._prompt_tokens = prompt_tokens = len(prompt["prompt_token_ids"])
        room = engine.max_model_len - prompt_tokens
        if room < 1:
            metrics.rejected(self.preset.name, "input")
            raise InputError(
                f"Your conversation is {prompt_tokens:,} tokens; this model accepts {engine.max_model_len:,}. "
                "Start a new chat or shorten your message."
            )
        params = sampling_params(self.sampling, max_tokens=min(self.sampling.max_tokens, room), ignore_eos=self.preset.ignore_eos)
        finish = Finish.ERROR
        engine.streams[self.request_id] = lambda reason: self._end(Finish.UNLOADED, reason)
        if self._ended_by is not None:  # stopped while the prompt was being prepared
            engine.streams.pop(self.request_id, None)
            self.stats = self._stats(self._ended_by)
            metrics.reply_finished(self.stats)
            return
        in_flight = metrics.STREAMS_IN_FLIGHT.labels(self.preset.name)
        inter_token = metrics.INTER_TOKEN_LATENCY.labels(self.preset.name)
        in_flight.inc()
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.total_timeout_s
        last_arrival = 0.0
        try:
            async with asyncio.timeout(self.idle_timeout_s) as deadline, contextlib.aclosing(
                llm.generate(cast(Any, prompt), params, self.request_id)
            ) as outputs:
                async for out in outputs:
                    deadline.reschedule(min(loop.time() + self.idle_timeout_s, give_up_at))
                    completion = out.outputs[0]
                    if completion.token_ids:
                        now = time.monotonic()
                        if self.progress.first_token_at is None:
                            self.progress.first_token_at = now
                            metrics.first_token(self.preset.name, now - self.submitted_at)
                        else:
                            inter_token.observe(now - last_arrival)
                        last_arrival = now
                        self.progress.tokens += len(completion.token_ids)
                    if completion.text:
                        self.text += completion.text
                        yield completion.text
                    if out.finished:
                        self._cached_tokens = out.num_cached_tokens or 0
                        self.engine_metrics = out.metrics
                        finish = self._finish_of(completion.finish_reason, completion.stop_reason, params.max_tokens)
        except TimeoutError:
            finish = Finish.TIMED_OUT
            if loop.time() >= give_up_at:
                self.notice = f"This reply took longer than {self.total_timeout_s:.0f} s in all, so it was stopped."
            else:
                self.notice = (
                    f"The model produced nothing for {self.idle_timeout_s:g} s, so this reply was stopped; "
                    "the demo may be very busy, please try again."
                )
        except asyncio.CancelledError:
            finish = Finish.STOPPED_BY_USER
            raise
        except GeneratorExit:
            finish = Finish.DISCONNECTED
            raise
        except EngineDeadError as exc:
            finish = Finish.ENGINE_FAILED
            raise engine_failed(engine, exc) from exc
        except EngineGenerateError as exc:
            log.exception("Request %s failed in the engine", self.request_id)
            raise EngineError("The engine could not write this reply; please try again.") from exc
        finally:
            in_flight.dec()
            engine.streams.pop(self.request_id, None)
            engine.last_used = time.monotonic()
            self.stats = self._stats(finish)
            metrics.reply_finished(self.stats)

    def _finish_of(self, reason: str | None, stop_reason: Any, max_tokens: int) -> Finish:
        if reason == "abort":
            return self._ended_by or Finish.STOPPED_BY_USER
        if reason == "length":
            return Finish.MAX_TOKENS if max_tokens == self.sampling.max_tokens else Finish.CONTEXT_FULL
        if reason == "repetition":
            return Finish.REPETITION
        if reason == "stop":
            return Finish.STOP_SEQUENCE if isinstance(stop_reason, str) else Finish.FINISHED
        return Finish.ERROR

    def _stats(self, finish: Finish) -> ReplyStats:
        progress = self.progress
        now = time.monotonic()
        times = self.engine_metrics
        queue_s = prefill_s = decode_s = None
        if times is not None and times.scheduled_ts:
            queue_s = max(times.scheduled_ts - times.queued_ts, 0.0)
            if times.first_token_ts:
                prefill_s = max(times.first_token_ts - times.scheduled_ts, 0.0)
                if times.last_token_ts and progress.tokens > 1:
                    decode_s = max(times.last_token_ts - times.first_token_ts, 0.0)
        return ReplyStats(
            preset=self.preset.name,
            sampling=self.sampling,
            prompt_tokens=self._prompt_tokens,
            cached_prompt_tokens=self._cached_tokens,
            generated_tokens=progress.tokens,
            first_token_s=None if progress.first_token_at is None else progress.first_token_at - self.submitted_at,
            total_s=now - self.submitted_at,
            queue_s=queue_s,
            prefill_s=prefill_s,
            decode_s=decode_s,
            finish=finish,
            context_limit=self.engine.max_model_len,
            engine_wait_s=self.engine_wait_s,
        )


async def paced(reply: Reply, flush_s: float = FLUSH_S, tick_s: float = 0.5) -> AsyncGenerator[None, None]:
    """Drive `reply.stream()` and yield whenever the reader's view should be redrawn.

    The first token is shown at once; later text is coalesced to one redraw per `flush_s`, so the
    server's work per redraw does not grow with the token rate; with no new text a redraw still
    comes every `tick_s` (elapsed time keeps moving). The stream runs in its own task, so its
    timeout and cancellation stay in one place; closing this generator aborts the request.
    """
    loop = asyncio.get_running_loop()
    done = object()
    arrivals: asyncio.Queue[object] = asyncio.Queue()

    async def pump() -> None:
        try:
            async for _ in reply.stream():
                arrivals.put_nowait(None)
        except BaseException as exc:
            arrivals.put_nowait(exc)
            raise
        arrivals.put_nowait(done)

    task = loop.create_task(pump())
    last_redraw = loop.time()
    shown_text = dirty = False
    try:
        while True:
            wait = max(0.0, flush_s - (loop.time() - last_redraw)) if dirty else tick_s
            try:
                item = await asyncio.wait_for(arrivals.get(), timeout=wait)
            except TimeoutError:
                item = "due"  # a flush or a tick is due
            if item is done:
                return
            if isinstance(item, BaseException):
                raise item
            if item is None and shown_text and loop.time() - last_redraw < flush_s:
                dirty = True
                continue
            shown_text = shown_text or item is None
            dirty = False
            last_redraw = loop.time()
            yield None
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
