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
  {"k": "heap", "t": ..., "objects": ..., "new": {type: count}, "chains": [...], "holders": [...]}
                                        on SIGUSR1 (a census): after a full collection, every object
                                        alive (frozen or not), the types of those that were not at the
                                        last census, for the commonest a chain of referrers up to an
                                        object that was, and the older objects that hold the most new
                                        ones (how many each reaches, and its own chain): send it once
                                        visitors have come and gone, then again after more have

  {"k": "core", "id": ..., "t": ...}    that reply's request handed to vLLM's AsyncLLM
  {"k": "token", "id": ..., "t": ...}   its first output back from AsyncLLM (the engine's first token,
                                        detokenized)

The token source logs the same two from its side (request added to it, first token out of it).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import json
import re
import signal
import time
import types
from pathlib import Path
from typing import Any

TICK_S = 0.005  # the stall watcher's sleep
STALL_MS = 20.0  # a wake-up later than this is logged
GC_MS = 5.0  # a garbage collection longer than this is logged
ID = re.compile(r'"id": ?"([^"]+)"')
REPLY: contextvars.ContextVar[str | None] = contextvars.ContextVar("bench_reply", default=None)  # a reply's page id
CHAIN_DEPTH = 12  # referrers followed from a new object to an older one


class Recorder:
    def __init__(self, path: Path) -> None:
        self.out = open(path, "a", buffering=1)  # noqa: SIM115 - for the process's life
        self.sent: set[str] = set()
        self.watching = False
        self._gc_at = 0.0
        self._census: set[int] = set()  # the ids of the objects alive at the last census

    def write(self, **fields: Any) -> None:
        self.out.write(json.dumps(fields) + "\n")

    def received(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        if text and '"begin"' in text[:200]:
            with_id = ID.search(text)
            self.write(k="begin", id=with_id.group(1) if with_id else None, t=time.monotonic())
            REPLY.set(with_id.group(1) if with_id else None)  # in the socket's task, which starts the reply
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

    def census(self, *_: object) -> None:
        """What each visitor leaves behind: run in the main thread (a signal's handler), between two
        censuses taken once the visitors have gone. A frozen heap is thawed for it (the referrers of
        an object are found among unfrozen ones only) and frozen again after, with what is alive then:
        a diagnostic run's, not a measured one's."""
        frozen = gc.get_freeze_count()
        gc.unfreeze()
        gc.collect()
        everything = gc.get_objects()
        ids = {id(o) for o in everything}
        new = [o for o in everything if id(o) not in self._census]
        counts: dict[str, int] = {}
        for o in new:
            counts[_name(o)] = counts.get(_name(o), 0) + 1
        top = sorted(counts.items(), key=lambda kv: -kv[1])[:40]
        chains, holders = [], []
        if self._census:
            for name, _ in top[:12]:
                sample = next(o for o in new if _name(o) == name)
                chains.append(_chain(sample, self._census, exclude={id(everything), id(new)}))
            holders = _holders(new, self._census, exclude={id(everything), id(new)})
        del everything, new
        self._census = ids
        if frozen:
            gc.freeze()
        self.write(k="heap", t=time.monotonic(), objects=len(ids), new=dict(top), chains=chains, holders=holders)


def _holders(new: list[object], older: set[int], exclude: set[int], count: int = 15) -> list[dict[str, Any]]:
    """The older objects that hold new ones, the most first: how many new objects each reaches
    through new ones only (each counted for the first holder found to reach it), and its chain."""
    fresh = {id(o): o for o in new}
    direct = [r for r in gc.get_referrers(*new) if id(r) in older and id(r) not in exclude
              and not isinstance(r, types.FrameType)]
    mine = exclude | {id(fresh), id(direct)}  # this function's own containers refer to them all
    claimed: set[int] = set()
    found: list[tuple[int, object]] = []
    for holder in direct:
        reached, todo = 0, [r for r in gc.get_referents(holder) if id(r) in fresh and id(r) not in claimed]
        while todo:
            o = todo.pop()
            if id(o) in claimed:
                continue
            claimed.add(id(o))
            reached += 1
            for r in gc.get_referents(o):
                if id(r) in fresh and id(r) not in claimed:
                    todo.append(r)
        if reached:
            found.append((reached, holder))
    found.sort(key=lambda pair: -pair[0])
    reaches = [reached for reached, _ in found[:count]]
    top = [holder for _, holder in found[:count]]
    del found, direct
    out = []
    for i in range(len(top)):  # by index: a loop's tuple of (count, holder) would be a referrer of its own
        out.append({"reaches": reaches[i], "holder": _chain(top[i], set(), mine | {id(top)})[:6]})
    return out


def _name(o: object) -> str:
    kind = type(o)
    return f"{kind.__module__}.{kind.__qualname__}"


def _chain(o: object, older: set[int], exclude: set[int]) -> list[str]:
    """From `o`, one referrer at a time (an older one where there is one), to an object in `older`:
    each link as its type and, for a dict, the keys it holds the last link under, or for a module's,
    its name. (No comprehension here names `o`: that would make it a cell, a referrer of its own.)"""
    links, seen = [_name(o)], {id(o)}
    for _ in range(CHAIN_DEPTH):
        target = o
        found = []
        for r in gc.get_referrers(target):
            if id(r) not in exclude and id(r) not in seen and not isinstance(r, types.FrameType):
                found.append(r)
        if not found:
            links.append("(no referrer)")
            break
        r = found[0]
        for candidate in found:
            if id(candidate) in older:
                r = candidate
                break
        link = _name(r)
        if isinstance(r, dict):
            keys = []
            for k, v in r.items():
                if v is target:
                    keys.append(repr(k)[:60])
            link += f"[{', '.join(keys[:2])}]" if keys else ""
            if isinstance(r.get("__name__"), str):
                link += f" of {r['__name__']}"
        links.append(link)
        if id(r) in older:
            links.append("(older)")
            break
        seen.add(id(r))
        o = r
    return links


def install(path: Path) -> Recorder:
    from starlette.websockets import WebSocket

    recorder = Recorder(path)
    gc.callbacks.append(recorder.collected)
    signal.signal(signal.SIGUSR1, recorder.census)
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
    record_engine(recorder)
    return recorder


def record_engine(recorder: Recorder) -> None:
    """A page reply's request handed to vLLM (`core`) and its first output back (`token`), by the
    page's id: the socket's task that received the `begin` holds it (`Recorder.received`), and the
    reply's tasks, started from there, copy it."""
    from vllm.v1.engine.async_llm import AsyncLLM

    generate = AsyncLLM.generate

    async def generate_recorded(self: AsyncLLM, *args: Any, **kwargs: Any) -> Any:
        reply = REPLY.get()
        if reply is not None:
            recorder.write(k="core", id=reply, t=time.monotonic())
        async with contextlib.aclosing(generate(self, *args, **kwargs)) as outputs:  # closed: vLLM aborts it
            async for output in outputs:
                if reply is not None:
                    recorder.write(k="token", id=reply, t=time.monotonic())
                    reply = None
                yield output

    AsyncLLM.generate = generate_recorded  # type: ignore[method-assign]
