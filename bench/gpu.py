"""The app against the raw engine on one GPU, with a Llama-3-8B-shaped model of random weights.

Runs on the GPU host after /work/shared/gpu/stage.sh's tarball is unpacked into /tmp/site
(docs/benchmarks.md); the weights are made on the GPU by vLLM (load_format: dummy), so replies are
gibberish and only the timings mean anything. In one call, within --deadline seconds:

  1. writes the model's config (Llama-3-8B geometry, SmolLM2's tokenizer) and a preset for it;
  2. starts the raw engine (bench/raw_engine.py) and one or more app variants (app.py, or
     bench/patched_app.py with another number of Gradio queue slots; --app) side by side on the GPU, each with
     its own KV-cache budget (kv_cache_memory_bytes) so that they can start together; or, with --in-turn,
     the raw engine alone with the whole GPU's cache, measured, stopped (until its GPU memory is free),
     then the apps alone, measured at the same levels, rounds and rates (the raw engine's share of the
     time is set so that the apps' phase can repeat every step it measured);
  3. closed loop at each concurrency level (--rounds N: N rounds of every level), every target in turn
     (each target first warmed once at the largest level, then each level warmed up before it is
     measured; with --rounds, once, and not the largest again; with --cold, neither: every round is
     measured from the first request after the targets are ready, and the first round is compared
     with the median of the others, per target: issue 48, part 4);
  4. steady arrivals (open loop): rising request rates on the raw engine until its p99 time to
     first token reaches --ttft-slo-ms, then the app at the highest rate that passed (and the first
     that failed, when time allows); or, with --rate-rounds N, N rounds of the fixed --rates, the raw
     engine and each app's door side by side at every rate (order rotating), then --rates-beyond one
     round each while the raw engine holds --ttft-slo-ms (issue 48, part 2: an app's `visitor=1`
     door is new visitors at that rate, each loading the page through the front door, mounting it and
     sending its message as the page does; with `timeline=1` the slowest replies' timelines);
  5. writes gpu-<time>.json and prints a table (results also under $OUT when set).

Each conversation may hold earlier turns (--turns N: N - 1 turns of filler before its message,
bench.common.earlier_turns): the raw engine renders them through the chat template, the page's doors
hold them in the page's chat (bench/frontend_client.py), as a tab does after those turns.

    python3 -m bench.gpu --tok .gpu/tok --out $OUT
    python3 -m bench.gpu --tok .gpu/tok --in-turn --max-num-seqs 1024 --app w8:ui_workers=8:browser=1:api=0 \
        --levels 512,1024 --rounds 3 --rates ""          # issue 48, part 1 (bench/gpu_chain.sh: STEPS=readers)
    python3 -m bench.gpu --tok .gpu/tok --kv-gib 16 --max-num-seqs 256 --app w8:ui_workers=8:browser=1:api=0 \
        --levels 256 --rounds 4 --cold --rates "" --client-procs 6   # part 4, cold first rounds (STEPS=cold)
    python -m bench.gpu --shape 135m --cpu-smoke     # the same steps on this machine's CPU engine
    python -m bench.gpu --shape 135m --cpu-smoke --in-turn --turns 3 --max-num-seqs 8 --levels 2,4 --rounds 2 \
        --app app:browser=1:api=0 --rates "" --max-tokens 16
"""

from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import statistics
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import SYSTEM_PROMPT, Summary, pct, ratio_table, table
from bench.dummy_model import SHAPES, write_model
from bench.paths import Target, app_path, browser_path, measure, raw_path, websocket_path
from bench.procs import ROOT
from bench.run import versions
from bench.run_log import RunLog
from chat.presets import load_preset
from chat.shedding import use_descriptor_limit


@dataclass
class AppVariant:
    name: str
    max_threads: int | None = None
    flush_ms: int | None = None
    levels: tuple[int, ...] = ()  # closed-loop levels to run it at; empty: all
    ws: bool = False  # also read the same server through the app's WebSocket API ("NAME-ws")
    browser: bool = False  # also as a browser uses it: the Chat tab's events and live text ("NAME-browser")
    ui_workers: int | None = None  # app.py --ui-workers; None: the app's own choice
    api: bool = True  # also measure Gradio's /chat endpoint as gradio_client uses it ("NAME")
    late: bool = False  # with browser: also one stream from pages whose socket is not open yet ("NAME-browser-late")
    visitor: bool = False  # new visitors at steady rates ("NAME-visitor"; then the app's only door at rates)
    timeline: bool = False  # every app process records its page-reply moments (bench/gpu_app.py)
    root: str | None = None  # another checkout's app (bench/gpu_app.py), e.g. the code before a change

    @classmethod
    def parse(cls, text: str) -> AppVariant:
        name, *options = text.split(":")
        variant = cls(name)
        for option in options:
            key, _, value = option.partition("=")
            if key == "levels":
                variant.levels = tuple(int(x) for x in value.split("/"))
            elif key in ("max_threads", "flush_ms", "ui_workers"):
                setattr(variant, key, int(value))
            elif key in ("ws", "browser", "api", "late", "visitor", "timeline"):
                setattr(variant, key, value not in ("0", "false", "no"))
            elif key == "root":
                variant.root = value
            else:
                raise argparse.ArgumentTypeError(f"unknown app option {key!r}")
        return variant


SECOND = "Llama-3-8B shape, 64 slots (dummy weights, benchmark)"


