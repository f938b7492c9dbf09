"""Which CPU-engine settings help: the raw engine (bench/raw_engine.py) under each candidate setting.

    .venv/bin/python -m bench.cpu_engine                       # every candidate, 2 rounds
    .venv/bin/python -m bench.cpu_engine --only baseline,bind-both --rounds 3

Each candidate is an environment for the engine's processes and/or engine arguments laid over
the benchmark preset. For each round and candidate in turn (an engine start each, about a minute),
it measures one stream (--single requests one after another) and --streams streams at once, with
fixed-length replies, and records the machine's load from other processes meanwhile. The table
gives medians over rounds, and each candidate's ratio to the baseline.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from bench.common import summarize
from bench.paths import raw_path
from bench.procs import ROOT, machine_busy_seconds, tree_cpu_seconds
from bench.run import DEFAULT_PRESET, RESULTS

VENV_LIB = Path(sys.prefix) / "lib"
TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")  # Debian's libtcmalloc-minimal4


@dataclass
class Candidate:
    name: str
    env: dict[str, str] = field(default_factory=dict)
    engine: dict[str, Any] = field(default_factory=dict)
    why: str = ""


# vLLM's own defaults, as the app ran before it tuned the CPU engine (chat/cpu.py): float32, the
# engine's threads on one core (the other reserved for the front end), the C library's malloc.
BEFORE_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "auto", "LD_PRELOAD": ""}
BEFORE_ENGINE = {"dtype": "float32"}


def changed(name: str, env: dict[str, str] | None = None, engine: dict[str, Any] | None = None, why: str = "") -> Candidate:
    """vLLM's defaults with one change."""
    return Candidate(name, {**BEFORE_ENV, **(env or {})}, {**BEFORE_ENGINE, **(engine or {})}, why)


CANDIDATES = [
    changed("baseline", why="vLLM's defaults: float32, engine on 1 core, the other reserved for the front end"),
    changed("iomp", {"LD_PRELOAD": str(VENV_LIB / "libiomp5.so")}, why="Intel OpenMP (bundled) instead of GNU OpenMP"),
    changed("tcmalloc", {"LD_PRELOAD": str(TCMALLOC)}, why="tcmalloc (Debian libtcmalloc-minimal4)"),
    changed("tcmalloc+iomp", {"LD_PRELOAD": f"{TCMALLOC}:{VENV_LIB / 'libiomp5.so'}"}, why="both"),
    changed("bind-both", {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, why="the engine's OpenMP threads on both cores"),
    changed("nobind-2threads", {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "2"},
            why="no binding, two OpenMP threads"),
    changed("bf16", engine={"dtype": "bfloat16"}, why="bfloat16 weights (this CPU has AVX512-BF16)"),
    changed("mnbt-512", engine={"max_num_batched_tokens": 512}, why="smaller prefill chunks"),
    changed("bf16+bind-both", {"VLLM_CPU_OMP_THREADS_BIND": "0-1"}, {"dtype": "bfloat16"}, why="the two best together"),
    changed("bf16+bind-both+tcmalloc", {"VLLM_CPU_OMP_THREADS_BIND": "0-1", "LD_PRELOAD": str(TCMALLOC)},
            {"dtype": "bfloat16"}, why="and tcmalloc"),
    Candidate("app", why="what the app picks on this machine (chat/cpu.py)"),
]


def preset_with(engine: dict[str, Any], folder: Path) -> Path:
    data = yaml.safe_load(DEFAULT_PRESET.read_text())
    data["engine"] = {**data["engine"], **engine}
    path = folder / DEFAULT_PRESET.name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def measure(candidate: Candidate, single: int, streams: int, max_tokens: int, logs: Path) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        preset = preset_with(candidate.engine, Path(tmp))
        t0 = time.monotonic()
        target = raw_path(preset, logs / candidate.name, candidate.env, 0)
        try:
            target.servers[0].receive(timeout=900)
            start_s = time.monotonic() - t0
            target.run(4, 4, 70_000, 8)  # warm-up
            out: dict[str, Any] = {"start_s": start_s}
            for label, c, n in (("single", 1, single), ("streams", streams, streams)):
                busy0, ours0, w0 = machine_busy_seconds(), tree_cpu_seconds([target.servers[0].pid]), time.monotonic()
                s = summarize(candidate.name, c, target.run(c, n, 71_000, max_tokens))
                wall = time.monotonic() - w0
                others = ((machine_busy_seconds() - busy0) - (tree_cpu_seconds([target.servers[0].pid]) - ours0)) / wall
                out[label] = {"tok_s": s.tok_s, "ttft_p50_ms": s.ttft_p50_ms, "tpot_ms": s.tpot_ms,
                              "errors": s.errors, "other_cores": max(others, 0.0)}
            return out
        finally:
            target.servers[0].stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.cpu_engine", description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", default="", help="comma-separated candidate names (default: all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--single", type=int, default=3, help="one-stream requests per measurement")
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    args = ap.parse_args(argv)
    chosen = [c for c in CANDIDATES if not args.only or c.name in args.only.split(",")]
    if any("tcmalloc" in c.name for c in chosen) and not TCMALLOC.exists():
        print(f"{TCMALLOC} is missing (apt-get install libtcmalloc-minimal4): skipping the tcmalloc candidates")
        chosen = [c for c in chosen if "tcmalloc" not in c.name]
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = RESULTS / f"cpu-engine-{stamp}.json"
    logs = RESULTS / f"logs-cpu-engine-{stamp}"
    results: dict[str, Any] = {"date": stamp, "preset": str(DEFAULT_PRESET.relative_to(ROOT)), "args": vars(args),
                               "candidates": {c.name: {"env": c.env, "engine": c.engine, "why": c.why, "rounds": []}
                                              for c in chosen}}
    for r in range(args.rounds):
        order = chosen[r % len(chosen):] + chosen[:r % len(chosen)]
        for candidate in order:
            try:
                m = measure(candidate, args.single, args.streams, args.max_tokens, logs)
            except Exception as exc:  # noqa: BLE001 - one failing setting must not end the comparison
                m = {"error": repr(exc)[:500]}
            results["candidates"][candidate.name]["rounds"].append(m)
            out.write_text(json.dumps(results, indent=1))
            if "error" in m:
                print(f"round {r} {candidate.name:<16} FAILED {m['error'][:200]}", flush=True)
            else:
                print(f"round {r} {candidate.name:<16} 1 stream {m['single']['tok_s']:5.1f} tok/s "
                      f"(TTFT {m['single']['ttft_p50_ms']:4.0f} ms)  {args.streams} streams "
                      f"{m['streams']['tok_s']:5.1f} tok/s  start {m['start_s']:3.0f} s  "
                      f"others {m['single']['other_cores']:.2f}/{m['streams']['other_cores']:.2f} cores", flush=True)

    def med(name: str, label: str, key: str) -> float:
        xs = [m[label][key] for m in results["candidates"][name]["rounds"] if "error" not in m]
        return statistics.median(xs) if xs else float("nan")

    base1, base16 = med("baseline", "single", "tok_s"), med("baseline", "streams", "tok_s")
    print(f"\n{'setting':<16} {'1 stream':>9} {'x':>5} {'TTFT ms':>8} {f'{args.streams} streams':>11} {'x':>5}")
    for c in chosen:
        one, many = med(c.name, "single", "tok_s"), med(c.name, "streams", "tok_s")
        print(f"{c.name:<16} {one:9.1f} {one / base1:5.2f} {med(c.name, 'single', 'ttft_p50_ms'):8.0f} "
              f"{many:11.1f} {many / base16:5.2f}   {c.why}")
    print(f"results: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
