"""Two presets that do not fit on one GPU together, switched with sleep mode; then an engine killed
mid-reply. Issue 16's one-GPU measurements, through the real app.py on the GPU host.

Runs after /work/shared/gpu/stage.sh's tarball is unpacked into /tmp/site (docs/benchmarks.md). Both
presets use the Llama-3-8B geometry with random weights (load_format: dummy) and SmolLM2's tokenizer,
each asking for 60% of the GPU (gpu_memory_utilization 0.6, so the app's memory budget of 1.0 holds
one at a time) with `enable_sleep_mode: true`. In one call:

  1. cold start of preset A (the app's default), then a first message on A;
  2. a message on B: A goes to sleep, B starts cold;
  3. --switches times: a message on A continuing A's conversation (B sleeps, A wakes), then one on B;
     each followed by a second message on the same preset (the warm first-token time to compare);
  4. a long reply on A, whose engine process is killed once text flows: the sentence the reader
     gets, what /healthz says, and the time until the next message's first token;
  5. writes gpu-ops-<time>.json and prints a table.

    python3 -m bench.gpu_ops --tok .gpu/tok --out $OUT
    python -m bench.gpu_ops --shape 135m --cpu-smoke --model-dir /tmp/model-135m   # the same steps on the CPU
                                                  # (no sleep mode there: the app unloads and reloads instead)
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import re
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import psutil

from bench.common import SYSTEM_PROMPT
from bench.dummy_model import SHAPES, write_model
from bench.gpu import gpu_info
from bench.procs import ROOT, Server, base_env, free_port, python
from bench.run import versions
from bench.run_log import RunLog
from chat.client import ChatApiError, ReplyStream

PRESETS = ("Sleepy A (8B shape, dummy weights)", "Sleepy B (8B shape, dummy weights)")


def write_presets(folder: Path, model_dir: Path, cpu: bool) -> dict[str, dict[str, Any]]:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    engines = {}
    for letter, name, max_model_len in zip("ab", PRESETS, (4096, 8192), strict=True):
        if cpu:
            engine: dict[str, Any] = {"load_format": "dummy", "dtype": "float32", "max_model_len": max_model_len,
                                      "enforce_eager": True, "kv_cache_memory_bytes": 1 << 30, "max_num_seqs": 16}
        else:
            engine = {"load_format": "dummy", "dtype": "bfloat16", "max_model_len": max_model_len,
                      "gpu_memory_utilization": 0.6, "kv_cache_memory_bytes": 40 << 30, "enable_sleep_mode": True,
                      "max_num_seqs": 256, "max_num_batched_tokens": 8192, "seed": 0}
        preset = {
            "name": name, "description": "Random weights: timings only, the text is gibberish.",
            "model": str(model_dir), "hardware": {"device": "cpu" if cpu else "gpu"}, "engine": engine,
            "sampling": {"temperature": 0.7, "max_tokens": {"default": 64, "max": 4096}},
            "system_prompt": SYSTEM_PROMPT, "ignore_eos": True, "timeout_s": 300,
        }
        (folder / f"sleepy-{letter}.yaml").write_text(yaml.safe_dump(preset, sort_keys=False))
        engines[name] = engine
    return engines


def healthz(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url + "healthz", timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"{}")
    except OSError as exc:
        return 0, {"error": repr(exc)}


def engine_cores(pid: int) -> list[psutil.Process]:
    """The app's engine processes, oldest first."""
    cores = [c for c in psutil.Process(pid).children(recursive=True) if c.name().startswith("VLLM::EngineCor")]
    return sorted(cores, key=lambda p: p.create_time())