def write_preset(folder: Path, model_dir: Path, engine: dict[str, Any], device: str, max_tokens: int,
                 name: str = "Llama-3-8B shape (dummy weights, benchmark)", file: str = "bench-gpu.yaml") -> Path:
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    preset = {
        "name": name,
        "description": "Llama-3-8B geometry with random weights made on the GPU: timings only, the text is gibberish.",
        "model": str(model_dir),
        "hardware": {"device": device},
        "engine": engine,
        "sampling": {"temperature": 0.7, "top_p": 0.9, "repetition_penalty": 1.1,
                     "max_tokens": {"default": max_tokens, "max": 4096}},
        "system_prompt": SYSTEM_PROMPT,
        "ignore_eos": True,
        "timeout_s": 300,
    }
    path = folder / file
    path.write_text(yaml.safe_dump(preset, sort_keys=False))
    return path


def second_engine(engine: dict[str, Any]) -> dict[str, Any]:
    """Another engine of the same model for the mixed load's comparisons: fewer slots, a smaller cache."""
    second = {**engine, "max_num_seqs": 64}
    if "kv_cache_memory_bytes" in engine and "gpu_memory_utilization" in engine:
        second.update(kv_cache_memory_bytes=8 * 2**30, gpu_memory_utilization=0.2)
    return second


def start_in_background(url: str, preset: str) -> threading.Thread:
    """Send one message on `preset` through the app, so that its engine starts while others do."""
    def ask() -> None:
        from gradio_client import Client

        Client(url, verbose=False).predict("Hello", preset, None, 0.7, 0.9, 0, 8, 1.1, -1, api_name="/chat")

    thread = threading.Thread(target=ask, daemon=True)
    thread.start()
    return thread


def gpu_info() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.used,memory.total",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return repr(exc)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    ap.add_argument("--tok", type=Path, default=ROOT / ".gpu" / "tok", help="tokenizer files (stage.sh's .gpu/tok)")
    ap.add_argument("--model-dir", type=Path, default=Path("/tmp/model-8b"))
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--levels", default="1,8,32,64,128,256")
    ap.add_argument("--requests", default="1:4", help="requests per closed-loop run as level:count (default: one each)")
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--context-lines", type=int, default=16, help="filler lines per prompt (~30 tokens each)")
    ap.add_argument("--rates", default="10,20,25,30,35,40", help="steady request rates to try, requests/s, rising (\"\": none)")
    ap.add_argument("--rate-seconds", type=float, default=12.0, help="seconds of arrivals per rate")
    ap.add_argument("--rate-rounds", type=int, default=0,
                    help="N: N rounds of every --rates rate, raw and apps side by side (0: the rising search)")
    ap.add_argument("--rates-beyond", default="", help="with --rate-rounds: higher rates after the rounds, one round "
                    "each, rising while the raw engine's p99 TTFT stays under --ttft-slo-ms")
    ap.add_argument("--warm-streams", type=int, default=128, help="the first warm-up burst when --levels is empty")
    ap.add_argument("--ttft-slo-ms", type=float, default=800.0)
    ap.add_argument("--kv-gib", type=float, default=None, help="KV cache per engine (default: 32, two engines share "
                    "the GPU; with --in-turn what fits beside the weights, at most 100: kv_alone)")
    ap.add_argument("--gpu-mem", type=float, default=None,
                    help="each engine's gpu_memory_utilization (default 0.4; with --in-turn 0.9)")
    ap.add_argument("--max-num-seqs", type=int, default=None,
                    help="max_num_seqs of every engine, raw and the apps' (default 256; 64 with --cpu-smoke)")
    ap.add_argument("--in-turn", action="store_true", help="the raw engine alone on the GPU, then the apps alone "
                    "(each with the whole cache), instead of side by side")
    ap.add_argument("--turns", type=int, default=1, help="turns in each conversation, the new message's included: "
                    "N - 1 earlier turns (~60-token questions, ~150-token answers) before it")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of every closed-loop level (each level warmed once)")
    ap.add_argument("--cold", action="store_true", help="no warm-up of ours: no cold-start burst, no level's warm-up; "
                    "every round measured from the targets' first request, the first against the others")
    ap.add_argument("--raw-warm-up", action="store_true",
                    help="the raw engine runs the app's start-time warm-up before it is ready (bench/raw_engine.py --warm-up)")
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--app", dest="apps", action="append", type=AppVariant.parse, default=[],
                    help="an app to run beside the raw engine, NAME[:max_threads=N][:flush_ms=N][:ui_workers=N][:levels=1/8/..][:ws=1][:browser=1][:late=1][:api=0]"
                         "[:visitor=1][:timeline=1][:root=PATH]; max_threads launches it through bench/patched_app.py, "
                         "root and timeline through bench/gpu_app.py; repeatable (default: one 'app')")
    ap.add_argument("--mixed", default="", help="CHAT:VISITORS: after the closed loop, a burst of CHAT browser "
                    "streams while VISITORS compare the preset with one on another engine (e.g. 128:16)")
    ap.add_argument("--deadline", type=float, default=520.0, help="seconds; no step starts after it")
    ap.add_argument("--cpu-smoke", action="store_true", help="run the same steps on the CPU engine (tiny)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "bench" / "results")))
    args = ap.parse_args(argv)
    args.apps = args.apps or [AppVariant("app")]
    if args.gpu_mem is None:
        args.gpu_mem = 0.9 if args.in_turn else 0.4
    if args.turns > 1 and any(v.api or v.ws for v in args.apps):
        ap.error("--turns: only the page's doors carry a conversation's earlier turns; give every --app api=0 "
                 "(and no ws=1), with browser=1 or visitor=1")
    if args.in_turn and args.mixed:
        ap.error("--mixed needs a second engine beside the app's: not with --in-turn")
    if min(args.turns, args.rounds, args.max_num_seqs or 1) < 1:
        ap.error("--turns, --rounds and --max-num-seqs are at least 1")
    return args


def kv_alone(gpu_mem: float) -> float:
    """GiB of KV cache for an engine alone on this GPU: gpu_mem of its memory less 17.5 GiB (the 8B
    shape's 13.75 GiB of weights, activations, CUDA graphs, the sampler), at most the 100 GiB that
    1,024 readers of ~800 tokens need (128 KiB a token): 54 on an 80 GB H100, 100 on an H200."""
    try:
        total = subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits"],
                               capture_output=True, text=True, timeout=20).stdout.split()
        return float(min(100, int(int(total[0]) / 1024 * gpu_mem - 17.5)))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return 32.0


