"""One stranger holds many sockets asking for long replies; does another visitor still get theirs in
time? (issue 47, part 1: within twice their unloaded first-token time, every time.)

The app runs with `--ui-workers 2` behind Caddy (or one worker with `--ui-workers 1`), the visitor's
share at its default unless `--per-visitor` says otherwise. The stranger connects from `--stranger`
and the visitor from `--visitor`, two addresses of this machine (127.0.0.2 and 127.0.0.3 on the
loopback network by default), so the app tells them apart as it would two people:

1. unloaded: the visitor asks for a short reply `--probes` times, one after another; the median
   first-token time is the yardstick;
2. loaded: the stranger opens `--sockets` WebSockets on `/chat` and sends `--per-socket` long
   replies on each (max_tokens `--long-tokens`); once their text flows, the visitor asks again
   `--probes` times, and each first-token time is compared with the yardstick.

    python -m bench.fair_share --sockets 40 --per-socket 8 --probes 10   # starts the app itself
    python -m bench.fair_share --url http://127.0.0.1:7860/               # or measures a running one

The report names the machine (its CPU, cores, memory), the share, how many of the stranger's replies were refused (and with which
code), how many ran, and each probe's first token in ms and as a multiple of the unloaded median.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.procs import ROOT, Server, base_env, free_port, python
from bench.run import machine

SHORT = "Say hello in one short sentence."
LONG = "Tell me a very long story about a lighthouse keeper, with many chapters."


@dataclass
class Stranger:
    asked: int = 0
    refused: dict[str, int] = field(default_factory=dict)  # error code -> count
    flowing: int = 0  # replies that sent text
    deltas: int = 0
    flows: asyncio.Event = field(default_factory=asyncio.Event)  # set once a reply sends text


async def connect(url: str, source: str) -> Any:
    import websockets

    ws_url = url.replace("http://", "ws://").rstrip("/") + "/chat"
    return await websockets.connect(ws_url, max_size=None, open_timeout=60, ping_interval=None, local_addr=(source, 0))


def chat_request(message: str, max_tokens: int) -> dict[str, Any]:
    return {"type": "chat", "id": f"r-{uuid.uuid4().hex}", "messages": [{"role": "user", "content": message}],
            "sampling": {"max_tokens": max_tokens}}


async def first_token_ms(url: str, source: str, max_tokens: int) -> float | str:
    """One short reply on a new socket: ms from sending to its first text, or what went wrong."""
    async with await connect(url, source) as ws:
        sent = time.monotonic()
        await ws.send(json.dumps(chat_request(SHORT, max_tokens)))
        first: float | None = None
        async for raw in ws:
            event = json.loads(raw)
            if event.get("type") == "delta" and first is None:
                first = (time.monotonic() - sent) * 1000
            elif event.get("type") == "error":
                return f"{event.get('code')}: {event.get('message')}"
            elif event.get("type") == "done":
                break
        return first if first is not None else "no text"


async def one_socket(url: str, source: str, per_socket: int, long_tokens: int, stranger: Stranger,
                     stop: asyncio.Event) -> None:
    async with await connect(url, source) as ws:
        for _ in range(per_socket):
            await ws.send(json.dumps(chat_request(LONG, long_tokens)))
            stranger.asked += 1
        flowing: set[str] = set()

        async def read() -> None:
            async for raw in ws:
                event = json.loads(raw)
                if event.get("type") == "delta":
                    stranger.deltas += 1
                    if event["id"] not in flowing:
                        flowing.add(event["id"])
                        stranger.flowing += 1
                        stranger.flows.set()
                elif event.get("type") == "error":
                    code = str(event.get("code"))
                    stranger.refused[code] = stranger.refused.get(code, 0) + 1

        reader = asyncio.create_task(read())
        await stop.wait()
        reader.cancel()


async def measure(args: argparse.Namespace, url: str) -> dict[str, Any]:
    async def probes() -> list[float | str]:
        out: list[float | str] = []
        for _ in range(args.probes):
            out.append(await first_token_ms(url, args.visitor, args.short_tokens))
        return out

    await first_token_ms(url, args.visitor, args.short_tokens)  # a warm-up, not counted
    unloaded = await probes()
    stranger, stop = Stranger(), asyncio.Event()
    sockets = [asyncio.create_task(one_socket(url, args.stranger, args.per_socket, args.long_tokens, stranger, stop))
               for _ in range(args.sockets)]
    await asyncio.wait_for(stranger.flows.wait(), 120)
    await asyncio.sleep(args.settle_s)  # the rest of the stranger's replies join the engine's batch
    loaded = await probes()
    running_at_end = stranger.flowing
    stop.set()
    await asyncio.gather(*sockets, return_exceptions=True)
    times = [p for p in unloaded if isinstance(p, float)]
    yardstick = statistics.median(times) if times else float("nan")
    return {
        "unloaded_ms": [round(p, 1) if isinstance(p, float) else p for p in unloaded],
        "unloaded_median_ms": round(yardstick, 1),
        "loaded_ms": [round(p, 1) if isinstance(p, float) else p for p in loaded],
        "loaded_x_unloaded": [round(p / yardstick, 2) if isinstance(p, float) else None for p in loaded],
        "within_twice": sum(1 for p in loaded if isinstance(p, float) and p <= 2 * yardstick),
        "stranger": {"asked": stranger.asked, "refused": stranger.refused, "replies_with_text": running_at_end,
                     "deltas": stranger.deltas},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running app (default: start one)")
    parser.add_argument("--ui-workers", type=int, default=2)
    parser.add_argument("--per-visitor", type=int, help="--replies-per-visitor for the started app (default: its own)")
    parser.add_argument("--sockets", type=int, default=40)
    parser.add_argument("--per-socket", type=int, default=8)
    parser.add_argument("--long-tokens", type=int, default=1024)
    parser.add_argument("--short-tokens", type=int, default=16)
    parser.add_argument("--probes", type=int, default=10)
    parser.add_argument("--settle-s", type=float, default=3.0, help="after the stranger's text flows, before probing")
    parser.add_argument("--stranger", default="127.0.0.2")
    parser.add_argument("--visitor", default="127.0.0.3")
    parser.add_argument("--out", type=Path, help="write the report here as JSON too")
    args = parser.parse_args()

    server = None
    url = args.url
    if url is None:
        port = free_port()
        env = base_env()
        env.pop("CHAT_REPLIES_PER_VISITOR")  # the app's own share: what a stranger meets
        argv = [python(), str(ROOT / "app.py"), "--port", str(port), "--host", "0.0.0.0",
                "--ui-workers", str(args.ui_workers)]
        if args.per_visitor is not None:
            argv += ["--replies-per-visitor", str(args.per_visitor)]
        server = Server("fair-share-app", argv, ROOT / "bench" / "results" / "fair-share-app.log", env=env).start()
        url = f"http://127.0.0.1:{port}/"
        server.wait_http(url + "healthz", timeout=900)
    try:
        report = {"machine": machine(), "ui_workers": args.ui_workers, "per_visitor": args.per_visitor or "default",
                  "sockets": args.sockets, "per_socket": args.per_socket, "long_tokens": args.long_tokens,
                  "short_tokens": args.short_tokens, **asyncio.run(measure(args, url))}
    finally:
        if server is not None:
            server.stop()
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    sys.exit(0)


if __name__ == "__main__":
    main()
