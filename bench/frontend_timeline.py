"""The app's own moments for bench/frontend_rates.py's timeline of each page reply, and its event loop's stalls.

    BENCH_TIMELINE_LOG=timeline.jsonl python bench/frontend_app.py ...   # frontend_app.py calls install()

Installed in the app's process before app.py is imported, below chat/ (Starlette's WebSocket), so
that it keeps working whoever rewrites how a page's reply is started. One JSON line per moment, on
the machine's monotonic clock (the client's and the token source's too):

  {"k": "begin", "id": ..., "t": ...}   a page's `begin` reached the app (its socket's receive returned it)
  {"k": "delta", "id": ..., "t": ...}   the app sent that reply's first text on a socket
  {"k": "stall", "t": ..., "ms": ..., "cpu_ms": ..., "loop_cpu_ms": ...}
                                        the event loop woke `ms` late from a short sleep started at t
                                        (> STALL_MS), meanwhile the process used cpu_ms of CPU and the
                                        loop's own thread loop_cpu_ms: a handler on the loop (loop_cpu
                                        near ms), another thread holding the interpreter (cpu near ms,
                                        loop_cpu small), or the process not running (both small)
  {"k": "gc", "t": ..., "ms": ..., "gen": ..., "objects": ...}   a garbage collection of generation gen over
                                        GC_MS; after a full one, the objects it may walk next time

The token source logs the rest (request handed to the engine core, first token out of it).
"""

from __future__ import annotations

import asyncio
import gc
import json
import re
import time
from pathlib import Path
from typing import Any

TICK_S = 0.005  # the stall watcher's sleep
STALL_MS = 20.0  # a wake-up later than this is logged
GC_MS = 5.0  # a garbage collection longer than this is logged
ID = re.compile(r'"id": ?"([^"]+)"')


class Recorder:
    def __init__(self, path: Path) -> None:
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 - for the process's life
        self.sent: set[str] = set()
        self.watching = False
        self._gc_at = 0.0

    def write(self, **fields: Any) -> None:
        self.out.write(json.dumps(fields) + "\n")

    def received(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        if text and '"begin"' in text[:200]:
            with_id = ID.search(text)
            self.write(k="begin", id=with_id.group(1) if with_id else None, t=time.monotonic())
        if not self.watching:  # the first socket message runs in the server's loop: watch it from now on
            self.watching = True
            asyncio.get_running_loop().create_task(self.watch())

    def sending(self, text: str) -> None:
        head = text[:160]
        if '"delta"' in head and (with_id := ID.search(head)) and with_id.group(1) not in self.sent:
            self.sent.add(with_id.group(1))
            self.write(k="delta", id=with_id.group(1), t=time.monotonic())

    async def watch(self) -> None:
        while True:
            t, cpu, loop_cpu = time.monotonic(), time.process_time(), time.thread_time()
            await asyncio.sleep(TICK_S)
            late = (time.monotonic() - t - TICK_S) * 1e3
            if late > STALL_MS:
                self.write(k="stall", t=t, ms=round(late, 1), cpu_ms=round((time.process_time() - cpu) * 1e3, 1),
                           loop_cpu_ms=round((time.thread_time() - loop_cpu) * 1e3, 1))

    def collected(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._gc_at = time.monotonic()
        elif (took := (time.monotonic() - self._gc_at) * 1e3) > GC_MS:
            full = info.get("generation") == 2  # then also what the next full collection will walk (not what is frozen)
            self.write(k="gc", t=self._gc_at, ms=round(took, 1), gen=info.get("generation"),
                       **({"objects": len(gc.get_objects())} if full else {}))


def install(path: Path) -> Recorder:
    from starlette.websockets import WebSocket

    recorder = Recorder(path)
    gc.callbacks.append(recorder.collected)
    receive, send_text = WebSocket.receive, WebSocket.send_text

    async def receive_recorded(self: WebSocket) -> Any:
        message = await receive(self)
        recorder.received(message)
        return message

    async def send_text_recorded(self: WebSocket, data: str) -> None:
        recorder.sending(data)
        await send_text(self, data)

    WebSocket.receive = receive_recorded  # type: ignore[method-assign]
    WebSocket.send_text = send_text_recorded  # type: ignore[method-assign]
    return recorder