def engine_for(args: argparse.Namespace) -> dict[str, Any]:
    """The preset's engine arguments: a share of the GPU, or a tiny CPU engine for --cpu-smoke."""
    if args.cpu_smoke:
        return {"load_format": "dummy", "dtype": "float32", "max_model_len": 4096, "enforce_eager": True,
                "kv_cache_memory_bytes": 1 << 30, "max_num_seqs": args.max_num_seqs or 64}
    seqs = args.max_num_seqs or 256
    return {"load_format": "dummy", "dtype": "bfloat16", "max_model_len": 4096,
            "gpu_memory_utilization": args.gpu_mem, "kv_cache_memory_bytes": int(args.kv_gib * 2**30),
            "max_num_seqs": seqs, "max_num_batched_tokens": max(8192, seqs), "seed": 0}


def compile_env(name: str) -> dict[str, str]:
    """An engine's environment with its own compile caches (engines that start together compile at
    the same time; engines started in turn share one, and the later ones load what the first compiled)."""
    return {"VLLM_USE_FLASHINFER_SAMPLER": "0", "VLLM_CACHE_ROOT": f"/tmp/vllm-cache-{name}",
            "TRITON_CACHE_DIR": f"/tmp/triton-{name}"}


def start_raw(args: argparse.Namespace, preset: Path, cache: str = "raw") -> Target:
    return raw_path(preset, args.out / "logs", compile_env(cache), args.context_lines, args.turns,
                    warm_up=args.raw_warm_up)


def start_apps(args: argparse.Namespace, preset: Path, count: Callable[[str], int], started: list[Target],
               cache: str | None = None) -> list[Target]:
    """Starts every --app (each server joins `started` as it starts, for the caller to stop); returns
    the targets to measure, the apps' other doors included. `cache`: one compile cache for all (else each its own)."""
    logs = args.out / "logs"
    apps = []
    for variant in args.apps:
        apps.append(app_path(variant.name, preset, logs, compile_env(cache or variant.name), count, args.context_lines,
                             flush_ms=variant.flush_ms, client_procs=args.client_procs,
                             max_threads=variant.max_threads, ui_workers=variant.ui_workers,
                             root=Path(variant.root) if variant.root else None,
                             timeline=args.out / f"timeline-{variant.name}" if variant.timeline else None))
        apps[-1].notes["levels"] = variant.levels
        apps[-1].notes["measured"] = variant.api
        started.append(apps[-1])
    for variant, app in zip(list(args.apps), list(apps), strict=True):
        if variant.ws:
            ws = websocket_path(app, preset, count, args.context_lines, args.client_procs)
            ws.notes["levels"] = variant.levels
            apps.append(ws)
        if variant.browser:
            browser = browser_path(app, count, args.context_lines, args.client_procs, turns=args.turns)
            browser.notes["levels"] = variant.levels
            apps.append(browser)
        if variant.browser and variant.late:
            late = browser_path(app, count, args.context_lines, args.client_procs, late=True, turns=args.turns)
            late.notes["levels"] = (1,)  # one stream's first token, before and after chat/live.py's early replies
            apps.append(late)
        if variant.visitor:  # steady arrivals only; then this app's other doors are not run at rates
            visitor = browser_path(app, count, args.context_lines, args.client_procs, visitor=True, turns=args.turns)
            visitor.notes.update(levels=(), closed=False, at_rates=True, timeline=app.notes["timeline"])
            for door in apps:
                if door.notes.get("shares_server_with") == app.name or door is app:
                    door.notes.setdefault("at_rates", False)
            apps.append(visitor)
    return apps


def start_targets(args: argparse.Namespace, preset: Path, count: Callable[[str], int],
                  started: list[Target]) -> tuple[Target, list[Target]]:
    """Starts the raw engine and every --app side by side (each server joins `started` as it starts,
    for the caller to stop); returns the raw engine and the targets to measure."""
    raw = start_raw(args, preset)
    started.append(raw)
    return raw, start_apps(args, preset, count, started)


