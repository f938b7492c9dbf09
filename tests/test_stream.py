"""The reply stream on the real engine (embedded SmolLM2 on vLLM's CPU build)."""

from __future__ import annotations

import asyncio
import contextlib
import re

import pytest

from chat.errors import InputError, SettingsError
from chat.history import to_model_messages
from chat.stats import REPLIED, Finish
from chat.stream import Reply, paced


def reply_to(engine, preset, text, history=(), **sampling):
    values = {"temperature": 0.0, "seed": 1, **sampling}
    messages = to_model_messages(list(history), text, preset.system_prompt)
    return Reply(engine, preset, messages, preset.sampling.resolve(values))


async def engine_idle(engine, within_s=5.0) -> bool:
    """True once the engine runs nothing and its front end tracks nothing."""
    deadline = asyncio.get_running_loop().time() + within_s
    while asyncio.get_running_loop().time() < deadline:
        if engine.load.running == 0 and engine.load.waiting == 0 and engine.num_unfinished() == 0 and engine.streams == 0:
            return True
        await asyncio.sleep(0.05)
    return False


async def test_a_reply_arrives_in_many_separate_deltas(engine, default_preset):
    reply = reply_to(engine, default_preset, "Write a short poem about rivers.", max_tokens=40)
    deltas = [delta async for delta in reply.stream()]
    assert len(deltas) >= 10
    assert "".join(deltas) == reply.text and reply.text.strip()


async def test_stats_are_consistent_with_what_was_streamed(engine, default_preset):
    reply = reply_to(engine, default_preset, "Count from one to fifty in words.", max_tokens=24)
    async for _ in reply.stream():
        pass
    stats = reply.stats
    assert stats.finish is Finish.MAX_TOKENS
    assert stats.generated_tokens == 24
    assert 0 < stats.first_token_s <= stats.total_s
    assert stats.decode_s is not None and stats.decode_s <= stats.total_s
    assert stats.queue_s is not None and stats.queue_s >= 0
    assert stats.tokens_per_s > 0
    rendered = await engine.render(reply.messages)
    assert stats.prompt_tokens == rendered.tokens
    assert stats.context_limit == 2048 and stats.preset == default_preset.name
    assert stats.sampling.max_tokens == 24 and stats.sampling.temperature == 0.0
    assert "reached the Max tokens limit" in stats.summary()


async def test_a_reply_that_ends_by_itself_says_finished(engine, default_preset):
    reply = reply_to(engine, default_preset, "Reply with the single word: yes", max_tokens=200)
    async for _ in reply.stream():
        pass
    assert reply.stats.finish is Finish.FINISHED
    assert reply.stats.generated_tokens < 200


async def test_the_same_prompt_twice_hits_the_prefix_cache(engine, default_preset):
    question = "Describe the colour blue to someone who has never seen it. " * 20  # CPU cache blocks are 128 tokens
    for _ in range(2):
        reply = reply_to(engine, default_preset, question, max_tokens=2)
        async for _ in reply.stream():
            pass
    assert reply.stats.cached_prompt_tokens > 0
    assert reply.stats.cached_prompt_tokens <= reply.stats.prompt_tokens


async def test_stop_ends_the_reply_as_stopped_by_you_and_frees_the_engine(engine, default_preset):
    reply = reply_to(engine, default_preset, "Tell me a very long story about dragons.", max_tokens=500, temperature=0.7)
    received = 0
    async for _ in reply.stream():
        received += 1
        if received == 3:
            reply.stop()
    assert reply.stats.finish is Finish.STOPPED_BY_USER
    assert 3 <= reply.stats.generated_tokens < 500
    assert await engine_idle(engine)


async def test_stop_pressed_before_the_prompt_is_ready_is_not_lost(engine, default_preset):
    reply = reply_to(engine, default_preset, "Tell me a very long story about kites.", max_tokens=500)
    reply.stop()
    deltas = [delta async for delta in reply.stream()]
    assert deltas == [] and reply.stats.finish is Finish.STOPPED_BY_USER and reply.stats.generated_tokens == 0
    assert await engine_idle(engine)


async def test_closing_the_stream_like_a_closed_tab_aborts_the_request(engine, default_preset):
    reply = reply_to(engine, default_preset, "Tell me a very long story about ships.", max_tokens=500, temperature=0.7)
    async with contextlib.aclosing(reply.stream()) as deltas:
        async for _ in deltas:
            assert engine.load.running == 1 or engine.num_unfinished() == 1
            break
    assert reply.stats.finish is Finish.DISCONNECTED
    assert await engine_idle(engine)


async def test_cancelling_the_task_like_gradio_stop_aborts_the_request(engine, default_preset):
    reply = reply_to(engine, default_preset, "Tell me a very long story about trains.", max_tokens=500, temperature=0.7)
    started = asyncio.Event()

    async def consume():
        async for _ in reply.stream():
            started.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(started.wait(), 30)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert reply.stats.finish is Finish.STOPPED_BY_USER
    assert await engine_idle(engine)


async def test_two_replies_stream_at_the_same_time_on_one_engine(engine, default_preset):
    replies = [reply_to(engine, default_preset, f"List {n} animals.", max_tokens=30) for n in (5, 7)]
    seen: list[tuple[int, float]] = []

    async def consume(index, reply):
        async for _ in reply.stream():
            seen.append((index, asyncio.get_running_loop().time()))

    await asyncio.gather(*(consume(i, r) for i, r in enumerate(replies)))
    first_a, last_a = min(t for i, t in seen if i == 0), max(t for i, t in seen if i == 0)
    first_b, last_b = min(t for i, t in seen if i == 1), max(t for i, t in seen if i == 1)
    assert first_b < last_a and first_a < last_b  # the streams overlapped in time
    assert all(r.stats.generated_tokens == 30 for r in replies)


