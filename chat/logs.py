"""The console: the app's own progress lines, vLLM's warnings, and the address to open.

vLLM writes about a hundred INFO lines at each engine start, from the engine's child processes
too, and the same warning once per weight. By default the console shows vLLM's warnings and errors
only, each kind of warning once per process (`vllm_logging.json`); `--verbose` shows everything,
as vLLM does by itself. vLLM reads these settings from the environment when it is first imported,
in every process, so `configure` must run before anything imports vLLM (loading presets does).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from chat.errors import ChatError

if TYPE_CHECKING:
    from chat.engine import Engine

FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
VLLM_CONFIG = Path(__file__).with_name("vllm_logging.json")
# Libraries whose INFO lines are about their own plumbing (httpx: Gradio's start-up requests).
CHATTY = ("httpx",)


def configure(verbose: bool = False) -> None:
    """Set up the app's logging and vLLM's, for this process and the engines it starts."""
    if not verbose:
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
        # A config file with logging configuration turned off makes vLLM refuse to start.
        if os.environ.get("VLLM_CONFIGURE_LOGGING", "1") != "0":
            os.environ.setdefault("VLLM_LOGGING_CONFIG_PATH", str(VLLM_CONFIG))
    logging.basicConfig(level=logging.INFO, format=FORMAT)
    # vLLM logs a few lines while it is imported, before its own configuration applies.
    for name in (*CHATTY, "vllm"):
        logging.getLogger(name).setLevel(logging.INFO if verbose else logging.WARNING)


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
