"""Steady arrivals through the page's path, without a GPU (issue 48, part 2): the raw engine and the app
side by side at fixed rates of new visitors, with a timeline of every page reply.

    .venv/bin/python -m bench.frontend_rates                                  # this checkout; 5,10,15,20/s, 30 s each
    .venv/bin/python -m bench.frontend_rates --app-root HEAD --rates 10,20 --repeats 3
    .venv/bin/python -m bench.frontend_rates --app-root a=. --app-root b=. --app-env b:BENCH_GC_FREEZE=1   # an experiment
    .venv/bin/python -m bench.frontend_rates --rates 20 --seconds 30 --profile   # py-spy on the app's runs

Both sides stream from bench/token_source.py (a token per running request every --step-ms) through
vLLM's own AsyncLLM: the **raw** side drives AsyncLLM directly in a process of its own
(bench/frontend_raw.py), the **app** side is app.py (bench/frontend_app.py), each pinned to the same
core (--app-cpus) and measured in turn, the order rotating. Open loop: request i arrives at
t0 + i / rate whatever the server's state. On the app's side each arrival is a new visitor, as a
browser does it (bench/frontend_client.py `visitor_turn`): it loads the page, mounts it (Gradio's
heartbeat, the page's load events, live.js's socket), then sends the message as the page does
(`begin` over the socket and the Chat tab's turn with its id) and counts text once it is on screen
(the reply's box drawn and its text arrived). Time to first token (TTFT) is from sending: the
raw side's request, the app's Enter.

Timeline of each page reply (milliseconds after Enter; the client, the app and the token source share
the machine's monotonic clock): `begin` received by the app, the Gradio turn started (`process_starts`),
the request handed to the engine core, its first token out of the core (the engine's step end, and when
the app's loop took it), the first text sent on the socket, received, and the box drawn. The app also
logs its event loop's stalls (bench/frontend_timeline.py). The slowest replies are printed with their
timelines and the stalls that overlapped them; everything goes to bench/results/frontend-rates-*.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench.common import pct, user_message
from bench.frontend import client_cpu, new_record
from bench.frontend_checkouts import PRESET, App, resolve_app, start_apps
from bench.frontend_client import Request, Turn, take_turns
from bench.procs import ROOT, Server, base_env, cpu_seconds, machine_busy_seconds, python
from bench.procs_priority import prioritize

TAG = r"Request (\d+)\."  # bench.common.user_message's number, found by the token source in each prompt
STAGES = (  # (name, what it is) in the order a reply passes them; milliseconds after Enter
    ("begin", "the app received the page's begin"),
    ("turn", "Gradio started the Chat tab's turn (process_starts)"),
    ("core", "the request reached the engine core"),
    ("token", "its first token came out of the core (step end)"),
    ("taken", "the app's loop took that step's output"),
    ("sent", "the app sent the first text on the socket"),
    ("delta", "the page received it"),
    ("box", "Gradio drew the reply's box"),
    ("ttft", "the text was on screen (box and text)"),
)


def raw_side(preset: Path, args: argparse.Namespace, logs: Path, app_root: Path) -> Server:
    env = base_env({"BENCH_STEP_MS": str(args.step_ms), "BENCH_APP_CPUS": args.app_cpus, "BENCH_NICE": str(args.nice),
                    "BENCH_APP_ROOT": str(app_root)})
    return Server("raw", [python(), str(ROOT / "bench" / "frontend_raw.py"), "--preset", str(preset)], logs / "raw.log",
                  env=env).start(capture=True)


def ms(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round((a - b) * 1e3, 1)


def summary(values: list[float]) -> dict[str, float]:
    return {"p50": round(pct(values, 50), 1), "p90": round(pct(values, 90), 1), "p99": round(pct(values, 99), 1),
            "max": round(max(values), 1) if values else float("nan"), "n": len(values)}


class Rates:
    def __init__(self, args: argparse.Namespace, raw: Server, logs: Path) -> None:
        self.args, self.raw, self.logs = args, raw, logs
        self.next_index = 1_000_000  # well above anything else's numbers; raw and app share the count

    def numbers(self, count: int) -> int:
        first, self.next_index = self.next_index, self.next_index + count
        return first

    def run_raw(self, rate: float, count: int) -> dict[str, Any]:
        first = self.numbers(count)
        t0 = time.monotonic()
        reply = self.raw.send({"op": "rate", "rate": rate, "requests": count, "first_index": first,
                               "max_tokens": self.args.max_tokens}, timeout=count / rate + 600)
        wall = time.monotonic() - t0
        timelines = reply["timelines"]
        ttft = [(t["arrivals"][0][0] - t["started"]) * 1e3 for t in timelines if t["arrivals"]]
        errors = sum(1 for t in timelines if t.get("error") or not t["arrivals"])
        return {"side": "raw", "rate": rate, "requests": count, "errors": errors, "wall_s": round(wall, 1),
                "ttft": summary(ttft)}

    def run_app(self, app: App, rate: float, count: int, door: str = "visitor", side: str = "") -> dict[str, Any]:
        assert app.server is not None and app.timeline_log is not None and app.source_log is not None
        first = self.numbers(count)
        requests = [Request(user_message(first + i), self.args.max_tokens, [], {"knob-max_tokens": self.args.max_tokens})
                    for i in range(count)]
        timeline_at, source_at = app.timeline_log.stat().st_size, app.source_log.stat().st_size
        cpu0, client0, busy0 = cpu_seconds([app.server.pid]), client_cpu(), machine_busy_seconds()
        spy = self._spy(app, f"{app.label}-{door}-{rate:g}-{first}") if self.args.profile else None
        t0 = time.monotonic()
        turns = take_turns(app.url, door, requests, concurrency=count, procs=self.args.client_procs, rate=rate)
        t1 = time.monotonic()
        app_cpu, client, busy = cpu_seconds([app.server.pid]) - cpu0, client_cpu() - client0, machine_busy_seconds() - busy0
        if spy is not None:
            self._report_spy(*spy)
        time.sleep(0.5)  # the source writes a request's record at its end
        moments = read_lines(app.timeline_log, timeline_at)
        sources = {r["tag"]: r for r in read_lines(app.source_log, source_at) if r.get("tag")}
        wall = t1 - t0
        out = {"side": side or door, "rate": rate, "requests": count, "wall_s": round(wall, 1),
               **page_replies(turns, first, moments, sources, t0, t1, self.args.slow, self.args.keep_replies),
               "app_cores": round(app_cpu / wall, 2), "client_cores": round(client / wall, 2),
               "others_cores": round(max(0.0, busy - app_cpu - client) / wall, 2)}
        return out

    def _spy(self, app: App, name: str) -> tuple[subprocess.Popen, Path]:
        assert app.server is not None
        out = self.logs / f"profile-{name}.txt"
        exe = str(Path(sys.executable).parent / "py-spy")
        cmd = [exe, "record", "--pid", str(app.server.pid), "--rate", "200", "--format", "raw", "--output", str(out),
               "--nonblocking", "--gil"]
        return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True), out

    def _report_spy(self, spy: subprocess.Popen, out: Path) -> None:
        from bench.spy import top

        spy.send_signal(signal.SIGINT)
        _, err = spy.communicate(timeout=120)
        print(top(out, 30) + f"\n    stacks: {out}" if out.exists() else f"    py-spy wrote nothing: {err[-500:]}", flush=True)


def read_lines(path: Path, offset: int) -> list[dict[str, Any]]:
    with open(path) as f:
        f.seek(offset)
        return [json.loads(line) for line in f if line.strip()]


def page_replies(turns: list[Turn], first: int, moments: list[dict[str, Any]], sources: dict[str, dict[str, Any]],
                 t0: float, t1: float, slow: int, keep_replies: bool = False) -> dict[str, Any]:
    """A run's page replies (request numbers from `first`) with the app's moments and the token source's
    records: TTFT and each stage's spread, page loads and mounts, the event loops' stalls and long garbage
    collections between t0 and t1, and the `slow` slowest replies with their timelines and the stalls that
    overlapped their wait (where moments carry a process's "pid", that of the process their `begin` reached)."""
    by_reply: dict[tuple[str, str], dict[str, Any]] = {}  # (kind, page id) -> its first moment
    for m in moments:
        if "id" in m:
            by_reply.setdefault((m["k"], m["id"]), m)
    rows = [timeline(turn, first, by_reply, sources) for turn in turns]
    stalls = [m for m in moments if m["k"] == "stall" and t0 <= m["t"] <= t1]
    collections = [m for m in moments if m["k"] == "gc" and t0 <= m["t"] <= t1]
    ok = [r for r in rows if r["ttft"] is not None]
    out = {"errors": len(turns) - len(ok),
           "ttft": summary([r["ttft"] for r in ok]),
           "stages": {name: summary([r[name] for r in ok if r.get(name) is not None]) for name, _ in STAGES},
           # how late the client started each arrival (a late client sends a burst: bench/frontend_client.py `_open`)
           "late_ms": summary([r["late"] for r in rows if r.get("late") is not None]),
           "page_ms": summary([r["page"] for r in rows if r.get("page") is not None]),
           "mount_ms": summary([r["mount"] for r in rows if r.get("mount") is not None]),
           "stalls": {"count": len(stalls), "ms": round(sum(s["ms"] for s in stalls)),
                      "max_ms": max((s["ms"] for s in stalls), default=0.0),
                      # what the process did meanwhile (bench/frontend_timeline.py): ran the loop,
                      # ran other threads, or did not run
                      "loop_cpu_ms": round(sum(s["loop_cpu_ms"] for s in stalls)),
                      "other_threads_ms": round(sum(s["cpu_ms"] - s["loop_cpu_ms"] for s in stalls)),
                      "top": sorted(stalls, key=lambda s: -s["ms"])[:10]},
           "gc": {"count": len(collections), "ms": round(sum(c["ms"] for c in collections)),
                  "max_ms": max((c["ms"] for c in collections), default=0.0),
                  "gen2": sum(1 for c in collections if c["gen"] == 2),
                  # what a full collection walks (the unfrozen heap), after the run's last one
                  "objects": next((c["objects"] for c in reversed(collections) if "objects" in c), None)},
           "first_error": next((t.error for t in turns if t.error), None)}
    slowest = sorted(ok, key=lambda r: -r["ttft"])[:slow]
    for r in slowest:  # the stalls that overlapped the reply's wait for its first text
        r["stalls"] = [(round((s["t"] - r["_sent"]) * 1e3), s["ms"]) for s in stalls
                       if s["t"] + s["ms"] / 1e3 >= r["_sent"] and s["t"] <= r["_sent"] + r["ttft"] / 1e3
                       and s.get("pid") == r["_pid"]]
    out["slow"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in slowest]
    out["replies"] = [{k: v for k, v in r.items() if not k.startswith("_")} for r in rows] if keep_replies else []
    return out


def timeline(turn: Turn, first: int, by_reply: dict[tuple[str, str], dict[str, Any]],
             sources: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """One page reply's moments, in milliseconds after its Enter."""
    sent = turn.started
    source = sources.get(str(first + turn.index), {})

    def at(kind: str) -> float | None:
        return by_reply.get((kind, turn.begun or ""), {}).get("t")

    begun = by_reply.get(("begin", turn.begun or ""), {})
    begin, delta = begun.get("t"), at("delta")
    # the engine's side: the token source's records, else the app's own (bench/frontend_timeline.py)
    core, token = source.get("added") or at("core"), source.get("first_token") or at("token")
    shown = next((t for t, n in turn.updates if n > 0), None)
    marks = turn.marks
    return {"index": turn.index, "ttft": ms(shown, sent) if not turn.error else None, "error": turn.error,
            "late": ms(marks.get("arrived", sent), marks.get("due")), "page": ms(marks.get("page_loaded"), marks.get("arrived")), "mount": ms(sent, marks.get("page_loaded")),
            "begin": ms(begin, sent), "turn": ms(turn.process_started, sent), "core": ms(core, sent),
            "token": ms(token, sent), "taken": ms(source.get("first_handed"), sent),
            "sent": ms(delta, sent), "delta": ms(marks.get("first_delta"), sent), "box": ms(marks.get("box"), sent),
            "_sent": sent, "_pid": begun.get("pid")}


def print_run(r: dict[str, Any]) -> None:
    t = r["ttft"]
    line = (f"  {r['side']:<7} {r['rate']:5.1f}/s x {r['requests']:4}: TTFT p50 {t['p50']:7.1f}  p99 {t['p99']:7.1f}  "
            f"max {t['max']:7.1f} ms  errors {r['errors']}")
    if r["side"] != "raw":
        s = r["stages"]
        line += (f"  | p99 begin {s['begin']['p99']:.0f} core {s['core']['p99']:.0f} token {s['token']['p99']:.0f} "
                 f"taken {s['taken']['p99']:.0f} sent {s['sent']['p99']:.0f} delta {s['delta']['p99']:.0f} "
                 f"box {s['box']['p99']:.0f} turn {s['turn']['p99']:.0f}  page p99 {r['page_ms']['p99']:.0f} ms  "
                 f"arrivals late p99 {r['late_ms']['p99']:.0f} ms  "
                 f"app {r['app_cores']:.2f} cores, client {r['client_cores']:.2f}, others {r['others_cores']:.2f}  "
                 f"stalls {r['stalls']['count']} ({r['stalls']['ms']} ms, max {r['stalls']['max_ms']:.0f}; "
                 f"meanwhile loop CPU {r['stalls']['loop_cpu_ms']} ms, other threads {r['stalls']['other_threads_ms']} ms)  "
                 f"gc > 5 ms {r['gc']['count']} ({r['gc']['ms']} ms, max {r['gc']['max_ms']:.0f}; "
                 f"{r['gc']['gen2']} full, then {r['gc']['objects'] or '-'} objects)")
    print(line, flush=True)
    if r.get("first_error"):
        print(f"    first error: {r['first_error'][:300]}", flush=True)


def print_slow(r: dict[str, Any], count: int = 5) -> None:
    names = [n for n, _ in STAGES]
    print(f"    slowest at {r['rate']:g}/s (ms after Enter): " + " ".join(f"{n:>6}" for n in names) + "  stalls (at, ms)")
    for s in r["slow"][:count]:
        cells = " ".join(f"{s[n]:6.0f}" if s.get(n) is not None else f"{'-':>6}" for n in names)
        print(f"    {'':>27}{cells}  {s.get('stalls', [])[:6]}")


def holds(raw_p99: float, app_p99: float) -> bool:
    """Issue 48's bar for steady arrivals: the app's p99 first token at most 1.10x raw's or raw's + 50 ms,
    whichever is larger."""
    return app_p99 <= max(1.10 * raw_p99, raw_p99 + 50.0)


def table(runs: list[dict[str, Any]]) -> str:
    """One row per rate and door: raw's and the app's TTFT in each repeat, the app's p99 over raw's in
    the same repeat (median ratio and spread), the repeats that held issue 48's bar, and the app's loop
    stalls."""

    def pair(run: dict[str, Any]) -> str:
        return f"{run['ttft']['p50']:.0f} / {run['ttft']['p99']:.0f}"

    lines = ["| rate /s | door | raw TTFT p50 / p99, ms | app TTFT p50 / p99, ms | app p99 x raw: median [range] | "
             "app p99 - raw p99, ms | held: p99 <= max(1.10x, +50 ms) | app loop stalls > 20 ms: total ms |",
             "| ---: | --- | --- | --- | ---: | ---: | ---: | ---: |"]
    for rate in sorted({r["rate"] for r in runs}):
        raws = {r["repeat"]: r for r in runs if r["rate"] == rate and r["side"] == "raw"}
        for door in sorted({r["side"] for r in runs if r["side"] != "raw"}):
            apps = [r for r in runs if r["rate"] == rate and r["side"] == door]
            both = [(raws[a["repeat"]], a) for a in apps if a["repeat"] in raws]
            ratios = [a["ttft"]["p99"] / w["ttft"]["p99"] for w, a in both if w["ttft"]["p99"]]
            spread = f"{statistics.median(ratios):.2f} [{min(ratios):.2f}-{max(ratios):.2f}]" if ratios else "-"
            over = ", ".join(format(a["ttft"]["p99"] - w["ttft"]["p99"], "+.0f") for w, a in both)
            held = f"{sum(holds(w['ttft']['p99'], a['ttft']['p99']) for w, a in both)}/{len(both)}"
            lines.append(f"| {rate:g} | {door} | {', '.join(pair(w) for w, _ in both)} | {', '.join(pair(a) for _, a in both)} "
                         f"| {spread} | {over} | {held} | {', '.join(str(a['stalls']['ms']) for _, a in both)} |")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.frontend_rates", description=__doc__.split("\n\n")[0])
    ap.add_argument("--app-root", action="append", default=[], metavar="[LABEL=]PATH|REV",
                    help="an app to measure: a checkout's folder or a commit of this repository (repeat for before/after; "
                         "default: this checkout)")
    ap.add_argument("--app-env", action="append", default=[], metavar="LABEL:KEY=VALUE",
                    help="an environment variable for one app's process (an experiment's switch, e.g. BENCH_GC_FREEZE=1)")
    ap.add_argument("--rates", default="5,10,15,20", help="new visitors a second, comma-separated")
    ap.add_argument("--seconds", type=float, default=30.0, help="seconds of arrivals at each rate")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256, help="tokens in every reply")
    ap.add_argument("--step-ms", type=float, default=25.0, help="the engine's step: one token per stream per step")
    cores = sorted(os.sched_getaffinity(0))
    ap.add_argument("--app-cpus", default=str(cores[0]), help="cores the app (and the raw side) are pinned to")
    ap.add_argument("--client-cpus", default=",".join(map(str, cores[1:] or cores)), help="cores for this client")
    ap.add_argument("--nice", type=int, default=0, help="scheduling priority of the app, the raw side and the client")
    ap.add_argument("--doors", default="visitor",
                    help="the app's, comma-separated: visitor (each arrival loads the page first), browser (its page "
                         "is open already: the socket and the message only)")
    ap.add_argument("--client-procs", type=int, default=1, help="client processes (one event loop each)")
    ap.add_argument("--app-arg", action="append", default=[], metavar="FLAG", help="an extra app.py flag")
    ap.add_argument("--slow", type=int, default=20, help="slowest replies kept with their timelines, per run")
    ap.add_argument("--keep-replies", action="store_true", help="keep every reply's timeline in the JSON")
    ap.add_argument("--profile", action="store_true", help="sample the app with py-spy during its runs")
    ap.add_argument("--out", type=Path, default=None, help="result JSON (default bench/results/frontend-rates-<time>.json)")
    return ap.parse_args(argv)


def _stop(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _stop)
    os.sched_setaffinity(0, {int(c) for c in args.client_cpus.split(",")})
    restore_priority = prioritize(args.nice)
    preset = yaml.safe_load(PRESET.read_text())
    apps = [resolve_app(spec) for spec in args.app_root or [f"current={ROOT}"]]
    if len({a.label for a in apps}) < len(apps):
        print("Give every --app-root its own LABEL=", file=sys.stderr)
        return 2
    for spec in args.app_env:
        label, _, setting = spec.partition(":")
        key, _, value = setting.partition("=")
        next(a for a in apps if a.label == label).env[key] = value
    logs, out, result = new_record("frontend-rates", args, argv, apps)
    result.update({"stages": dict(STAGES), "runs": []})

    def save() -> None:
        out.write_text(json.dumps(result, indent=1, default=str))

    raw: Server | None = None
    try:
        print(f"Starting {len(apps)} app(s) and the raw side on core(s) {args.app_cpus}; client on {args.client_cpus} "
              f"(logs in {logs}) ...", flush=True)
        raw = raw_side(PRESET, args, logs, apps[0].root)
        start_apps(apps, args, logs, preset, source_tag=TAG)
        if not raw.receive(timeout=900).get("ready"):
            raise RuntimeError(f"the raw side did not start:\n{raw.log_tail()}")
        rates = Rates(args, raw, logs)
        rates.run_raw(4, 8)  # warm-ups: every path once (the first page load builds Gradio's caches)
        doors = args.doors.split(",")
        paths = {(f"{a.label}/{d}" if len(apps) > 1 else d): (a, d) for a in apps for d in doors}
        sides = ["raw", *paths]
        for app, door in paths.values():
            warm = rates.run_app(app, 4, 8, door)
            if warm["errors"]:
                raise RuntimeError(f"warm-up failed ({app.label}, {door}): {warm['first_error']}")
        turn = 0
        for repeat in range(args.repeats):
            for rate in (float(x) for x in args.rates.split(",")):
                count = max(1, round(rate * args.seconds))
                for side in sides[turn % len(sides):] + sides[:turn % len(sides)]:
                    if side == "raw":
                        run = rates.run_raw(rate, count)
                    else:
                        app, door = paths[side]
                        run = rates.run_app(app, rate, count, door, side)
                    run["repeat"] = repeat
                    result["runs"].append(run)
                    save()
                    print_run(run)
                    if side != "raw":
                        print_slow(run)
                turn += 1
    finally:
        if raw is not None:
            raw.stop()
        for app in apps:
            if app.server is not None:
                app.server.stop()
        save()
        restore_priority()
    print(f"\n{args.max_tokens}-token replies, a token per stream every {args.step_ms:g} ms; app and raw pinned to "
          f"core {args.app_cpus} ({result['machine']['cpu']}), {args.seconds:g} s of arrivals a rate; {result['date']}")
    print(f"command: {result['command']}\n")
    print(table(result["runs"]))
    print(f"\nresults: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
