"""Path 1, the ceiling: vLLM's AsyncLLM driven directly, in a process of its own.

The engine is built from a preset file exactly as the app builds it (same model folder, same
engine arguments), prompts are rendered through the app's own `render_prompt` before the clock
starts, and each request runs `AsyncLLM.generate` with the app's SamplingParams (DELTA output).
Timestamps are taken in this process as each delta arrives, so no HTTP or UI sits in between.

Driven by bench/run.py over stdin/stdout, one JSON object per line; replies are prefixed with
`@@bench ` so the engine's own log lines on stdout are ignored:
    {"op": "run", "concurrency": 8, "requests": 16, "first_index": 0, "max_tokens": 64}
    {"op": "rate", "rate": 4.0, "requests": 60, "first_index": 0, "max_tokens": 64}
    (optional in both: "context_lines", the message's filler lines; "turns", the conversation's turns
    with the new message: bench.common.chat_messages)
    {"op": "quit"}

With --warm-up the engine first runs the app's start-time warm-up (chat.engine.warm_up_requests: up
to 256 requests at once, the batch shrinking to 1) before it says ready, as the app's engine does on a GPU.

    python -m bench.raw_engine --preset bench/presets/smollm2-135m-cpu-bench.yaml   # then type ops
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench.common import REPETITION_PENALTY, TEMPERATURE, TOP_K, TOP_P, Timeline, chat_messages  # noqa: E402

PREFIX = "@@bench "


def say(obj: dict[str, Any]) -> None:
    sys.stdout.write(PREFIX + json.dumps(obj) + "\n")
    sys.stdout.flush()


def build(preset_path: Path) -> tuple[Any, Any]:
    """The preset's engine, started the way chat/engine.py starts it (blocking)."""
    from vllm import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from chat.engine_core import engine_arguments
    from chat.models import resolve_model
    from chat.presets import load_preset

    preset = load_preset(preset_path)
    folder = resolve_model(preset, report=lambda line: print(line, file=sys.stderr))
    engine_args = engine_arguments(preset, folder)
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=str(folder), **engine_args))
    return preset, llm


async def one(llm: Any, prompt: Any, params: Any) -> Timeline:
    timeline = Timeline(started=time.monotonic())
    try:
        async for out in llm.generate(prompt, params, f"raw-{uuid.uuid4().hex}"):
            completion = out.outputs[0]
            n = len(completion.token_ids)
            if n:
                timeline.arrivals.append((time.monotonic(), n))
                timeline.tokens += n
    except Exception as exc:  # noqa: BLE001 - reported to the driver, which counts errors
        timeline.error = repr(exc)
    return timeline


def bench_sampling(max_tokens: int) -> Any:
    """The benchmark's sampling values (bench.common's, as the app's clients send them)."""
    from chat.sampling import Sampling

    return Sampling(temperature=TEMPERATURE, top_p=TOP_P, top_k=TOP_K, max_tokens=max_tokens,
                    repetition_penalty=REPETITION_PENALTY, seed=-1)


def sampling(max_tokens: int) -> Any:
    from chat.engine import sampling_params

    return sampling_params(bench_sampling(max_tokens), max_tokens=max_tokens, ignore_eos=True)


async def render(llm: Any, messages: list[dict[str, str]]) -> Any:
    """`messages` through the chat template, as the app's Engine.render does."""
    from chat.engine import Engine

    shim = cast(Engine, SimpleNamespace(llm=llm, _running=lambda: llm, _streams={}))  # rendering needs only these
    return (await Engine.render(shim, messages)).rendered


async def prompts(llm: Any, op: dict[str, Any]) -> list[Any]:
    first, lines, turns = op.get("first_index", 0), op.get("context_lines", 0), op.get("turns", 1)
    return [await render(llm, chat_messages(first + i, lines, turns)) for i in range(op["requests"])]


async def warm_up(llm: Any) -> None:
    """The app's start-time warm-up on this engine: the same requests, with the benchmark's sampling."""
    from chat.engine import WARM_UP_BATCH, warm_up_requests

    count = min(llm.vllm_config.scheduler_config.max_num_seqs, WARM_UP_BATCH)
    t0 = time.monotonic()
    prompt = await render(llm, [{"role": "user", "content": "Hi"}])
    await warm_up_requests(llm, prompt, bench_sampling(count), count, "raw-warm-up")
    print(f"warm-up: {count} requests in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)


async def closed_loop(llm: Any, op: dict[str, Any]) -> list[Timeline]:
    """`concurrency` workers, each sending its next request when its last one ends."""
    rendered = await prompts(llm, op)
    params = sampling(op["max_tokens"])
    queue = list(enumerate(rendered))
    results: list[Timeline | None] = [None] * len(rendered)

    async def worker() -> None:
        while queue:
            i, prompt = queue.pop(0)
            results[i] = await one(llm, prompt, params)

    await asyncio.gather(*(worker() for _ in range(op["concurrency"])))
    return [r for r in results if r is not None]


async def open_loop(llm: Any, op: dict[str, Any]) -> list[Timeline]:
    """Requests sent at a steady rate (one every 1/rate seconds) whatever the engine's state."""
    rendered = await prompts(llm, op)
    params = sampling(op["max_tokens"])
    start = time.monotonic()
    tasks = []
    for i, prompt in enumerate(rendered):
        await asyncio.sleep(max(0.0, start + i / op["rate"] - time.monotonic()))
        tasks.append(asyncio.create_task(one(llm, prompt, params)))
    return list(await asyncio.gather(*tasks))


async def serve(llm: Any, warm: bool = False) -> None:
    """`warm`: the app's warm-up first, on this loop (the engine binds to the first loop that awaits it)."""
    if warm:
        await warm_up(llm)
    loop = asyncio.get_running_loop()
    say({"ready": True, "pid": os.getpid()})
    while True:
        line = await loop.run_in_executor(None, sys.stdin.readline)
        if not line:
            return
        op = json.loads(line)
        if op["op"] == "quit":
            return
        timelines = await (open_loop(llm, op) if op["op"] == "rate" else closed_loop(llm, op))
        say({"timelines": [t.__dict__ for t in timelines]})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", type=Path, required=True, help="preset YAML file to build the engine from")
    ap.add_argument("--warm-up", action="store_true",
                    help="before saying ready, the app's start-time warm-up (chat.engine.warm_up_requests)")
    args = ap.parse_args()
    _, llm = build(args.preset)
    try:
        asyncio.run(serve(llm, args.warm_up))
    finally:
        llm.shutdown()


if __name__ == "__main__":
    main()