def wait_until_ready(log: RunLog, raw: Target | None, apps: list[Target], mixed: bool) -> None:
    """Waits for every app and the raw engine (if any); with a mixed load, also for each app's second engine."""
    warming = []
    for app in (a for a in apps if a.servers):
        app.servers[0].wait_http(app.notes["url"] + "healthz", timeout=max(60.0, log.left()))
        log.event(f"{app.name} ready ({app.notes['argv'][1]}, Gradio slots {app.notes['gradio_max_threads']}, "
                  f"flush {app.notes['flush_ms']} ms, UI workers {app.notes.get('ui_workers') or 'auto'}); {gpu_info()}")
        if mixed:
            warming.append(start_in_background(app.notes["url"], SECOND))
    if raw is not None:
        raw.servers[0].receive(timeout=max(60.0, log.left()))
        log.event(f"raw engine ready; {gpu_info()}")
    for thread in warming:
        thread.join(max(60.0, log.left()))
    if warming:
        log.event(f"second engine ready in every app; {gpu_info()}")


class Measurements:
    """The measuring steps of one call, in order, and what they share: the flags, the log, this
    benchmark's own processes (the rest count as others' load) and the next request's number (every
    prompt is new: no reply comes from the prefix cache)."""

    def __init__(self, args: argparse.Namespace, log: RunLog, our: list[int]) -> None:
        self.args, self.log, self.our = args, log, our
        self.index = 0
        self.warmed: dict[str, set[int]] = defaultdict(set)  # target -> levels warmed (with --rounds: once each)

    def report(self, record: dict[str, Any], label: str) -> None:
        s = record["summary"]
        queue = "" if s.get("queue_p50_ms") is None else \
            f"  gradio queue p50 {s['queue_p50_ms']:6.1f} p99 {s['queue_p99_ms']:7.1f} ms"
        self.log.event(f"{label} {record['path']:<12} ttft p50 {s['ttft_p50_ms']:7.1f} p99 {s['ttft_p99_ms']:7.1f} ms  "
                       f"itl p50 {s['itl_p50_ms']:5.2f} p99 {s['itl_p99_ms']:6.2f} ms  {s['tok_s']:7.0f} tok/s  "
                       f"cpu/1k {s['cpu_s_per_1k'] or 0:.3f} s  err {s['errors']}{queue}")

    @staticmethod
    def targets_at(level: int, raw: Target | None, apps: list[Target]) -> list[Target]:
        """The raw engine (None: not in this phase) and every measured app path that runs at this level."""
        return [raw] * (raw is not None) + [a for a in apps if (not a.notes["levels"] or level in a.notes["levels"])
                                            and a.notes.get("measured", True) and a.notes.get("closed", True)]

    @staticmethod
    def at_rates(apps: list[Target]) -> list[Target]:
        """The app doors that run at steady rates: a `visitor` door, else every measured one."""
        return [a for a in apps if a.notes.get("at_rates", a.notes.get("measured", True))]

    def cold_start(self, raw: Target | None, apps: list[Target]) -> None:
        """Each target's first burst at the largest level, unmeasured, before any measured level.

        On 2026-12-03 the first 256-stream round after a start was 0.76-0.92x of the next, on the
        raw side too, although the level's 8-token warm-up had run first: vLLM's sampler compiles a
        Triton kernel at first use (docs/benchmarks.md, "The cold first round"), which the app's own
        start-time warm-up now covers, and the raw engine's with --raw-warm-up. None with --cold:
        the first rounds are what is measured."""
        if self.args.cold:
            self.log.event("--cold: no cold-start burst, no level's warm-up")
            return
        levels = [int(x) for x in self.args.levels.split(",") if x]
        top = max(levels) if levels else self.args.warm_streams
        for target in self.targets_at(top, raw, apps):
            target.run(top, top, 800_000 + self.index, 64)
            self.index += top
            self.warmed[target.name].add(top)
        self.log.event(f"every target warmed with {top} streams of 64 tokens")
        if self.args.rate_rounds and self.args.rates:  # and each rate door once at the lowest rate, for 5 s
            rate = min(float(x) for x in self.args.rates.split(","))
            for target in [raw] * (raw is not None) + self.at_rates(apps):
                target.run(0, max(1, int(rate * 5)), 800_000 + self.index, 64, rate=rate)
                self.index += max(1, int(rate * 5))
                target.notes.pop("turns", None)
            self.log.event(f"every rate door warmed at {rate:g}/s for 5 s")

    def closed_loop(self, raw: Target | None, apps: list[Target],
                    plan: list[tuple[int, int]] | None = None) -> list[tuple[int, int]]:
        """Level by level (--rounds N: the levels N times over), every target in turn (the order rotates
        per step); returns the steps measured, (round, level). `plan`: those steps instead (--in-turn:
        the apps' phase repeats the raw engine's). Each level is warmed up before it is measured: with
        --rounds, once per target, and not the level the cold start warmed; with --cold, never."""
        args, log = self.args, self.log
        base = {int(k): int(v) for k, v in (x.split(":") for x in args.requests.split(",") if x)}
        levels = [int(x) for x in args.levels.split(",") if x]
        done: list[tuple[int, int]] = []
        for step, (r, c) in enumerate(plan if plan is not None else [(r, c) for r in range(args.rounds) for c in levels]):
            if log.left() < 30:
                log.event(f"deadline: skipping level {c} of round {r + 1} and later")
                break
            targets = self.targets_at(c, raw, apps)
            turn = step % len(targets)
            for target in targets[turn:] + targets[:turn]:
                if not args.cold and (args.rounds == 1 or c not in self.warmed[target.name]):
                    target.run(c, c, 900_000 + self.index, 8)  # warm-up: new batch shapes compile the sampler
                    self.index += c
                    self.warmed[target.name].add(c)
                    time.sleep(1)
                n = base.get(c, c)
                record = measure(target, c, n, self.index, args.max_tokens, self.our, keep_timelines=False)
                self.index += n
                record["round"] = r
                log.result["closed"].append(record)
                self.report(record, f"c={c:<3}" + (f" round {r + 1}" if args.rounds > 1 else ""))
                log.save()
            done.append((r, c))
        return done

    def mixed_loads(self, apps: list[Target], preset: Path) -> None:
        """--mixed: on each app's browser door, a burst of chat streams while visitors compare presets."""
        args, log = self.args, self.log
        chat, visitors = (int(x) for x in args.mixed.split(":"))
        for browser in (a for a in apps if a.name.endswith("-browser")):
            if log.left() < 60:
                log.event(f"deadline: no mixed load for {browser.name}")
                continue
            from bench.common import user_message
            from bench.mixed import mixed_load

            record = mixed_load(browser.notes["url"], browser, chat, visitors,
                                (load_preset(preset).name, SECOND), args.max_tokens, self.index, self.our,
                                user_message(self.index + chat, args.context_lines))
            self.index += chat
            log.result.setdefault("mixed", []).append(record)
            self.report(record, f"mixed {chat}+{visitors}x2")
            m = record["mixed"]
            log.event(f"  {m['comparisons']} comparisons, first token p50 {m['comparison_ttft_ms_p50']} "
                      f"p99 {m['comparison_ttft_ms_p99']} ms, errors {len(m['comparison_errors'])}")
            log.save()

    def at_rate(self, target: Target, rate: float, repeat: int | None = None) -> dict[str, Any]:
        """Requests arriving steadily at `rate` per second for --rate-seconds; how many replies were being
        read at once; for a door that kept its page's turns, their timelines (bench/frontend_rates.py's)."""
        n = max(1, int(rate * self.args.rate_seconds))
        first = self.index
        logs = timeline_sizes(target.notes.get("timeline"))
        t0 = time.monotonic()
        record = measure(target, 0, n, first, self.args.max_tokens, self.our, rate=rate, keep_timelines=True)
        t1 = time.monotonic()
        self.index += n
        record["p99_ttft_ms"] = pct(record["ttft_ms"], 99)
        record["readers"] = readers(record["timelines"])
        record["timelines"] = None
        s = record["summary"]
        record.update(side="raw" if target.name == "raw" else target.name, repeat=repeat,
                      ttft={"p50": round(s["ttft_p50_ms"], 1), "p99": round(s["ttft_p99_ms"], 1)}, stalls={"ms": 0})
        turns = target.notes.pop("turns", None)
        if turns is not None:
            from bench.frontend_rates import page_replies

            time.sleep(0.5)
            page = page_replies(turns, first, read_moments(target.notes.get("timeline"), logs), {}, t0, t1, slow=20)
            record["page"] = {k: page[k] for k in ("stages", "late_ms", "page_ms", "mount_ms", "stalls", "gc", "slow")}
            record["stalls"] = page["stalls"]
        self.log.result["rates"].append(record)
        self.report(record, f"rate {rate:4.1f}/s")
        if turns is not None:
            from bench.frontend_rates import print_slow

            stages = record["page"]["stages"]
            self.log.event("  p99 ms after Enter: " + ", ".join(f"{k} {v['p99']:.0f}" for k, v in stages.items() if v["n"])
                           + f"; readers at once: mean {record['readers']['mean']}, max {record['readers']['max']}; "
                           f"loop stalls > 20 ms: {record['stalls']['count']} ({record['stalls']['ms']} ms); "
                           f"arrivals started late: p99 {record['page']['late_ms']['p99']:.0f} ms")
            print_slow({"rate": rate, **record["page"]})
        self.log.save()
        return record

    def rates(self, raw: Target | None, apps: list[Target], plan: list[Any] | None = None) -> list[Any]:
        """Steady arrivals: --rate-rounds or the rising search; returns what the apps are to repeat
        without the raw engine (`plan`, --in-turn)."""
        if self.args.rate_rounds:
            return self.rate_rounds(raw, apps, plan)
        return self.rate_search(raw, apps, plan)

    def rate_rounds(self, raw: Target | None, apps: list[Target],
                    plan: list[tuple[float, int]] | None = None) -> list[tuple[float, int]]:
        """--rate-rounds rounds of every --rates rate (the raw engine and each rate door in turn, the
        order rotating), then --rates-beyond, rising, one round each while the raw engine holds
        --ttft-slo-ms. A rate where the raw engine misses it ends the rising: the app is not run there.
        Returns the (rate, round) runs the apps are to have; `plan`: only those, without the raw engine."""
        args, log = self.args, self.log
        doors = [raw] * (raw is not None) + self.at_rates(apps)
        if plan is not None:
            for rate, repeat in plan:
                if log.left() < args.rate_seconds + 20:
                    log.event(f"deadline: no more rates (next {rate:g}/s, round {repeat + 1})")
                    break
                for target in doors:
                    self.at_rate(target, rate, repeat)
            return plan
        assert raw is not None
        done: list[tuple[float, int]] = []
        rates = [float(x) for x in args.rates.split(",") if x]
        turn = 0
        for repeat in range(args.rate_rounds):
            for rate in rates:
                if log.left() < args.rate_seconds + 20:
                    log.event(f"deadline: round {repeat + 1} stops before {rate:g}/s")
                    return done
                for target in doors[turn % len(doors):] + doors[:turn % len(doors)]:
                    self.at_rate(target, rate, repeat)
                done.append((rate, repeat))
                turn += 1
        for rate in (float(x) for x in args.rates_beyond.split(",") if x):
            if log.left() < 2 * (args.rate_seconds + 10):
                log.event(f"deadline: no run at {rate:g}/s")
                return done
            if self.at_rate(raw, rate, 0)["p99_ttft_ms"] >= args.ttft_slo_ms:
                log.event(f"the raw engine's p99 first token passed {args.ttft_slo_ms:g} ms at {rate:g}/s: no higher rate")
                return done
            for target in doors[1:]:
                self.at_rate(target, rate, 0)
            done.append((rate, 0))
        return done

    def rate_search(self, raw: Target | None, apps: list[Target], plan: list[float] | None = None) -> list[float]:
        """Steady arrivals on the raw engine, rising, until p99 TTFT passes the objective; then each
        app at the highest rate that passed and the first that failed (returned); `plan`: the apps at
        those rates, without the raw engine."""
        args, log = self.args, self.log
        if plan is not None:
            self.apps_at(apps, plan)
            return plan
        assert raw is not None
        best: float | None = None
        failed: float | None = None
        for rate in (float(x) for x in args.rates.split(",") if x):
            if log.left() < args.rate_seconds + 45:
                log.event(f"deadline: stopping the rate search before {rate}/s")
                break
            record = self.at_rate(raw, rate)
            if record["p99_ttft_ms"] < args.ttft_slo_ms:
                best = rate
            else:
                failed = rate
                break
        log.result["best_raw_rate"] = best
        chosen = [r for r in (best, failed) if r]
        self.apps_at(apps, chosen)
        return chosen

    def apps_at(self, apps: list[Target], rates: list[float]) -> None:
        for rate in rates:
            for app in self.at_rates(apps):
                if self.log.left() < self.args.rate_seconds + 30:
                    self.log.event(f"deadline: {app.name} not run at {rate}/s")
                    continue
                self.at_rate(app, rate)