async def test_a_conversation_longer_than_the_context_says_so_with_numbers(engine, default_preset):
    reply = reply_to(engine, default_preset, "hello " * 3000)
    with pytest.raises(InputError) as caught:
        async for _ in reply.stream():
            pass
    match = re.fullmatch(
        r"Your conversation is ([\d,]+) tokens; this model accepts 2,048\. Start a new chat or shorten your message\.",
        caught.value.message,
    )
    assert match and int(match.group(1).replace(",", "")) > 3000
    assert await engine_idle(engine)


async def test_stats_of_an_earlier_reply_are_not_in_the_next_prompt(engine, default_preset):
    first = reply_to(engine, default_preset, "Name a fruit.", max_tokens=8)
    async for _ in first.stream():
        pass
    history = [
        {"role": "user", "content": [{"type": "text", "text": "Name a fruit."}]},
        {"role": "assistant", "content": [{"type": "text", "text": first.text}], "metadata": {}},
        {"role": "assistant", "content": first.stats.details(), "metadata": {"title": "📊 " + first.stats.summary()}},
    ]
    second = reply_to(engine, default_preset, "Another one?", history=history, max_tokens=4)
    prompt = (await engine.render(second.messages)).rendered["prompt"]
    assert first.text.strip() in prompt
    assert REPLIED not in prompt and "a second" not in prompt and "Preset" not in prompt and "📊" not in prompt


async def test_invalid_sampling_values_give_the_plain_sentence(default_preset):
    with pytest.raises(SettingsError) as caught:
        default_preset.sampling.resolve({"temperature": 7})
    assert caught.value.message == "Temperature must be a number from 0 to 2; it was 7."


async def test_paced_redraws_show_the_first_token_at_once_and_coalesce_the_rest(stand_in_registry, default_preset):
    # The subject is the pacing, not the engine: on the stand-in engine (tests/stand_in.py).
    engine = await stand_in_registry.get(default_preset)
    reply = reply_to(engine, default_preset, "Write a long list of colours.", max_tokens=60)
    redraw_tokens, redraw_times = [], []
    async for _ in paced(reply, lambda: 0.25, tick_s=5.0):
        redraw_tokens.append(reply.progress.tokens)
        redraw_times.append(asyncio.get_running_loop().time())
    assert redraw_tokens[0] <= 2  # the first token is drawn at once, not after the interval
    gaps = [b - a for a, b in zip(redraw_times, redraw_times[1:], strict=False)]
    assert min(gaps) >= 0.24, gaps  # later text waits for the interval: one redraw per 0.25 s at most
    assert reply.stats.generated_tokens == 60


class TokenOnCue:
    """A reply for `paced` with no engine: its stream writes one token (or ends) when told to, and
    says whether it was cancelled (as Gradio's Stop reaches the real one's)."""

    def __init__(self) -> None:
        self.cue: asyncio.Queue[str] = asyncio.Queue()
        self.cancelled = False

    async def stream(self):
        try:
            while await self.cue.get() == "token":
                yield "x"
        except asyncio.CancelledError:
            self.cancelled = True
            raise

    def disconnected(self) -> None:
        pass


async def cancel_with_news(cue: str, steps: int) -> bool | None:
    """Cancel a reader of `paced` `steps` turns of the event loop after its stream has news (`cue`:
    a token, or its end while the reader waits out the redraw interval): whether the task ended
    cancelled, or None when the cancel came after the reader had ended by itself."""
    loop = asyncio.get_running_loop()
    reply, drawn, cancelled = TokenOnCue(), asyncio.Event(), loop.create_future()

    async def read() -> None:
        async for _ in paced(reply, lambda: 0.0 if cue == "token" else 60.0, tick_s=60.0):
            drawn.set()

    task = asyncio.create_task(read())
    reply.cue.put_nowait("token")
    await asyncio.wait_for(drawn.wait(), 5)  # the first redraw: `paced` waits for news now
    if cue == "end":
        reply.cue.put_nowait("token")  # news: `paced` waits out the interval, unless the reply ends
        for _ in range(8):
            await asyncio.sleep(0)

    def cancel_after(left: int) -> None:
        if left:
            loop.call_soon(cancel_after, left - 1)
        else:
            cancelled.set_result(task.cancel())  # False once the reader has ended

    reply.cue.put_nowait(cue)
    cancel_after(steps)
    if not await cancelled:
        return None
    await asyncio.wait({task}, timeout=5)
    return task.done() and task.cancelled() and (reply.cancelled or cue == "end")


@pytest.mark.parametrize("cue", ["token", "end"])
async def test_a_cancel_that_comes_with_the_news_is_not_lost(cue):
    # Gradio's /cancel cancels the turn's task whenever it comes, also just as the stream has news
    # for the reader (a token, its end): a cancel the task took must end it cancelled, whichever step
    # of the event loop it lands on. Python 3.11's asyncio.wait_for swallowed a cancel that came once
    # what it waited for was done, and an abandoned reply ran on to its Max tokens (tests/test_load.py).
    outcomes = [await cancel_with_news(cue, steps) for steps in range(8)]
    assert outcomes.count(True) >= 2 and False not in outcomes, outcomes
