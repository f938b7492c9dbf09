"""The ways to one model that bench.run and bench.gpu compare, each a `Target` with its servers
and a runner: the raw engine in a process of its own, the app over Gradio's queue protocol, the
app's WebSocket API, the app as a page uses it (bench/gradio_browser.py), and vLLM's Gradio example.
`measure` drives one of them at one concurrency."""

from __future__ import annotations

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
    Timeline,
    earlier_turns,
    summarize,
    tokens_per_update,
    user_message,
)
from bench.http_client import send_all
from bench.procs import Server, base_env, cpu_seconds, free_port, machine_busy_seconds, python, tree_cpu_seconds


@dataclass
class Target:
    """One way of serving the model, as the driver sees it."""

    name: str
    servers: list[Server]
    frontend_pids: Callable[[], list[int]]  # whose CPU time counts as the front end's
    run: Callable[..., list[Timeline]]  # (concurrency, requests, first_index, max_tokens, rate=None)
    notes: dict[str, Any] = field(default_factory=dict)


# --- the three paths --------------------------------------------------------------------------


def raw_path(preset: Path, logs: Path, env: dict[str, str], context_lines: int, turns: int = 1,
             warm_up: bool = False) -> Target:
    """`turns`: each conversation holds `turns` - 1 earlier turns before its message (bench.common.earlier_turns);
    `warm_up`: the engine runs the app's start-time warm-up before it says ready (bench/raw_engine.py --warm-up)."""
    argv = [python(), "-m", "bench.raw_engine", "--preset", str(preset)] + ["--warm-up"] * warm_up
    server = Server("raw engine", argv, logs / "raw_engine.log", env=base_env(env)).start(capture=True)

    def run(concurrency: int, requests: int, first: int, max_tokens: int, rate: float | None = None) -> list[Timeline]:
        op = {"op": "rate" if rate else "run", "concurrency": concurrency, "requests": requests, "rate": rate,
              "first_index": first, "max_tokens": max_tokens, "context_lines": context_lines, "turns": turns}
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
             max_threads: int | None = None, ui_workers: int | None = None,
             root: Path | None = None, timeline: Path | None = None) -> Target:
    """app.py as a subprocess; `max_threads`: launch it through bench/patched_app.py with that many
    Gradio queue slots instead of app.py's QUEUE_SLOTS (an experiment: app.py itself is unchanged).
    `root` (another checkout's app, e.g. the code before a change) or `timeline` (a folder for every
    process's page-reply moments): launch it through bench/gpu_app.py."""
    from chat.presets import load_preset
    from chat.server import QUEUE_SLOTS

    spec = load_preset(preset)
    port = free_port()
    script = "app.py"
    if max_threads and (root or timeline):
        raise ValueError("max_threads runs bench/patched_app.py, root and timeline bench/gpu_app.py: one at a time")
    if max_threads:
        script, env = "bench/patched_app.py", {**env, "BENCH_GRADIO_MAX_THREADS": str(max_threads)}
    if root or timeline:
        script = "bench/gpu_app.py"
        env = {**env, "BENCH_APP_ROOT": str(root or "."), **({"BENCH_TIMELINE_DIR": str(timeline)} if timeline else {})}
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
                  "ui_workers": ui_workers, "root": str(root) if root else None, "timeline": timeline}
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


def browser_path(app: Target, count: Callable[[str], int], context_lines: int, client_procs: int = 1,
                 late: bool = False, visitor: bool = False, turns: int = 1) -> Target:
    """The same app server (and engine) as `app`, used as a browser uses it: the Chat tab's own
    events on Enter, and the reply's live text over the page's WebSocket (bench/gradio_browser.py);
    bursts (closed loop) or steady arrivals (`rate`), each turn a new tab. `late`: pages whose
    socket is not open yet when Enter is pressed, so that Gradio's turn starts the reply (as every
    turn did before a page began its reply over the socket: chat/live.py). `visitor`: each turn a
    new visitor who loads the page through the front door and mounts it (heartbeat, load events,
    socket) before pressing Enter (bench/frontend_client.py `visitor_turn`), the door for steady
    arrivals. The last run's turns stay in `notes["turns"]` (their page's moments: marks, begun).
    `turns`: each conversation holds `turns` - 1 earlier turns (the raw engine's, bench.common.earlier_turns)
    in the page's chat, shaped like one turn the page took (captured at the first run, unmeasured)."""
    protocol = "visitor" if visitor else "browser-late" if late else "browser"
    from bench.frontend_client import Request, capture_chat, page_history, take_turns

    url = app.notes["url"]
    shape: list[dict[str, Any]] = []  # one turn as the page holds it

    def history(index: int) -> list[dict[str, Any]]:
        if turns <= 1:
            return []
        if not shape:
            shape.extend(capture_chat(url, Request(user_message(0, context_lines), 8, [], {"knob-max_tokens": 8})))
        return page_history(earlier_turns(index, turns), shape)

    def run(concurrency: int, requests: int, first: int, max_tokens: int, rate: float | None = None) -> list[Timeline]:
        asks = [Request(user_message(first + i, context_lines), max_tokens, history(first + i), {"knob-max_tokens": max_tokens})
                for i in range(requests)]
        timelines = []
        taken = take_turns(url, protocol, asks, concurrency=concurrency, rate=rate,
                           procs=client_procs if concurrency >= 16 or rate else 1)
        target.notes["turns"] = taken
        for turn in taken:
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

    target = Target(f"{app.name}-{protocol}", [], app.frontend_pids, run)
    target.notes = {"url": url, "shares_server_with": app.name}
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