def timeline_sizes(folder: Path | None) -> dict[Path, int]:
    """Every process's timeline file in `folder` (bench/gpu_app.py) and its size now."""
    if folder is None or not folder.exists():
        return {}
    return {p: p.stat().st_size for p in folder.glob("timeline-*.jsonl")}


def read_moments(folder: Path | None, before: dict[Path, int]) -> list[dict[str, Any]]:
    """What each process recorded in `folder` since `before` (files that appeared since, from their
    start), each moment with its process's id."""
    from bench.frontend_rates import read_lines

    moments: list[dict[str, Any]] = []
    for path in sorted(folder.glob("timeline-*.jsonl")) if folder and folder.exists() else []:
        pid = int(path.stem.split("-")[1])
        moments += [{**m, "pid": pid} for m in read_lines(path, before.get(path, 0))]
    return sorted(moments, key=lambda m: m["t"])


def readers(timelines: list[dict[str, Any]]) -> dict[str, float]:
    """Replies being read at once (sent, not yet ended) while arrivals were steady: the time-weighted
    mean from 5 s after the first request (from the first, for runs under 10 s) to the last request, and the most."""
    spans = [(t["started"], t["arrivals"][-1][0] if t["arrivals"] else t["started"]) for t in timelines]
    if not spans:
        return {"mean": 0.0, "max": 0}
    first, last = min(a for a, _ in spans), max(a for a, _ in spans)
    lo = first + 5.0 if last - first > 10.0 else first
    events = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    now, at, area, most = 0, lo, 0.0, 0
    for t, step in events:
        if lo < t and at < last:
            area += now * (min(t, last) - at)
            at = min(t, last)
        now += step
        most = max(most, now)
    return {"mean": round(area / (last - lo), 1) if last > lo else float(most), "max": most}


