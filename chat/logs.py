"""The console: the app's own progress lines, the address to open, and what vLLM and torch say.

vLLM writes about a hundred INFO lines at each engine start, from the engine's child processes
too, the same warning once per weight, and, with torch, a dozen warnings about what a CPU lacks
(Triton, compiled graphs), the embedded model's float16 weights and deprecated names, which read
as trouble to someone who just started the demo and ask nothing of them. By default the console
shows warnings and errors only, each kind of warning once per process (`vllm_logging.json`), less
the known harmless ones (`KNOWN_HARMLESS`); `--verbose` shows everything, as vLLM does by itself.
A warning not on that list always reaches the console. vLLM reads these settings from the
environment when it starts, in every process, so `configure` must run before anything imports vLLM
(loading presets does); a process spawned for the app sets itself up the same way
(`configure_spawned`). Torch's C++ warnings (one at each engine start: "NUMA binding ...") bypass
Python and cannot be told apart: the console leaves them to `--verbose` (TORCH_CPP_LOG_LEVEL).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chat.errors import ChatError

if TYPE_CHECKING:
    from chat.engine import Engine

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
VLLM_CONFIG = Path(__file__).with_name("vllm_logging.json")
# Loggers whose INFO lines are about plumbing (httpx: Gradio's start-up requests; the CPU engine's
# environment), shown with --verbose.
CHATTY = ("httpx", "chat.cpu")
VERBOSE_ENV = "CHAT_VERBOSE"  # --verbose's variable: the processes the app spawns read the app's choice there

# What vLLM and torch say at every start or stop of a CPU engine that asks nothing of the user,
# matched anywhere in the message. Each is shown with --verbose.
KNOWN_HARMLESS = re.compile("|".join((
    # The CPU build turns off what needs a GPU compiler, and says so at each start, in each process.
    r"Triton is (installed, but doesn't include CPU backend|not installed)",
    r"Model Runner V2 requires Triton",
    r"Reset SSM cache type to float32",
    r"Enforce eager set, disabling torch\.compile",  # presets ask for eager mode on a CPU (ENGINEERING.md)
    r"Inductor compilation was disabled by user settings",
    r"OMP_NUM_THREADS=\d+ is set; leaving Torch threads",
    r"lib(tcmalloc|iomp) is not found in LD_PRELOAD",  # speed hints; chat/cpu.py preloads tcmalloc where it is installed
    # The embedded model's weights are stored in float16 and computed in bfloat16 or float32.
    r"Casting torch\.float16 to torch\.bfloat16",
    r"Attempted to load weight \S+ with dtype torch\.float16 into parameter",
    # Torch's deprecated alias, touched by vLLM's scan of torch.distributed's attributes.
    r"`torch\.distributed\.reduce_op` is deprecated",
    # The stop: the CPU worker does not notice its engine core's end by itself (chat/cpu.py).
    r"workers still running after grace period; sending SIGTERM",
)))


def configure(verbose: bool = False) -> None:
    """Set up the app's logging and vLLM's, for this process and the processes it starts."""
    os.environ[VERBOSE_ENV] = "1" if verbose else "0"
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
        # A config file with logging configuration turned off makes vLLM refuse to start.
        if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") != "0":
            os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", str(VLLM_CONFIG))
    root = logging.getLogger()
    if not root.handlers:  # the console, as logging.basicConfig makes it, less the known harmless lines
        console = logging.StreamHandler()
        console.setFormatter(logging.Formatter(FORMAT))
        if not verbose:
            console.addFilter(KnownHarmless())
        root.addHandler(console)
        root.setLevel(logging.INFO if verbose else logging.WARNING)
    logging.getLogger("chat").setLevel(logging.INFO)
    # Python's warnings (torch's FutureWarnings) become log records, which pass the same filter. vLLM
    # logs a few lines while it is imported, before its own configuration applies: these come here too.
    logging.captureWarnings(True)
    for name in (*CHATTY, "vllm"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


def configure_spawned() -> None:
    """`configure`, in a process spawned for the app (a UI worker, an engine core, its worker), as
    the app chose (its choice travels in the environment)."""
    configure(verbose=os.environ.get(VERBOSE_ENV) == "1")


class KnownHarmless(logging.Filter):
    """Keep the known harmless lines (`KNOWN_HARMLESS`) off the console. Errors always pass."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR or not KNOWN_HARMLESS.search(record.getMessage())


class OncePerMessage(logging.Filter):
    """Let each warning through once per process: vLLM repeats some for every weight it loads.
    Errors always pass."""

    def __init__(self) -> None:
        super().__init__()
        self._seen: set[tuple[str, int, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        key = (record.name, record.levelno, str(record.msg))
        if key in self._seen:
            return False
        self._seen.add(key)
        return True


STOPPING = "==> Stopping: ending the replies in progress and closing the engines."


def stopped_line(seconds: float) -> str:
    return f"==> Stopped in {seconds:.1f} s."


def ready_line(preset: str, url: str, share_url: str | None = None) -> str:
    also = f" (or {share_url} from anywhere)" if share_url else ""
    return f"==> {preset} is ready: open {url}{also} in your browser."


async def say_when_ready(engine: Engine, url: Callable[[], str | None], share_url: Callable[[], str | None]) -> None:
    """Print the address again once the first engine is ready: its start scrolled the first one away."""
    from chat.registry import wait_ready  # here: this module is imported first and stays light (prometheus, the engine)

    try:
        await wait_ready(engine)
    except ChatError:
        return  # why it failed is logged where it failed, and the page says it
    print(ready_line(engine.preset.name, url() or "the address above", share_url()), flush=True)
