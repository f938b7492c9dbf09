"""app.py, unchanged, with every call from one module of chat/ into another recorded (bench/message_path.py).

    MESSAGE_PATH_DIR=DIR python bench/traced_app.py --port 7861 ...   # app.py's flags

SIGUSR1 starts a recording (forgetting the one before); SIGUSR2 ends it and writes DIR/calls.json:
each distinct call as [caller module, caller function, callee module, callee function, root], where
the root is the outermost function of chat/ on the caller's stack (for an asyncio task, the task's
own coroutine; for a Gradio event, its handler). A coroutine or async generator counts as called
each time another module resumes it (an `await` or `async for` reaching into it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CHAT = str(ROOT / "chat") + os.sep

calls: set[tuple[str, str, str, str, str]] = set()
recording = False


def module_of(filename: str) -> str:
    return filename[len(CHAT):].removesuffix(".py").replace(os.sep, "/")


def root_of(frame: FrameType) -> str:
    outermost = frame
    while frame.f_back is not None and frame.f_back.f_code.co_filename.startswith(CHAT):
        frame = outermost = frame.f_back
    return f"{module_of(outermost.f_code.co_filename)}.{outermost.f_code.co_qualname}"


def on_call(frame: FrameType, event: str, arg: Any) -> None:
    if not recording or event != "call":
        return
    callee = frame.f_code.co_filename
    caller = frame.f_back
    if caller is None or not callee.startswith(CHAT):
        return
    source = caller.f_code.co_filename
    if source == callee or not source.startswith(CHAT):
        return
    calls.add((module_of(source), caller.f_code.co_qualname, module_of(callee), frame.f_code.co_qualname,
               root_of(caller)))


def start(signum: int, frame: object) -> None:
    global recording
    calls.clear()
    recording = True


def stop(signum: int, frame: object) -> None:
    global recording
    recording = False
    out = Path(os.environ["MESSAGE_PATH_DIR"]) / "calls.json"
    out.write_text(json.dumps(sorted(calls)))


if __name__ == "__main__":  # the CPU engine spawns processes that re-import this file
    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    sys.setprofile(on_call)
    threading.setprofile(on_call)  # the server's thread, and to_thread's, start later
    sys.path.insert(0, str(ROOT))
    sys.argv = [str(ROOT / "app.py"), *sys.argv[1:]]
    import app

    sys.exit(app.main())