# --in-turn: the raw engine alone, then the apps alone. The raw engine gets this share of the time
# left once it is ready (less APP_START_S), so that the apps' phase, whose rounds cost more (pages
# loaded, client processes started), can repeat every step it measured.
RAW_SHARE = 0.42
APP_START_S = 90.0  # the raw engine stopped, its memory freed, the apps and their engine started (compile cache warm)


def in_turn(args: argparse.Namespace, log: RunLog, preset: Path, count: Callable[[str], int],
            started: list[Target]) -> None:
    """--in-turn: the raw engine alone on the GPU, measured, stopped until its GPU memory is free;
    then the apps alone, measured at the steps the raw engine was (levels, rounds, rates)."""
    before = gpu_used_mib()
    log.event(f"starting the raw engine alone; {log.result['gpu']}")
    raw = start_raw(args, preset, cache="shared")
    started.append(raw)
    wait_until_ready(log, raw, [], False)
    steps = Measurements(args, log, our=[raw.servers[0].pid, os.getpid()])
    deadline = log.deadline
    log.deadline = min(deadline, time.monotonic() - log.t_start + max(0.0, log.left() - APP_START_S) * RAW_SHARE)
    log.event(f"the raw engine's steps start until {log.deadline:.0f} s")
    try:
        steps.cold_start(raw, [])
        closed = steps.closed_loop(raw, [])
        rates = steps.rates(raw, [])
    finally:
        log.deadline = deadline
    raw.servers[0].stop(grace=15)
    wait_gpu_free(log, before)
    log.event(f"starting {len(args.apps)} app(s) alone")
    apps = start_apps(args, preset, count, started, cache="shared")
    wait_until_ready(log, None, apps, False)
    steps.our = [t.servers[0].pid for t in started if t.servers and t.servers[0].alive()] + [os.getpid()]
    steps.cold_start(None, apps)
    steps.closed_loop(None, apps, plan=closed)
    steps.rates(None, apps, plan=rates)


