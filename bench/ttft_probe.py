"""One stream's first token through each of the app's doors, in turn (a diagnostic for issue 22).

    python3 -m bench.ttft_probe --tok .gpu/tok --kv-gib 30 [--ui-workers 8] [--turns 12]

Starts app.py on bench.gpu's dummy Llama-3-8B preset and, one request at a time, times the first
text of: the WebSocket API ("chat"); a reply begun over the socket with no Gradio turn ("begin");
the page's path (begin, then the turn's Gradio event, as live.js sends them); and the turn alone
(a page whose socket is not open). Prints medians and the app's chat_replies_started_total.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import sys
import time
from pathlib import Path

import httpx
import websockets

from bench.common import SYSTEM_PROMPT, user_message
from bench.dummy_model import write_model
from bench.gpu import engine_for, write_preset
from bench.gradio_browser import Tab, Watch
from bench.gradio_page import load_page
from bench.paths import app_path


async def first_delta(ws, request_id: str) -> float:
    while True:
        event = json.loads(await ws.recv())
        if event.get("id") == request_id and event["type"] == "delta":
            return time.monotonic()
        if event.get("id") == request_id and event["type"] in ("done", "error"):
            raise RuntimeError(event)


async def drain(ws, request_id: str) -> None:
    while True:
        event = json.loads(await ws.recv())
        if event.get("id") == request_id and event["type"] in ("done", "error"):
            return


async def probe(url: str, turns: int, lines: int, max_tokens: int) -> dict[str, list[float]]:
    ws_url = url.replace("http://", "ws://") + "chat"
    out: dict[str, list[float]] = {"ws chat": [], "begin only": [], "page (begin + turn)": [], "turn alone": []}
    async with httpx.AsyncClient(timeout=120) as http:
        page = await load_page(http, url)
        for i in range(turns):
            message = user_message(1000 + 10 * i, lines)
            async with websockets.connect(ws_url, max_size=None) as ws:
                rid = f"probe-{secrets.token_hex(8)}"
                t0 = time.monotonic()
                await ws.send(json.dumps({"type": "chat", "id": rid, "sampling": {"max_tokens": max_tokens},
                                          "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                                                       {"role": "user", "content": message + " a"}]}))
                out["ws chat"].append(1e3 * (await first_delta(ws, rid) - t0))
                await drain(ws, rid)
                rid = f"live-{secrets.token_hex(16)}"
                t0 = time.monotonic()
                await ws.send(json.dumps({"type": "begin", "id": rid, "message": message + " b", "history": [],
                                          "system_prompt": SYSTEM_PROMPT, "sampling": {"max_tokens": max_tokens}}))
                out["begin only"].append(1e3 * (await first_delta(ws, rid) - t0))
                await drain(ws, rid)
            for name, early in (("page (begin + turn)", True), ("turn alone", False)):
                tab = Tab(http, url, page)
                await tab.pin()
                if early:
                    await tab.connect()
                tab.set("message", message + (" c" if early else " d"))
                tab.set("knob-max_tokens", max_tokens)
                watch = tab.watch = Watch(page.component("chatbot"), started=time.monotonic())
                await tab.trigger(page.component("message"), "submit")
                await tab.close()
                first = next(t for t, n in watch.updates if n)
                out[name].append(1e3 * (first - watch.started))
        metrics = (await http.get(url + "metrics")).text
        print([line for line in metrics.splitlines() if line.startswith("chat_replies_started")])
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tok", type=Path, default=Path(".gpu/tok"))
    ap.add_argument("--kv-gib", type=float, default=30)
    ap.add_argument("--ui-workers", type=int, default=8)
    ap.add_argument("--turns", type=int, default=12)
    ap.add_argument("--context-lines", type=int, default=16)
    ap.add_argument("--cpu-smoke", action="store_true")
    args = ap.parse_args()
    args.model_dir, args.shape, args.gpu_mem = Path("/tmp/model-8b"), ("135m" if args.cpu_smoke else "8b"), 0.4
    write_model(args.model_dir, args.tok, args.shape)
    preset = write_preset(Path("/tmp/bench-probe-presets"), args.model_dir, engine_for(args),
                          "cpu" if args.cpu_smoke else "gpu", 256)
    app = app_path("probe", preset, Path("/tmp/bench-probe-logs"), {"VLLM_USE_FLASHINFER_SAMPLER": "0"},
                   len, args.context_lines, ui_workers=args.ui_workers)
    url = app.notes["url"]
    try:
        t0 = time.monotonic()
        app.servers[0].wait_http(url + "healthz", timeout=400)
        print(f"app ready in {time.monotonic() - t0:.0f} s")
        asyncio.run(probe(url, 2, args.context_lines, 8))  # warm-up
        results = asyncio.run(probe(url, args.turns, args.context_lines, 16))
        for name, times in results.items():
            print(f"{name:<22} first text p50 {statistics.median(times):6.1f} ms  "
                  f"({min(times):.1f}-{max(times):.1f}) " + " ".join(f"{t:.0f}" for t in times))
    finally:
        app.servers[0].stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