async def message(url: str, preset: str, text: str, history: list[dict[str, str]], max_tokens: int,
                  on_text: Any = None) -> dict[str, Any]:
    """One message over the app's WebSocket API; the client's first-token time and the outcome."""
    stream = ReplyStream(text, url=url, preset=preset, history=history, retries=0,
                         sampling={"max_tokens": max_tokens, "temperature": 0.7})
    sent = time.monotonic()
    first: float | None = None
    error = None
    try:
        async for piece in stream:
            if first is None and piece:
                first = time.monotonic()
                if on_text is not None:
                    on_text()
    except ChatApiError as exc:
        error = exc.message
    ended = time.monotonic()
    return {"preset": preset, "first_token_s": None if first is None else first - sent, "total_s": ended - sent,
            "finish": stream.finish, "notice": stream.notice, "error": error, "chars": len(stream.text),
            "history_turns": len(history) // 2, "stats": stream.stats, "text": stream.text, "ended": ended,
            "first_at": first}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_ops", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tok", type=Path, default=ROOT / ".gpu" / "tok", help="tokenizer files (stage.sh's .gpu/tok)")
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/model-8b"))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--switches", type=int, default=3, help="round trips A -> B -> A after the first")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds; no step starts after it")
    ap.add_argument("--cpu-smoke", action="store_true", help="the same steps on the CPU engine (tiny)")
    ap.add_argument("--ui-workers", type=int, default=None, help="UI workers (default: the app's own choice)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "bench" / "results")))
    args = ap.parse_args(argv)
    return asyncio.run(run(args))


class Conversations:
    """The app under test, with a conversation per preset that each message on it continues."""

    def __init__(self, url: str, server: Server, log: RunLog) -> None:
        self.url, self.server, self.log = url, server, log
        self.histories: dict[str, list[dict[str, str]]] = {preset: [] for preset in PRESETS}

    async def wait_ready(self) -> None:
        """Until /healthz answers 200; the app's first engine (A's) has started by then."""
        while True:
            status, body = healthz(self.url)
            if status == 200:
                break
            if not self.server.alive or self.log.left() < 0:
                raise RuntimeError("the app did not become ready:\n" + self.server.log_tail(40))
            await asyncio.sleep(0.5)
        self.log.result["cold_start_a_s"] = body["engines"][0]["start_seconds"]
        self.log.event(f"A ready; engine start {self.log.result['cold_start_a_s']:.1f} s; {gpu_info()}")

    async def say(self, preset: str, label: str, max_tokens: int = 32, **kw: Any) -> dict[str, Any]:
        """One message on `preset`, recorded with what /healthz and the GPU said right after it."""
        history = self.histories[preset]
        turn = len(history) // 2 + 1
        record = await message(self.url, preset, f"Turn {turn}: tell me about the sea.", history, max_tokens, **kw)
        record["label"] = label
        if record["error"] is None and record["finish"] is not None:
            history += [{"role": "user", "content": f"Turn {turn}: tell me about the sea."},
                        {"role": "assistant", "content": record["text"]}]
        record.pop("text")
        status, body = healthz(self.url)
        record["healthz"] = {"status": status, "engines": [(e["preset"], e["state"], e["start_seconds"])
                                                            for e in body.get("engines", [])]}
        record["gpu_memory"] = gpu_info()
        self.log.result["messages"].append(record)
        first = "-" if record["first_token_s"] is None else f"{record['first_token_s']:7.2f} s"
        self.log.event(f"{label:<28} {preset[:8]} first token {first}  finish {record['finish']}  "
                       f"error {record['error']}  turns before {record['history_turns']}  "
                       f"engines {record['healthz']['engines']}")
        self.log.save()
        return record


async def switch_presets(chat: Conversations, switches: int) -> None:
    """Steps 1 to 3: A, then B cold, then `switches` round trips, each switch followed by a warm message."""
    a, b = PRESETS
    await chat.say(a, "A first message")
    await chat.say(a, "A warm")
    await chat.say(b, "switch to B (cold start)")
    await chat.say(b, "B warm")
    for i in range(switches):
        if chat.log.left() < 90:
            chat.log.event("deadline: no more switches")
            break
        await chat.say(a, f"switch to A #{i + 1} (wake)")
        await chat.say(a, "A warm")
        await chat.say(b, f"switch to B #{i + 1} (wake)")
        await chat.say(b, "B warm")


async def kill_mid_reply(chat: Conversations, cpu_smoke: bool) -> None:
    """Step 4: A's engine killed once a long reply's text flows; what the reader and /healthz are told,
    and how soon the next message's first token comes."""
    a = PRESETS[0]
    log, result = chat.log, chat.log.result
    await chat.say(a, "switch to A before the kill")
    killed: dict[str, Any] = {}

    def kill() -> None:
        # A's engine: on the CPU the only one (switching unloaded B); on the GPU the oldest,
        # as A started first and sleeping keeps B's process.
        cores = engine_cores(chat.server.pid)
        victim = cores[-1] if cpu_smoke else cores[0]
        killed["pid"], killed["at"] = victim.pid, time.monotonic()
        victim.send_signal(signal.SIGKILL)

    record = await chat.say(a, "long reply, engine killed", max_tokens=2000, on_text=kill)
    result["kill"] = {"pid": killed.get("pid"), "reader_sentence": record["error"] or record["notice"],
                      "reader_told_after_s": record["ended"] - killed["at"] if killed else None}
    # /healthz while the engine comes back
    while log.left() > 20:
        status, body = healthz(chat.url)
        result["health"].append({"t": time.monotonic() - killed["at"], "status": status,
                                 "reason": body.get("reason")})
        if status == 200:
            break
        await asyncio.sleep(0.2)
    result["kill"]["healthz_ok_after_s"] = time.monotonic() - killed["at"]
    phases = [re.sub(r"… \d+ s", "…", h["reason"]) for h in result["health"] if h["reason"]]
    result["kill"]["healthz_said"] = list(dict.fromkeys(phases))  # each phase once, in order
    after = await chat.say(a, "next message after the kill")
    if after["first_at"] is not None:
        result["kill"]["next_first_token_after_kill_s"] = after["first_at"] - killed["at"]
    log.event(f"kill: {json.dumps(result['kill'])}")


async def run(args: argparse.Namespace) -> int:
    t_start = time.monotonic()
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out / f"gpu-ops-{dt.datetime.now():%Y%m%d-%H%M%S}.json"
    cfg = write_model(args.model_dir, args.tok, args.shape)
    folder = Path("/tmp/bench-gpu-ops-presets")
    engines = write_presets(folder, args.model_dir, args.cpu_smoke)
    log = RunLog(out, {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "gpu": gpu_info(), "versions": versions(),
        "model_config": cfg, "engines": engines, "weights": "random (load_format: dummy)",
        "messages": [], "health": [], "events": [],
    }, args.deadline, t_start)
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    argv = [python(), "app.py", "--port", str(port), "--presets-dir", str(folder), "--preset", PRESETS[0]]
    if args.ui_workers:
        argv += ["--ui-workers", str(args.ui_workers)]
    log.result["app_argv"] = argv[1:]
    if args.cpu_smoke:
        argv += ["--memory-budget-gb", "1.5"]  # room for one of the two (1 GiB of KV cache each), as on the GPU
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    server = Server("app", argv, args.out / "logs" / "app-ops.log", env=base_env(env)).start()
    chat = Conversations(url, server, log)
    try:
        log.event(f"starting app.py with two presets; {log.result['gpu']}")
        await chat.wait_ready()
        await switch_presets(chat, args.switches)
        if log.left() > 60:
            await kill_mid_reply(chat, args.cpu_smoke)
    finally:
        server.stop(grace=20)
        (args.out / "app-ops-tail.log").write_text(server.log_tail(300))
        log.save()
    print(summary(log.result))
    print(f"results: {out}  ({time.monotonic() - t_start:.0f} s)")
    return 0


def summary(result: dict[str, Any]) -> str:
    def seconds(label: str) -> list[float]:
        return [m["first_token_s"] for m in result["messages"]
                if m["label"].startswith(label) and m["first_token_s"] is not None]

    def spread(values: list[float]) -> str:
        if not values:
            return "-"
        values = sorted(values)
        return f"{values[len(values) // 2]:.2f} s (min {values[0]:.2f}, max {values[-1]:.2f}, n={len(values)})"

    lines = [f"cold start A (engine start): {result.get('cold_start_a_s') or 0:.1f} s",
             f"switch to B, cold (first token): {spread(seconds('switch to B (cold'))}",
             f"switch by sleep/wake (first token): {spread(seconds('switch to A #') + seconds('switch to B #'))}",
             f"warm message (first token): {spread(seconds('A warm') + seconds('B warm'))}"]
    if "kill" in result:
        lines.append(f"kill: {json.dumps(result['kill'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