def gpu_used_mib() -> int | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20).stdout.split()
        return int(out[0])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return None


def wait_gpu_free(log: RunLog, before: int | None, timeout: float = 120.0) -> None:
    """Until the GPU holds no more than it did before the raw engine started (+ 1 GiB), for `timeout` at most."""
    t0 = time.monotonic()
    while (used := gpu_used_mib()) is not None and before is not None and used > before + 1024:
        if time.monotonic() - t0 > timeout:
            log.event(f"the GPU still holds {used} MiB ({before} before the raw engine) after {timeout:.0f} s: going on")
            return
        time.sleep(1)
    if used is None or before is None:
        log.event("the raw engine stopped (no GPU memory to wait for)")
    else:
        log.event(f"the raw engine stopped; the GPU holds {used} MiB ({before} before it started), after "
                  f"{time.monotonic() - t0:.1f} s")


def stop_all(started: list[Target], log: RunLog, folder: Path) -> None:
    """Stops every server, saves the result, and keeps each server's last log lines in `folder`."""
    for target in started:
        for server in target.servers:
            server.stop(grace=15)
    log.save()
    for target in started:
        for server in target.servers:
            tail = folder / f"{server.log_path.stem}-tail.log"
            tail.write_text(server.log_tail(200))


def spread(values: list[float]) -> dict[str, float] | None:
    values = [v for v in values if not math.isnan(v)]
    return {"median": statistics.median(values), "min": min(values), "max": max(values)} if values else None


def level_rounds(closed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each level's rounds per app path against the raw engine's: the k-th round of a path paired with
    the raw engine's k-th at that level; tok/s and p99 first token as ratios (median and range)."""
    rounds: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for record in closed:
        rounds[(record["concurrency"], record["path"])].append(record["summary"])
    rows = []
    for (level, path), mine in sorted(rounds.items()):
        raws = rounds.get((level, "raw"), [])
        if path == "raw" or not raws:
            continue
        pairs = list(zip(raws, mine, strict=False))
        rows.append({
            "streams": level, "path": path, "rounds": len(pairs),
            **{f"{side}{key}": [round(pair[i][key], 1) for pair in pairs]  # NaN where a round had no reply
               for i, side in ((0, "raw_"), (1, "")) for key in ("tok_s", "ttft_p50_ms", "ttft_p99_ms")},
            "tok_s_x_raw": spread([a["tok_s"] / w["tok_s"] for w, a in pairs if w["tok_s"]]),
            "ttft_p99_x_raw": spread([a["ttft_p99_ms"] / w["ttft_p99_ms"] for w, a in pairs if w["ttft_p99_ms"]]),
            "errors": sum(a["errors"] for _, a in pairs), "raw_errors": sum(w["errors"] for w, _ in pairs),
        })
    return rows


def rounds_table(rows: list[dict[str, Any]]) -> str:
    def x(s: dict[str, float] | None) -> str:
        return f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]" if s else "-"

    def each(values: list[float]) -> str:
        return ", ".join(format(v, ",.0f") if not math.isnan(v) else "-" for v in values)

    lines = ["| streams | path | rounds | raw tok/s | path tok/s | tok/s x raw: median [range] | raw TTFT p50 / p99, ms "
             "| path TTFT p50 / p99, ms | p99 TTFT x raw: median [range] | errors (path, raw) |",
             "| ---: | --- | ---: | --- | --- | ---: | --- | --- | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['streams']} | {r['path']} | {r['rounds']} | {each(r['raw_tok_s'])} | {each(r['tok_s'])} "
                     f"| {x(r['tok_s_x_raw'])} | {each(r['raw_ttft_p50_ms'])} / {each(r['raw_ttft_p99_ms'])} "
                     f"| {each(r['ttft_p50_ms'])} / {each(r['ttft_p99_ms'])} | {x(r['ttft_p99_x_raw'])} "
                     f"| {r['errors']}, {r['raw_errors']} |")
    return "\n".join(lines)


