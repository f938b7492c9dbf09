"""Many readers of the app at once (Gradio's /chat endpoint, or the app's own WebSocket API at
/chat), optionally spread over several processes.

Closed loop: `concurrency` readers, each sending its next message when its reply has ended.
Open loop: messages sent at a steady rate whatever the server's state (arrivals, not readers).
With `procs` > 1 the readers are split over that many client processes, so that parsing hundreds
of streams never makes the client the bottleneck; all processes read the same monotonic clock.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import Any

from bench.gradio_stream import GradioChat, http_client
from bench.start_line import START_S, start_line, wait_at
from chat.shedding import use_descriptor_limit


@dataclass
class Reply:
    index: int
    started: float
    updates: list[tuple[float, int]] = field(default_factory=list)
    text: str = ""
    title: str = ""
    completed: bool = False
    error: str | None = None
    process_started: float | None = None


async def _one(client: GradioChat, index: int, data: list[Any]) -> Reply:
    started = time.monotonic()
    try:
        result = await client.chat(data)
    except Exception as exc:  # noqa: BLE001 - counted as an error by the caller
        return Reply(index, started, error=repr(exc))
    return Reply(index, result.started, result.updates, result.text, result.title, result.completed, result.error,
                 result.process_started)


async def _one_ws(url: str, index: int, request: dict[str, Any]) -> Reply:
    """One reply over the app's WebSocket API (one connection per reply, as a browser tab would)."""
    import websockets

    reply = Reply(index, time.monotonic())
    text = ""
    try:
        async with websockets.connect(url, max_size=None, open_timeout=120, ping_interval=None) as ws:
            await ws.send(json.dumps({**request, "id": f"bench-{uuid.uuid4().hex}"}))
            async for raw in ws:
                event = json.loads(raw)
                kind = event.get("type")
                if kind == "delta":
                    text += event["text"]
                    reply.updates.append((time.monotonic(), len(text)))
                elif kind == "stats":
                    reply.title = f"{event['stats'].get('generated_tokens')} tokens"
                elif kind == "done":
                    reply.completed = True
                    break
                elif kind == "error":
                    reply.error = event.get("message") or str(event)
                    break
    except Exception as exc:  # noqa: BLE001 - counted as an error by the caller
        reply.error = repr(exc)
    reply.text = text
    return reply


async def _closed(url: str, payloads: list[tuple[int, Any]], concurrency: int, protocol: str,
                  line: Any = None) -> list[Reply]:
    async with http_client(concurrency) as http:
        if protocol == "gradio":
            client = GradioChat(http, url)
            await client.fn_index()
        await wait_at(line)
        todo = list(payloads)
        out: list[Reply] = []

        async def reader() -> None:
            while todo:
                index, data = todo.pop(0)
                out.append(await (_one(client, index, data) if protocol == "gradio" else _one_ws(url, index, data)))

        await asyncio.gather(*(reader() for _ in range(max(1, concurrency))))
        return out


async def _open(url: str, payloads: list[tuple[int, Any]], rate: float, protocol: str, line: Any = None) -> list[Reply]:
    """Open loop, from once every client process is ready (bench/frontend_client.py `_open` says why)."""
    async with http_client(len(payloads)) as http:
        if protocol == "gradio":
            client = GradioChat(http, url)
            await client.fn_index()
        await wait_at(line)
        t0 = time.monotonic() + START_S
        tasks = []
        for index, data in payloads:
            await asyncio.sleep(max(0.0, t0 + index / rate - time.monotonic()))
            one = _one(client, index, data) if protocol == "gradio" else _one_ws(url, index, data)
            tasks.append(asyncio.create_task(one))
        return list(await asyncio.gather(*tasks))


def _shard(url: str, payloads: list[tuple[int, Any]], concurrency: int,
           rate: float | None, protocol: str = "gradio", line: Any = None) -> list[Reply]:
    use_descriptor_limit()
    if rate:
        return asyncio.run(_open(url, payloads, rate, protocol, line))
    return asyncio.run(_closed(url, payloads, concurrency, protocol, line))


def send_all(url: str, payloads: list[Any], *, concurrency: int = 1, rate: float | None = None,
             procs: int = 1, protocol: str = "gradio") -> list[Reply]:
    """Every payload sent once; replies in payload order. `rate`: requests per second (open loop).
    protocol "gradio": `url` is the app's page and payloads are /chat's inputs; "ws": `url` is the
    WebSocket (ws://host:port/chat) and payloads are chat requests ({"type": "chat", ...})."""
    indexed = list(enumerate(payloads))
    procs = max(1, min(procs, concurrency if not rate else len(payloads), len(payloads)))
    if procs == 1:
        replies = _shard(url, indexed, concurrency, rate, protocol)
    else:
        shares = [indexed[i::procs] for i in range(procs)]
        readers = [len(range(i, concurrency, procs)) for i in range(procs)]
        with start_line(procs) as line, ProcessPoolExecutor(procs, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(_shard, url, share, n, rate, protocol, line)
                       for share, n in zip(shares, readers, strict=True)]
            replies = [r for f in futures for r in f.result()]
    return sorted(replies, key=lambda r: r.index)
