"""One reply: stream the model's text from an engine, time it, say why it ended, and pace redraws.

    reply = Reply(engine, preset, messages, sampling)
    async for delta in reply.stream():
        ...                      # new text, as the engine produced it
    reply.stats                  # ReplyStats: what the person waited for and why it stopped

`reply.stop()` ends it as "stopped by you" (the engine request is aborted and the final stats are
still produced); cancelling or closing the stream aborts the engine request too. `paced(reply)`
drives the stream and says when a reader's view is worth redrawing; `paced_reply(...)` makes the
reply and paces it in one call (the reply pipeline's way in). Nothing here imports vLLM:
`chat.engine` is the boundary.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Callable
from typing import Any

from chat import metrics
from chat.engine import Chunk, Engine, EngineTimes
from chat.errors import EngineFailed, InputError
from chat.history import Message
from chat.pacing import FLUSH_S
from chat.presets import Preset
from chat.sampling import Sampling
from chat.stats import Finish, ReplyProgress, ReplyStats

DEFAULT_IDLE_TIMEOUT_S = 30.0  # no new token for this long: the request is given up
TOTAL_TIMEOUT_S = 600.0  # and no reply may take longer than this in all
TICK_S = 0.5  # with no new text, a reader's view is still redrawn this often (elapsed time moves)


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
        priority: int = 0,
    ) -> None:
        self.engine = engine
        self.preset = preset
        self.messages = messages
        self.sampling = sampling
        self.request_id = request_id or f"chat-{uuid.uuid4().hex}"
        self.submitted_at = time.monotonic() if submitted_at is None else submitted_at
        self.engine_wait_s = engine_wait_s
        self.priority = priority  # vLLM's, lower first (ReplyRequest.priority)
        self.idle_timeout_s = idle_timeout_s or preset.timeout_s or DEFAULT_IDLE_TIMEOUT_S
        self.total_timeout_s = max(TOTAL_TIMEOUT_S, self.idle_timeout_s)
        self.text = ""
        self.progress = ReplyProgress(max_tokens=sampling.max_tokens, started=self.submitted_at)
        self.stats: ReplyStats | None = None
        self.notice: str | None = None  # a plain sentence to show with the reply (timeout, unload)
        self.generating = False  # the engine has taken the request (refusals happen before)
        self._ended_by: Finish | None = None
        self._prompt_tokens = 0
        self._cached_tokens = 0
        self._times: EngineTimes | None = None

    def stop(self) -> None:
        """The reader pressed Stop: abort the engine request; stream() then ends normally."""
        self._end(Finish.STOPPED_BY_USER)

    def disconnected(self) -> None:
        """Nobody reads this reply any more (a closed tab): abort it as such."""
        self._end(Finish.DISCONNECTED)

    def _end(self, finish: Finish, notice: str | None = None) -> None:
        if self._ended_by is None:
            self._ended_by = finish
            self.notice = notice
            self.engine.abort(self.request_id)

    async def stream(self) -> AsyncGenerator[str, None]:
        """Yield new text as it arrives; afterwards `stats` holds the numbers.

        Raises InputError, SettingsError or EngineBusy before anything is generated when the
        conversation, settings or load do not allow it, and EngineError when the engine fails.
        """
        engine = self.engine
        prompt = await engine.render(self.messages)
        self._prompt_tokens = prompt.tokens
        room = engine.max_model_len - prompt.tokens
        if room < 1:
            raise InputError(
                f"Your conversation is {prompt.tokens:,} tokens; this model accepts {engine.max_model_len:,}. "
                "Start a new chat or shorten your message."
            )
        max_tokens = min(self.sampling.max_tokens, room)
        chunks = engine.generate(
            prompt, self.sampling, max_tokens=max_tokens, request_id=self.request_id,
            on_unload=lambda reason: self._end(Finish.UNLOADED, reason), ignore_eos=self.preset.ignore_eos,
            priority=self.priority,
        )
        if self._ended_by is not None:  # stopped while the prompt was being prepared
            self.stats = self._stats(self._ended_by)
            return
        inter_token = metrics.INTER_TOKEN_LATENCY.labels(self.preset.name)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + self.total_timeout_s
        finish, last_arrival = Finish.ERROR, 0.0
        try:
            async with asyncio.timeout(self.idle_timeout_s) as deadline, contextlib.aclosing(chunks):
                async for chunk in chunks:
                    self.generating = True
                    deadline.reschedule(min(loop.time() + self.idle_timeout_s, give_up_at))
                    if chunk.tokens:
                        now = time.monotonic()
                        if self.progress.first_token_at is None:
                            self.progress.first_token_at = now
                        else:
                            inter_token.observe(now - last_arrival)
                        last_arrival = now
                        self.progress.tokens += chunk.tokens
                    if chunk.text:
                        self.text += chunk.text
                        yield chunk.text
                    if chunk.finished:
                        self._cached_tokens, self._times = chunk.cached_tokens, chunk.times
                        finish = self._finish_of(chunk, max_tokens)
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
            finish = self._ended_by or Finish.STOPPED_BY_USER
            raise
        except GeneratorExit:
            finish = Finish.DISCONNECTED
            raise
        except EngineFailed:
            finish = Finish.ENGINE_FAILED
            raise
        finally:
            if self.generating or finish is not Finish.ERROR:
                self.stats = self._stats(finish)

    def _finish_of(self, chunk: Chunk, max_tokens: int) -> Finish:
        reason = chunk.finish_reason
        if reason == "abort":
            return self._ended_by or Finish.STOPPED_BY_USER
        if reason == "length":
            return Finish.MAX_TOKENS if max_tokens == self.sampling.max_tokens else Finish.CONTEXT_FULL
        if reason == "repetition":
            return Finish.REPETITION
        if reason == "stop":
            return Finish.STOP_SEQUENCE if chunk.stop_string else Finish.FINISHED
        return Finish.ERROR

    def _stats(self, finish: Finish) -> ReplyStats:
        progress = self.progress
        times = self._times or EngineTimes(None, None, None)
        return ReplyStats(
            preset=self.preset.name,
            sampling=self.sampling,
            prompt_tokens=self._prompt_tokens,
            cached_prompt_tokens=self._cached_tokens,
            generated_tokens=progress.tokens,
            first_token_s=None if progress.first_token_at is None else progress.first_token_at - self.submitted_at,
            total_s=time.monotonic() - self.submitted_at,
            queue_s=times.queue_s,
            prefill_s=times.prefill_s,
            decode_s=times.decode_s,
            finish=finish,
            context_limit=self.engine.max_model_len,
            engine_wait_s=self.engine_wait_s,
        )


async def paced(
    reply: Reply, interval: Callable[[], float] = lambda: FLUSH_S, tick_s: float = TICK_S
) -> AsyncGenerator[None, None]:
    """Drive `reply.stream()` and yield whenever the reader's view should be redrawn.

    The first text is shown at once; later text is coalesced to one redraw per `interval()` (which
    may grow with the load, so the redraws of all readers together stay within what the server can
    send); with no new text a redraw still comes every `tick_s`. The stream runs in its own task,
    which only flags news per token: the redraw timing is worked out once per redraw, not per token.
    Errors of the stream are raised here; closing this generator aborts the request.
    """
    loop = asyncio.get_running_loop()
    news, ended = asyncio.Event(), asyncio.Event()

    async def pump() -> None:
        try:
            async for _ in reply.stream():
                news.set()
        finally:
            ended.set()

    task = loop.create_task(pump())
    last_redraw, shown_text = 0.0, False
    try:
        while not ended.is_set():
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for swallows a cancel that comes once
            # what it waits for is done, and a Stop (Gradio's /cancel) arriving with a token was lost:
            # the reply ran on to its Max tokens, and the /cancel waited for it (tests/test_load.py).
            if not news.is_set():
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(tick_s):
                        await news.wait()
            if news.is_set() and shown_text and (wait := last_redraw + interval() - loop.time()) > 0:
                with contextlib.suppress(TimeoutError):  # coalesce, unless the reply ends meanwhile
                    async with asyncio.timeout(wait):
                        await ended.wait()
            if ended.is_set():
                break
            shown_text = shown_text or news.is_set()
            news.clear()
            last_redraw = loop.time()
            try:
                yield None
            except GeneratorExit:
                reply.disconnected()
                raise
        await task  # raises what the stream raised
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def paced_reply(
    engine: Engine, preset: Preset, messages: list[Message], sampling: Sampling, interval: Callable[[], float], **options: Any
) -> AsyncGenerator[Reply, None]:
    """Make the reply (`Reply(engine, preset, messages, sampling, **options)`) and yield it at once,
    before anything is asked of the engine (so that it can be stopped, and read whatever happens),
    then again whenever its reader's view should be redrawn (`paced(reply, interval)`). Errors of
    the stream are raised here; closing this generator aborts the request."""
    reply = Reply(engine, preset, messages, sampling, **options)
    yield reply
    async with contextlib.aclosing(paced(reply, interval)) as redraws:
        async for _ in redraws:
            yield reply
