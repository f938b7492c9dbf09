"""The stand-in engine: app.py as it is, with the engine layer's vLLM half replaced by a schedule that
writes the scripted replies below, one token every STAND_IN_STEP_MS milliseconds, for every running
request at once (the front-end benchmark's, bench/token_source.py `Schedule`: one copy of it).

For tests whose subject is not the engine (the page, the protocol, hostile input, votes, layout).
`StandInEngine` is the app's `Engine` at its boundary: it renders a conversation with the model's own
chat template and counts its tokens with the model's own tokenizer (`tokenizers`, which vLLM uses
too), and streams typed `Chunk`s with the timings, finish reasons and scheduler load the page shows.
Everything above it (the registry, the service, the UI workers and the owner, Gradio, the API) is the
app's own code. What it never does is import vLLM (~10 s of CPU a process) or start an engine (~40 s
of CPU): replies come at a known pace instead of the CPU model's ~10 tokens a second. vLLM's front
end under the same schedule is what the engine tier tests (tests/conftest.py `stand_in_registry`)
and the front-end benchmark use; every feature also keeps a test on the real engine
(docs/testing.md lists them).

    STAND_IN_STEP_MS=15 STAND_IN_START_S=3 python tests/stand_in.py --port 7861   # app.py's flags

On SIGUSR1 it writes how many objects Python's garbage collector tracks (after a full collection,
frozen ones included) as a line of its output, "stand-in heap: N objects" (tests/test_heap.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script (`python tests/stand_in.py`): the app's packages
    sys.path.insert(0, str(ROOT))

from bench.token_source import Emitted, Reply, Schedule  # noqa: E402 - after the path above
from chat.engine import BUSY, FAILED_REPLY, Chunk, Engine, EngineState, EngineTimes, Prompt, memory_need  # noqa: E402
from chat.engine_core import EngineSlot, engine_arguments  # noqa: E402
from chat.errors import EngineBusy, EngineError  # noqa: E402
from chat.models import resolve_model  # noqa: E402
from chat.sampling import Sampling  # noqa: E402

log = logging.getLogger("tests.stand_in")
STEP_MS = 15.0  # ~67 tokens a second, as a reader sees a model on a GPU: many redraws a second (30 ms until 2026-12-06: the suite waited ~40 s longer)
START_S = 3.0  # an engine's start: long enough to be seen ("Starting the engine…"), short enough to wait for

SENTENCE = ("The lighthouse keeper walked down to the shore every morning before the sun came up. He counted "
            "the boats in the harbour and wrote the weather in a small notebook.")  # 33 tokens
# The fallback: an answer that ends on its own ("finished") after ~130 tokens, longer than most tests'
# Max tokens, as the embedded model's replies are.
ANSWER = " ".join([SENTENCE] * 4)

# What a reply may hold while it streams: a list, a table, code, a heading, a quote (tests of the page's
# live rendering read it at every moment). ~220 tokens (under the preset's 256), ~3.3 s at STEP_MS: at 108
# tokens a Compare column streamed for 1.6 s, and a page starved of CPU in a full run drew 4 moments of it.
DOCUMENT = """Here are the steps:

1. The best way is **to plan** and to use `code` here.
2. Second, a list item with *emphasis*.
   - a nested item

| Name | Value |
|------|:-----:|
| a    | 1     |
| b    | 2     |

```python
def add(a, b):
    return a + b
```

Python adds two numbers of any kind with the plus sign, whole numbers and fractions alike.

3. Third, try it out:

```python
print(add(2, 3))
print(add(0.5, 0.25))
```

| Call | Result |
|------|-------:|
| add(2, 3) | 5 |
| add(0.5, 0.25) | 0.75 |

Text
---

> a quote

