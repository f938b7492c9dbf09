"""The stand-in engine: app.py as it is, with vLLM's engine core replaced by the front-end benchmark's
token source (bench/token_source.py), which writes the scripted replies below, one token every
STAND_IN_STEP_MS milliseconds.

For tests whose subject is not the engine (the page, the protocol, hostile input, votes, layout):
vLLM's own front end still renders the prompt with the model's chat template, counts tokens with the
real tokenizer, detokenizes, applies stop strings and keeps its request metrics and load reports, so
the app under test is the real one; only the model's weights and the engine-core process are gone
(no engine start of ~40 s of CPU, and replies at a known pace instead of the CPU model's ~10 tokens
a second). Every feature also keeps a test on the real engine (docs/testing.md lists them).

    STAND_IN_STEP_MS=15 STAND_IN_START_S=3 python tests/stand_in.py --port 7861   # app.py's flags

On SIGUSR1 it writes how many objects Python's garbage collector tracks (after a full collection,
frozen ones included) as a line of its output, "stand-in heap: N objects" (tests/test_heap.py).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
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



def replies():  # -> tuple[bench.token_source.Reply, ...]; imported lazily (bench imports vLLM's types)
    from bench.token_source import Reply

    return (
        Reply("", ANSWER),
        Reply("Python function", DOCUMENT),
        Reply("single word", "Yes."),
        Reply("long", SENTENCE, endless=True),  # "a (very) long story/poem/list": to Max tokens, to be stopped
    )


def count_objects(*_: object) -> None:
    gc.collect()
    print(f"stand-in heap: {len(gc.get_objects()) + gc.get_freeze_count()} objects", flush=True)


def use_token_source() -> None:
    """The token source in place of vLLM's engine core, in this process, paced by the environment."""
    from bench.token_source import install

    install(step_s=float(os.environ.get("STAND_IN_STEP_MS", STEP_MS)) / 1000, replies=replies(),
            start_s=float(os.environ.get("STAND_IN_START_S", START_S)))


if __name__ == "__main__":
    signal.signal(signal.SIGUSR1, count_objects)
    sys.path.insert(0, str(ROOT))
    use_token_source()
    sys.argv = [str(ROOT / "app.py"), *sys.argv[1:]]
    import app

    app.run()  # as `python app.py` ends: the stop's lines, no teardown
elif __name__ == "__mp_main__":  # a process the app started (a UI worker): as app.py's, on the stand-in too
    sys.path.insert(0, str(ROOT))
    import app

    app.spawned()
    use_token_source()
