"""The front-end benchmark's token source (bench/token_source.py): vLLM's AsyncLLM in front of it
streams what a GPU engine would, in the shapes the app reads. In process, no app, a few seconds."""

from __future__ import annotations

import asyncio
import gc
import json

import pytest

from bench.token_source import NotSimulated, Reply, install, uninstall

pytestmark = pytest.mark.engine  # each test starts a real AsyncLLM (a token source in front of it)

STEP_S = 0.02
# Scripted replies, as the tests' stand-in engine has them (tests/stand_in.py).
REPLIES = (Reply("", "Fine, thanks."), Reply("poem", "Roses are red."), Reply("table", "| a | b |"))


class Recorder:
    """A stat logger like the app's: what vLLM hands it every engine step."""

    steps: list[tuple[int, int]] = []

    def __init__(self, vllm_config, engine_index=0):
        pass

    def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx=0):
        if scheduler_stats is not None:
            Recorder.steps.append((scheduler_stats.num_running_reqs, scheduler_stats.num_waiting_reqs))

    def log_engine_initialized(self):
        pass


@pytest.fixture(scope="module")
async def llm(tmp_path_factory):
    """One AsyncLLM on the token source for the module's tests (each start is ~1 s of CPU more)."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from chat.embedded import model_dir

    log_path = tmp_path_factory.mktemp("token_source") / "source.jsonl"
    sources = install(step_s=STEP_S, log_path=log_path, replies=REPLIES)
    try:
        # No Prometheus logger: it would replace the vllm:* metrics of the tests' real engine.
        args = AsyncEngineArgs(model=str(model_dir()), max_model_len=4096, max_num_seqs=4, enforce_eager=True,
                               kv_cache_memory_bytes=1 << 30, disable_log_stats=True)
        engine = AsyncLLM.from_engine_args(args, stat_loggers=[Recorder])
    finally:
        uninstall()  # only this engine streams from the token source
    engine.bench_source, engine.bench_log = sources[0], log_path
    yield engine
    engine.shutdown()
    del engine, sources
    await asyncio.sleep(0)  # the output handler's cancellation runs
    gc.collect()  # now, not at interpreter exit, where AsyncLLM.__del__ would fail noisily


async def prompt(engine, text="Tell me about lighthouses."):
    from vllm.renderers.params import ChatParams, TokenizeParams

    _, prompts = await engine.renderer.render_chat_async(
        [[{"role": "user", "content": text}]],
        ChatParams(chat_template_kwargs={"add_generation_prompt": True, "tokenize": False}),
        TokenizeParams(max_total_tokens=None, add_special_tokens=False),
    )
    return prompts[0]


def params(max_tokens, ignore_eos=True):
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=max_tokens, output_kind=RequestOutputKind.DELTA, ignore_eos=ignore_eos)


async def written(llm, text, max_tokens, ignore_eos=False):
    """The reply's text and how it ended."""
    outputs = [out async for out in llm.generate(await prompt(llm, text), params(max_tokens, ignore_eos), text)]
    return "".join(out.outputs[0].text for out in outputs), outputs[-1].outputs[0].finish_reason


async def test_a_scripted_reply_is_written_whole_then_ends_by_itself(llm):
    assert await written(llm, "How are you?", 100) == ("Fine, thanks.", "stop")  # the catch-all
    assert await written(llm, "A poem, please.", 100) == ("Roses are red.", "stop")
    assert await written(llm, "A poem, please. No: a table.", 100) == ("| a | b |", "stop")  # the latest cue
    text, finish = await written(llm, "A poem, please.", 3)
    assert finish == "length" and "Roses are red.".startswith(text) and text != "Roses are red."
    text, finish = await written(llm, "A poem, please.", 12, ignore_eos=True)
    assert finish == "length" and text.startswith("Roses are red.Roses")  # no end of sequence: again


async def test_replies_stream_as_request_outputs_one_token_per_step(llm):
    from vllm.outputs import CompletionOutput, RequestOutput

    Recorder.steps.clear()
    outputs = [out async for out in llm.generate(await prompt(llm), params(12), "r-1")]
    assert all(isinstance(out, RequestOutput) and isinstance(out.outputs[0], CompletionOutput) for out in outputs)
    assert sum(len(out.outputs[0].token_ids) for out in outputs) == 12
    assert "".join(out.outputs[0].text for out in outputs).strip()  # real tokens, detokenized
    last = outputs[-1]
    assert last.finished and last.outputs[0].finish_reason == "length" and last.num_cached_tokens == 0
    times = last.metrics
    assert times.num_generation_tokens == 12
    assert times.queued_ts <= times.scheduled_ts < times.first_token_ts < times.last_token_ts
    assert times.last_token_ts - times.first_token_ts == pytest.approx(11 * STEP_S, rel=0.01)
    assert llm.output_processor.get_num_unfinished_requests() == 0 and not llm.errored
    assert Recorder.steps and max(running for running, _ in Recorder.steps) == 1


async def test_at_most_max_num_seqs_run_and_the_rest_wait(llm):
    Recorder.steps.clear()
    rendered = await prompt(llm)

    async def one(i):
        return [out async for out in llm.generate(rendered, params(5), f"batch-{i}")]

    replies = await asyncio.gather(*(one(i) for i in range(6)))
    assert all(sum(len(o.outputs[0].token_ids) for o in reply) == 5 for reply in replies)
    assert max(running for running, _ in Recorder.steps) == 4  # max_num_seqs
    assert any(waiting for _, waiting in Recorder.steps)


async def test_an_aborted_request_ends_and_is_logged(llm):
    stream = llm.generate(await prompt(llm), params(1000), "to-abort")
    first = await anext(stream)
    assert not first.finished
    await llm.abort("to-abort")
    rest = [out async for out in stream]
    assert rest[-1].outputs[0].finish_reason == "abort"
    await asyncio.sleep(2 * STEP_S)
    records = [json.loads(line) for line in llm.bench_log.read_text().splitlines()]
    aborted = next(r for r in records if r["id"].startswith("to-abort"))
    assert aborted["finish"] == "abort" and 1 <= aborted["tokens"] < 1000
    assert not llm.bench_source.schedule._running


async def test_what_it_does_not_simulate_fails_loudly(llm, caplog):
    with pytest.raises(NotSimulated, match="sleep_async"):
        await llm.sleep(1)
    assert "does not simulate" in caplog.text
