"""The stand-in engine (tests/stand_in.py `StandInEngine`), which the apps of the tests whose subject is
not the engine run on, against vLLM's own front end on the same schedule (`stand_in_registry`'s
engine): the same prompt tokens, the same scripted text and ends, and failures on demand."""

from __future__ import annotations

import os

import pytest

from chat.engine import FAILED_REPLY, Chunk, Engine, EngineState
from chat.errors import EngineError
from chat.registry import EngineRegistry
from tests.stand_in import FAIL_CUE, SENTENCE, StandInEngine
from tests.stand_in_fixtures import engine, registry, service  # noqa: F401 - vLLM's AsyncLLM on the stand-in's schedule

CONVERSATION = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "Café ☕ at 8:00? «Oui» — 東京 too.\n\nTwo lines, `code` and **bold**."},
    {"role": "assistant", "content": "Yes."},
    {"role": "user", "content": "Give me a single word. " * 40},
]


@pytest.fixture(scope="module")
async def stand_in(default_preset):
    registry = EngineRegistry()
    registry.engine_type = StandInEngine
    saved = os.environ.get("STAND_IN_START_S")
    os.environ["STAND_IN_START_S"] = "0"
    try:
        stand_in = await registry.get(default_preset)
    finally:
        os.environ.pop("STAND_IN_START_S") if saved is None else os.environ.update(STAND_IN_START_S=saved)
    assert isinstance(stand_in, StandInEngine)
    yield stand_in
    await registry.close_all()


async def written(engine: Engine, default_preset, text: str, max_tokens: int, request_id: str) -> list[Chunk]:
    prompt = await engine.render([{"role": "user", "content": text}])
    stream = engine.generate(prompt, default_preset.sampling.defaults, max_tokens=max_tokens, request_id=request_id,
                             on_unload=lambda reason: None)
    return [chunk async for chunk in stream]


async def test_it_renders_and_counts_a_conversation_as_vllm_does(stand_in, engine):
    for messages in (CONVERSATION, CONVERSATION[:2], [{"role": "user", "content": "Hi"}]):
        assert list((await stand_in.render(messages)).token_ids) == list((await engine.render(messages)).token_ids)
    assert (stand_in.max_model_len, stand_in.max_num_seqs) == (engine.max_model_len, engine.max_num_seqs)


@pytest.mark.parametrize(("text", "max_tokens", "finish"), [
    ("Answer in a single word.", 64, "stop"),  # its script ("Yes."), then the end of sequence
    ("Hello there.", 12, "length"),  # the catch-all answer, cut at Max tokens
    ("Tell me a long story.", 40, "length"),  # the endless one
])
async def test_it_writes_the_replies_vllm_writes_on_the_same_schedule(stand_in, engine, default_preset, text,
                                                                        max_tokens, finish):
    ours = await written(stand_in, default_preset, text, max_tokens, f"stand-in-{finish}-{max_tokens}")
    theirs = await written(engine, default_preset, text, max_tokens, f"vllm-{finish}-{max_tokens}")
    assert "".join(c.text for c in ours) == "".join(c.text for c in theirs)
    assert sum(c.tokens for c in ours) == sum(c.tokens for c in theirs)
    assert [c.finished for c in ours] == [False] * (len(ours) - 1) + [True]
    last = ours[-1]
    assert (last.finish_reason, theirs[-1].finish_reason) == (finish, finish)
    assert last.times is not None and last.times.prefill_s is not None and last.times.queue_s is not None
    if text.startswith("Answer"):
        assert "".join(c.text for c in ours) == "Yes."
    if text.startswith("Tell"):
        assert "".join(c.text for c in ours).startswith(SENTENCE)
    assert stand_in.num_unfinished() == 0 and stand_in.streams == 0


async def test_an_abort_ends_the_reply_as_aborted(stand_in, default_preset):
    prompt = await stand_in.render([{"role": "user", "content": "Tell me a long story."}])
    stream = stand_in.generate(prompt, default_preset.sampling.defaults, max_tokens=500, request_id="to-abort",
                               on_unload=lambda reason: None)
    first = await anext(stream)
    assert first.text and not first.finished and stand_in.is_streaming("to-abort")
    stand_in.abort("to-abort")
    rest = [chunk async for chunk in stream]
    assert rest[-1].finished and rest[-1].finish_reason == "abort"
    assert stand_in.num_unfinished() == 0 and not stand_in.is_streaming("to-abort")


async def test_it_fails_a_reply_or_a_start_on_demand(stand_in, default_preset):
    with pytest.raises(EngineError) as failed:
        await written(stand_in, default_preset, f"Please {FAIL_CUE}.", 8, "to-fail")
    assert failed.value.message == FAILED_REPLY
    # A later cue wins, as for the replies: the conversation goes on.
    assert "".join(c.text for c in await written(stand_in, default_preset, f"{FAIL_CUE}, or a single word", 8, "after")) == "Yes."

    registry = EngineRegistry()
    registry.engine_type = StandInEngine
    os.environ["STAND_IN_FAIL_START"] = "The stand-in was asked to fail its start."
    try:
        failing = registry.start(default_preset)
        assert failing.task is not None
        await failing.task
        assert failing.state is EngineState.FAILED and failing.error == "The stand-in was asked to fail its start."
    finally:
        del os.environ["STAND_IN_FAIL_START"]
        await registry.close_all()