def first_rounds(closed: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """--cold: each path's rounds at each level in order (tok/s, p99 first token, errors), and its first
    round against the median of its others (None without others, or where a round had no reply)."""
    rounds: dict[tuple[str, int], list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for record in closed:
        rounds[(record["path"], record["concurrency"])].append((record.get("round", 0), record["summary"]))

    def first_x_others(values: list[float]) -> float | None:
        others = [v for v in values[1:] if not math.isnan(v)]
        if not others or math.isnan(values[0]) or not statistics.median(others):
            return None
        return round(values[0] / statistics.median(others), 3)

    rows = []
    for (path, level), done in sorted(rounds.items(), key=lambda item: (item[0][0] != "raw", item[0])):
        summaries = [summary for _, summary in sorted(done, key=lambda item: item[0])]
        tok_s = [summary["tok_s"] for summary in summaries]
        p99 = [summary["ttft_p99_ms"] for summary in summaries]
        rows.append({"path": path, "streams": level, "rounds": len(summaries),
                     "tok_s": [round(v, 1) for v in tok_s], "ttft_p99_ms": [round(v, 1) for v in p99],
                     "errors": [summary["errors"] for summary in summaries],
                     "first_x_others_tok_s": first_x_others(tok_s), "first_x_others_ttft_p99": first_x_others(p99)})
    return rows


def first_rounds_lines(rows: list[dict[str, Any]]) -> list[str]:
    def x(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    def each(values: list[float]) -> str:
        return ", ".join(format(v, ",.0f") if not math.isnan(v) else "-" for v in values)

    return [f"{r['path']:<12} c={r['streams']:<4} tok/s {each(r['tok_s'])}; p99 first token {each(r['ttft_p99_ms'])} ms; "
            f"errors {sum(r['errors'])}; first round / median of the others: tok/s {x(r['first_x_others_tok_s'])}, "
            f"p99 first token {x(r['first_x_others_ttft_p99'])}" for r in rows]


def print_summary(log: RunLog) -> None:
    result = log.result
    summaries = [Summary(**r["summary"]) for r in result["closed"]]
    print(f"\n{result['measured']}")
    print("\n" + table(summaries) + "\n\n" + ratio_table(summaries, "raw"))
    if result.get("levels"):
        print("\neach path's k-th round against the raw engine's k-th at that level:\n" + rounds_table(result["levels"]))
    if result.get("first_rounds"):
        print("\n--cold, each path's rounds in order (no warm-up of ours before the first):\n"
              + "\n".join(first_rounds_lines(result["first_rounds"])))
    for r in result["rates"]:
        print(f"rate {r['rate']:5.1f}/s {r['path']:<12} p99 TTFT {r['p99_ttft_ms']:7.1f} ms  "
              f"p50 {r['summary']['ttft_p50_ms']:7.1f} ms  {r['summary']['tok_s']:6.0f} tok/s  "
              f"readers {r.get('readers', {}).get('mean', '-')}")
    if any(r.get("repeat") is not None for r in result["rates"]):
        from bench.frontend_rates import table as rate_table

        print("\n" + rate_table([r for r in result["rates"] if r.get("repeat") is not None]))
    print(f"results: {log.out}  ({time.monotonic() - log.t_start:.0f} s)")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    t_start = time.monotonic()
    use_descriptor_limit()  # for the raw engine's front end too (its children inherit it)
    if args.kv_gib is None:
        args.kv_gib = kv_alone(args.gpu_mem) if args.in_turn and not args.cpu_smoke else 32.0
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    cfg = write_model(args.model_dir, args.tok, args.shape)
    engine = engine_for(args)
    device = "cpu" if args.cpu_smoke else "gpu"
    preset = write_preset(Path("/tmp/bench-gpu-presets"), args.model_dir, engine, device, args.max_tokens)
    if args.mixed:  # the raw engine reads only the first preset (bench/raw_engine.py --preset)
        write_preset(Path("/tmp/bench-gpu-presets"), args.model_dir, second_engine(engine), device, args.max_tokens,
                     name=SECOND, file="bench-gpu-second.yaml")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))
    count = lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    kv = "" if args.cpu_smoke else f", {args.kv_gib:g} GiB of KV cache each"
    log = RunLog(args.out / f"gpu-{stamp}.json", {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "gpu": gpu_info(), "versions": versions(),
        "model_config": cfg, "engine": engine, "args": {k: str(v) for k, v in vars(args).items()},
        "weights": "random (load_format: dummy)", "in_turn": args.in_turn, "turns": args.turns,
        "measured": (f"measured in turn: the raw engine alone on the {device.upper()}, then the app(s) alone, at the same "
                     f"levels, rounds and rates{kv}" if args.in_turn else
                     f"measured side by side: the raw engine and the app(s) on the {device.upper()} together{kv}")
                    + f"; max_num_seqs {engine['max_num_seqs']}; {args.turns} turn(s) a conversation"
                    + ("; --cold: no warm-up of ours before the measured rounds" if args.cold else "")
                    + ("; the raw engine started with the app's warm-up" if args.raw_warm_up else ""),
        "closed": [], "rates": [], "events": [],
    }, args.deadline, t_start)
    started: list[Target] = []
    try:
        if args.in_turn:
            in_turn(args, log, preset, count, started)
        else:
            log.event(f"starting the raw engine and {len(args.apps)} app(s); {log.result['gpu']}")
            raw, apps = start_targets(args, preset, count, started)
            wait_until_ready(log, raw, apps, bool(args.mixed))
            steps = Measurements(args, log, our=[t.servers[0].pid for t in started] + [os.getpid()])
            steps.cold_start(raw, apps)
            steps.closed_loop(raw, apps)
            if args.mixed:
                steps.mixed_loads(apps, preset)
            steps.rates(raw, apps)
    finally:
        stop_all(started, log, args.out)
        log.result["levels"] = level_rounds(log.result["closed"])
        if args.cold:
            log.result["first_rounds"] = first_rounds(log.result["closed"])
        log.save()
    print_summary(log)
    return 0


if __name__ == "__main__":
    sys.exit(main())