Done."""



# Failures on demand: a prompt in which FAIL_CUE comes after every reply's cue (the rule that picks a
# reply) is refused by the engine as a request vLLM failed is, and an app started with STAND_IN_FAIL_START set fails its engines' start with it.
FAIL_CUE = "stand-in: fail this reply"


def replies() -> tuple[Reply, ...]:
    return (
        Reply("", ANSWER),
        Reply("Python function", DOCUMENT),
        Reply("single word", "Yes."),
        Reply("long", SENTENCE, endless=True),  # "a (very) long story/poem/list": to Max tokens, to be stopped
    )


def count_objects(*_: object) -> None:
    gc.collect()
    print(f"stand-in heap: {len(gc.get_objects()) + gc.get_freeze_count()} objects", flush=True)


class ModelTokenizer:
    """The model's tokenizer (its tokenizer.json, read by `tokenizers`) and chat template (jinja2, as
    transformers renders one), without vLLM or transformers; what `Schedule` needs of a tokenizer."""

    def __init__(self, folder: Path) -> None:
        from jinja2.sandbox import ImmutableSandboxedEnvironment
        from tokenizers import Tokenizer

        self._tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        config = json.loads((folder / "tokenizer_config.json").read_text())
        template = folder / "chat_template.jinja"
        source = template.read_text() if template.exists() else config["chat_template"]
        self._template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(source)
        self._special_tokens = {name: value for name, value in config.items() if name.endswith("_token") and isinstance(value, str)}
        self.eos_token_id = self._tokenizer.token_to_id(config["eos_token"])
        self.all_special_ids = [i for i, token in self._tokenizer.get_added_tokens_decoder().items() if token.special]

    def render(self, messages: list[dict[str, str]]) -> str:
        return str(self._template.render(messages=messages, add_generation_prompt=True, **self._special_tokens))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return str(self._tokenizer.decode(ids, skip_special_tokens=True))


class StandInCore:
    """What the engine owner hands UI workers slots of: nothing to connect to, and no process to watch
    (each process's StandInEngine keeps a schedule of its own)."""

    def __init__(self, slots: int) -> None:
        self.slots = slots
        self.sentinels: list[int] = []

    def slot(self, index: int) -> EngineSlot:
        return EngineSlot("stand-in", "stand-in", self.slots, index)

    def shutdown(self) -> None:
        pass


@dataclass
class StandInEngine(Engine):
    """The app's Engine, streaming from `Schedule` instead of vLLM: `build`, `render`, `generate` and
    what ends requests and the engine are its own; the rest (state, streams, load, status) is Engine's."""

    schedule: Schedule | None = None
    tokenizer: ModelTokenizer | None = None
    _outputs: dict[str, asyncio.Queue[Emitted | None]] = field(default_factory=dict)  # None: aborted
    _steps: asyncio.Task[None] | None = None

    @property
    def loaded(self) -> bool:
        return self.schedule is not None

    def build(self, make_room: Callable[[Engine], None], shared_slots: int = 0, sockets: Path | None = None) -> None:
        """As Engine.build: find the model, make room for it, then take STAND_IN_START_S to start (a
        core shared by several processes takes it once, in the owner; a client joins at once)."""
        self.phase = "finding the model"
        folder = resolve_model(self.preset, report=self._report)
        self.model_dir = folder
        arguments = engine_arguments(self.preset, folder)
        if failure := os.environ.get("STAND_IN_FAIL_START"):
            raise EngineError(failure)
        if self.slot is not None:
            self.phase = "joining the shared engine"
        else:
            self.memory_need = memory_need(arguments, folder, gpu_share=0.9)  # vLLM's default share
            make_room(self)
            self.phase = "loading the model into vLLM"
            log.info("Starting the engine for preset %r (model %s)", self.preset.name, folder)
            time.sleep(float(os.environ.get("STAND_IN_START_S", START_S)))
            if shared_slots:
                self.core = StandInCore(shared_slots)  # type: ignore[assignment]
        config = json.loads((folder / "config.json").read_text())
        self.max_model_len = int(arguments.get("max_model_len") or config["max_position_embeddings"])
        self.max_num_seqs = int(arguments.get("max_num_seqs") or 256)
        self.tokenizer = ModelTokenizer(folder)
        self.schedule = Schedule(self.tokenizer, self.max_num_seqs, arguments.get("scheduling_policy") == "priority",
                                 float(os.environ.get("STAND_IN_STEP_MS", STEP_MS)) / 1000, replies=replies())
        log.warning("The engine for %r is the stand-in (tests/stand_in.py): scripted replies, a token for every "
                    "running request every %.1f ms, at most %d running", self.preset.name, 1e3 * self.schedule.step_s,
                    self.max_num_seqs)

    def _serving(self) -> tuple[Schedule, ModelTokenizer]:
        if self.schedule is None or self.tokenizer is None:
            raise EngineError(self.error or "The engine is not running; please try again.")
        return self.schedule, self.tokenizer

    async def render(self, messages: list[dict[str, str]]) -> Prompt:
        _, tokenizer = self._serving()
        ids = tokenizer.encode(tokenizer.render(messages))
        return Prompt(ids, ids)

    async def generate(self, prompt: Prompt, sampling: Sampling, *, max_tokens: int, request_id: str,
                       on_unload: Callable[[str], None], ignore_eos: bool = False,
                       priority: int = 0) -> AsyncGenerator[Chunk, None]:
        schedule, tokenizer = self._serving()
        if len(self._streams) >= self.max_num_seqs + self.max_waiting:
            raise EngineBusy(BUSY)
        text = tokenizer.decode(list(prompt.token_ids))
        if text.rfind(FAIL_CUE) > max((text.rfind(reply.cue) for reply in replies() if reply.cue), default=-1):
            raise EngineError(FAILED_REPLY)
        self._streams[request_id] = on_unload
        outputs = self._outputs[request_id] = asyncio.Queue()
        record = schedule.add(request_id, prompt.token_ids, max_tokens, priority, ignore_eos)
        if self._steps is None:
            self._steps = asyncio.get_running_loop().create_task(self._run_steps(schedule), name=f"stand-in {self.key}")
        self.load.on_change()
        ids: list[int] = []
        text, finish = "", None
        try:
            while finish is None:
                # What the loop has not taken yet comes as one chunk, as vLLM's output queue merges it.
                batch = [await outputs.get()]
                while not outputs.empty():
                    batch.append(outputs.get_nowait())
                new = 0
                for emitted in batch:
                    if emitted is None:
                        finish = "abort"
                        break
                    ids.append(emitted.token)
                    new += 1
                    if emitted.finish is not None:
                        finish = emitted.finish
                        break
                whole = tokenizer.decode(ids)
                delta, text = whole[len(text):], whole
                if finish is None:
                    yield Chunk(delta, new)
                    continue
                times = None
                if record.first_token is not None:
                    decode_s = record.last_token - record.first_token if record.last_token and len(ids) > 1 else None
                    times = EngineTimes(max(record.first_token - schedule.step_s - record.added, 0.0), schedule.step_s,
                                        decode_s)
                yield Chunk(delta, new, finished=True, finish_reason=finish, times=times)
        finally:
            self._outputs.pop(request_id, None)
            if finish is None:
                schedule.abort([request_id])
            self._streams.pop(request_id, None)
            self.last_used = time.monotonic()
            self.load.on_change()

    async def _run_steps(self, schedule: Schedule) -> None:
        """Hand each step's tokens to their requests and its load to the engine's, as vLLM's stats do."""
        while True:
            step = await schedule.step()
            for emitted in step.emitted:
                if (outputs := self._outputs.get(emitted.record.id)) is not None:
                    outputs.put_nowait(emitted)
            self.load.updated_at = time.time()
            self.load.running, self.load.waiting = step.running, step.waiting
            self.load.kv_cache_usage = step.running / max(self.max_num_seqs, 1)
            self.load.generated_tokens += len(step.emitted)
            self.load.on_change()

    async def warm_up(self) -> None:
        await self.render([{"role": "user", "content": "Hi"}])

    def abort(self, request_id: str) -> None:
        if (outputs := self._outputs.get(request_id)) is not None and self.schedule is not None:
            self.schedule.abort([request_id])
            outputs.put_nowait(None)

    async def abort_streams(self, reason: str) -> None:
        for end in list(self._streams.values()):
            end(reason)
        for request_id in list(self._outputs):
            self.abort(request_id)

    def num_unfinished(self) -> int:
        return len(self._outputs)

    @property
    def died(self) -> bool:
        return False  # killed engines are the real engine's tests

    async def sleep(self) -> None:
        raise EngineError("The stand-in engine does not sleep.")

    async def wake_up(self) -> None:
        raise EngineError("The stand-in engine does not sleep.")

    def shutdown(self) -> None:
        schedule, self.schedule = self.schedule, None
        self.core, self.state = None, EngineState.CLOSED
        if schedule is not None:
            schedule.close()

    async def close(self) -> None:
        for request_id in list(self._outputs):
            self.abort(request_id)
        steps, self._steps = self._steps, None
        if steps is not None:
            steps.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await steps
        self.shutdown()


def use_stand_in() -> None:
    """The stand-in engine in place of vLLM's, in this process: every engine the registry starts from
    now on, and none of vLLM's imports (the UI workers' server preloads none either)."""
    from chat import presets, registry, supervisor

    registry.EngineRegistry.engine_type = StandInEngine
    presets.check_engine_args = lambda engine: []  # vLLM checks a preset's engine arguments; the stand-in takes any
    supervisor.WORKER_IMPORTS = tuple(name for name in supervisor.WORKER_IMPORTS if not name.startswith("vllm"))


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, count_objects)
    use_stand_in()
    sys.argv = [str(ROOT / "app.py"), *sys.argv[1:]]
    import app

    app.run()  # as `python app.py` ends: the stop's lines, no teardown
elif __name__ == "__mp_main__":  # a process the app started (a UI worker): as app.py's, on the stand-in too
    import app

    app.spawned()
    use_stand_in()
