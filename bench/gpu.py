"""The app against the raw engine on one GPU, with a Llama-3-8B-shaped model of random weights.

Runs on the GPU host after /work/shared/gpu/stage.sh's tarball is unpacked into /tmp/site
(README "Benchmark"); the weights are made on the GPU by vLLM (load_format: dummy), so replies are
gibberish and only the timings mean anything. In one call, within --deadline seconds:

  1. writes the model's config (Llama-3-8B geometry, SmolLM2's tokenizer) and a preset for it;
  2. starts the raw engine (bench/raw_engine.py) and one or more app variants (app.py, or
     bench/patched_app.py with another number of Gradio queue slots; --app) side by side on the GPU, each with
     its own KV-cache budget (kv_cache_memory_bytes) so that they can start together;
  3. closed loop at each concurrency level, every target in turn (each level warmed up first);
  4. steady arrivals (open loop): rising request rates on the raw engine until its p99 time to
     first token reaches --ttft-slo-ms, then the app at the highest rate that passed (and the first
     that failed, when time allows);
  5. writes gpu-<time>.json and prints a table (results also under $OUT when set).

    python3 -m bench.gpu --tok .gpu/tok --out $OUT
    python -m bench.gpu --shape 135m --cpu-smoke     # the same steps on this machine's CPU engine
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import SYSTEM_PROMPT, Summary, pct, ratio_table, table
from bench.paths import Target, app_path, browser_path, measure, raw_path, websocket_path
from bench.procs import ROOT
from bench.run import versions
from chat.presets import load_preset

SHAPES = {
    # Llama-3-8B geometry with SmolLM2's 49152-token vocabulary (about 7.4 B parameters)
    "8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, rope_theta=500000.0, tie_word_embeddings=False),
    # SmolLM2-135M geometry (smoke runs)
    "135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9,
                 num_key_value_heads=3, head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
}


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
            elif key in ("ws", "browser", "api"):
                setattr(variant, key, value not in ("0", "false", "no"))
            else:
                raise argparse.ArgumentTypeError(f"unknown app option {key!r}")
        return variant


def write_model(model_dir: Path, tok_dir: Path, shape: str) -> dict[str, Any]:
    model_dir.mkdir(parents=True, exist_ok=True)
    s = dict(SHAPES[shape])
    theta = s.pop("rope_theta")
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
           "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "vocab_size": 49152, "bos_token_id": 1,
           "eos_token_id": 2, "pad_token_id": 2, "attention_bias": False, "mlp_bias": False,
           "torch_dtype": "bfloat16", "dtype": "bfloat16", "initializer_range": 0.02, "use_cache": True,
           "rope_theta": theta, "rope_parameters": {"rope_theta": theta, "rope_type": "default"}, **s}
    (model_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "special_tokens_map.json"):
        if (tok_dir / name).exists():
            shutil.copy(tok_dir / name, model_dir / name)
    (model_dir / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2,
                                                                   "pad_token_id": 2}))
    return cfg


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


def main(argv: list[str] | None = None) -> int:
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
    ap.add_argument("--ttft-slo-ms", type=float, default=800.0)
    ap.add_argument("--kv-gib", type=float, default=32.0, help="KV cache per engine (two engines share the GPU)")
    ap.add_argument("--gpu-mem", type=float, default=0.4)
    ap.add_argument("--client-procs", type=int, default=4)
    ap.add_argument("--app", dest="apps", action="append", type=AppVariant.parse, default=[],
                    help="an app to run beside the raw engine, NAME[:max_threads=N][:flush_ms=N][:ui_workers=N][:levels=1/8/..][:ws=1][:browser=1][:api=0]; "
                         "max_threads launches it through bench/patched_app.py; repeatable (default: one 'app')")
    ap.add_argument("--mixed", default="", help="CHAT:VISITORS: after the closed loop, a burst of CHAT browser "
                    "streams while VISITORS compare the preset with one on another engine (e.g. 128:16)")
    ap.add_argument("--deadline", type=float, default=520.0, help="seconds; no step starts after it")
    ap.add_argument("--cpu-smoke", action="store_true", help="run the same steps on the CPU engine (tiny)")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", ROOT / "bench" / "results")))
    args = ap.parse_args(argv)
    args.apps = args.apps or [AppVariant("app")]
    t_start = time.monotonic()
    left = lambda: args.deadline - (time.monotonic() - t_start)  # noqa: E731
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = args.out / f"gpu-{stamp}.json"
    logs = args.out / "logs"

    cfg = write_model(args.model_dir, args.tok, args.shape)
    if args.cpu_smoke:
        engine = {"load_format": "dummy", "dtype": "float32", "max_model_len": 4096, "enforce_eager": True,
                  "kv_cache_memory_bytes": 1 << 30, "max_num_seqs": 64}
    else:
        engine = {"load_format": "dummy", "dtype": "bfloat16", "max_model_len": 4096,
                  "gpu_memory_utilization": args.gpu_mem, "kv_cache_memory_bytes": int(args.kv_gib * 2**30),
                  "max_num_seqs": 256, "max_num_batched_tokens": 8192, "seed": 0}
    device = "cpu" if args.cpu_smoke else "gpu"
    preset = write_preset(Path("/tmp/bench-gpu-presets"), args.model_dir, engine, device, args.max_tokens)
    if args.mixed:  # the raw engine reads only the first preset (bench/raw_engine.py --preset)
        write_preset(Path("/tmp/bench-gpu-presets"), args.model_dir, second_engine(engine), device, args.max_tokens,
                     name=SECOND, file="bench-gpu-second.yaml")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(args.model_dir))
    count = lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    result: dict[str, Any] = {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "gpu": gpu_info(), "versions": versions(),
        "model_config": cfg, "engine": engine, "args": {k: str(v) for k, v in vars(args).items()},
        "weights": "random (load_format: dummy)", "closed": [], "rates": [], "events": [],
    }

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    def event(text: str) -> None:
        line = f"[{time.monotonic() - t_start:6.1f}s] {text}"
        print(line, flush=True)
        result["events"].append(line)

    # Separate compile caches: the engines compile at the same time.
    env = {"VLLM_USE_FLASHINFER_SAMPLER": "0"}
    started: list[Target] = []
    try:
        event(f"starting the raw engine and {len(args.apps)} app(s); {result['gpu']}")

        def own(name: str) -> dict[str, str]:
            return {**env, "VLLM_CACHE_ROOT": f"/tmp/vllm-cache-{name}", "TRITON_CACHE_DIR": f"/tmp/triton-{name}"}

        raw = raw_path(preset, logs, own("raw"), args.context_lines)
        started.append(raw)
        apps = []
        for variant in args.apps:
            apps.append(app_path(variant.name, preset, logs, own(variant.name), count, args.context_lines,
                                 flush_ms=variant.flush_ms, client_procs=args.client_procs,
                                 max_threads=variant.max_threads, ui_workers=variant.ui_workers))
            apps[-1].notes["levels"] = variant.levels
            apps[-1].notes["measured"] = variant.api
            started.append(apps[-1])
        for variant, app in zip(list(args.apps), list(apps), strict=True):
            if variant.ws:
                ws = websocket_path(app, preset, count, args.context_lines, args.client_procs)
                ws.notes["levels"] = variant.levels
                apps.append(ws)
            if variant.browser:
                browser = browser_path(app, count, args.context_lines, args.client_procs)
                browser.notes["levels"] = variant.levels
                apps.append(browser)
        warming = []
        for app in (a for a in apps if a.servers):
            app.servers[0].wait_http(app.notes["url"] + "healthz", timeout=max(60.0, left()))
            event(f"{app.name} ready ({app.notes['argv'][1]}, Gradio slots {app.notes['gradio_max_threads']}, "
                  f"flush {app.notes['flush_ms']} ms, UI workers {app.notes.get('ui_workers') or 'auto'}); {gpu_info()}")
            if args.mixed:
                warming.append(start_in_background(app.notes["url"], SECOND))
        raw.servers[0].receive(timeout=max(60.0, left()))
        event("raw engine ready")
        for thread in warming:
            thread.join(max(60.0, left()))
        if warming:
            event(f"second engine ready in every app; {gpu_info()}")
        our = [t.servers[0].pid for t in started] + [os.getpid()]
        base = {int(k): int(v) for k, v in (x.split(":") for x in args.requests.split(",") if x)}
        index = 0

        def report(record: dict[str, Any], label: str) -> None:
            s = record["summary"]
            queue = "" if s.get("queue_p50_ms") is None else \
                f"  gradio queue p50 {s['queue_p50_ms']:6.1f} p99 {s['queue_p99_ms']:7.1f} ms"
            event(f"{label} {record['path']:<12} ttft p50 {s['ttft_p50_ms']:7.1f} p99 {s['ttft_p99_ms']:7.1f} ms  "
                  f"itl p50 {s['itl_p50_ms']:5.2f} p99 {s['itl_p99_ms']:6.2f} ms  {s['tok_s']:7.0f} tok/s  "
                  f"cpu/1k {s['cpu_s_per_1k'] or 0:.3f} s  err {s['errors']}{queue}")

        # Closed loop, level by level, every target in turn (the order rotates per level).
        for li, c in enumerate(int(x) for x in args.levels.split(",")):
            if left() < 30:
                event(f"deadline: skipping level {c} and later")
                break
            targets = [raw] + [a for a in apps if (not a.notes["levels"] or c in a.notes["levels"])
                               and a.notes.get("measured", True)]
            turn = li % len(targets)
            for target in targets[turn:] + targets[:turn]:
                target.run(c, c, 900_000 + index, 8)  # warm-up: new batch shapes compile the sampler
                index += c
                time.sleep(1)
                n = base.get(c, c)
                record = measure(target, c, n, index, args.max_tokens, our, keep_timelines=False)
                index += n
                result["closed"].append(record)
                report(record, f"c={c:<3}")
                save()

        if args.mixed:
            chat, visitors = (int(x) for x in args.mixed.split(":"))
            for browser in (a for a in apps if a.name.endswith("-browser")):
                if left() < 60:
                    event(f"deadline: no mixed load for {browser.name}")
                    continue
                from bench.common import user_message
                from bench.mixed import mixed_load

                record = mixed_load(browser.notes["url"], browser, chat, visitors,
                                    (load_preset(preset).name, SECOND), args.max_tokens, index, our,
                                    user_message(index + chat, args.context_lines))
                index += chat
                result.setdefault("mixed", []).append(record)
                report(record, f"mixed {chat}+{visitors}x2")
                m = record["mixed"]
                event(f"  {m['comparisons']} comparisons, first token p50 {m['comparison_ttft_ms_p50']} "
                      f"p99 {m['comparison_ttft_ms_p99']} ms, errors {len(m['comparison_errors'])}")
                save()

        def at_rate(target: Target, rate: float) -> dict[str, Any]:
            """Requests arriving steadily at `rate` per second for --rate-seconds."""
            nonlocal index
            n = max(1, int(rate * args.rate_seconds))
            record = measure(target, 0, n, index, args.max_tokens, our, rate=rate, keep_timelines=False)
            index += n
            record["p99_ttft_ms"] = pct(record["ttft_ms"], 99)
            result["rates"].append(record)
            report(record, f"rate {rate:4.1f}/s")
            save()
            return record

        # Steady arrivals on the raw engine, rising, until p99 TTFT passes the objective.
        best: float | None = None
        failed: float | None = None
        for rate in (float(x) for x in args.rates.split(",") if x):
            if left() < args.rate_seconds + 45:
                event(f"deadline: stopping the rate search before {rate}/s")
                break
            record = at_rate(raw, rate)
            if record["p99_ttft_ms"] < args.ttft_slo_ms:
                best = rate
            else:
                failed = rate
                break
        result["best_raw_rate"] = best
        for rate in [r for r in (best, failed) if r]:
            for app in (a for a in apps if not a.notes.get("bursts_only") and a.notes.get("measured", True)):
                if left() < args.rate_seconds + 30:
                    event(f"deadline: {app.name} not run at {rate}/s")
                    continue
                at_rate(app, rate)
    finally:
        for target in started:
            for server in target.servers:
                server.stop(grace=15)
        save()
        for target in started:
            for server in target.servers:
                tail = args.out / f"{server.log_path.stem}-tail.log"
                tail.write_text(server.log_tail(200))

    summaries = [Summary(**r["summary"]) for r in result["closed"]]
    print("\n" + table(summaries) + "\n\n" + ratio_table(summaries, "raw"))
    for r in result["rates"]:
        print(f"rate {r['rate']:5.1f}/s {r['path']:<12} p99 TTFT {r['p99_ttft_ms']:7.1f} ms  "
              f"p50 {r['summary']['ttft_p50_ms']:7.1f} ms  {r['summary']['tok_s']:6.0f} tok/s")
    print(f"results: {out}  ({time.monotonic() - t_start:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
