"""Where the time goes: py-spy samples of the app or the raw engine's processes under load.

    .venv/bin/python -m bench.spy app --concurrency 32            # the app's own process
    .venv/bin/python -m bench.spy raw --process worker           # the engine's worker process
    .venv/bin/python -m bench.spy raw --process enginecore --concurrency 1

Starts the target alone (bench/run.py's launchers), warms it up, then samples the chosen process
with `py-spy record --format raw` while a closed-loop run goes on, and prints the functions that
hold the most samples (own time and inclusive). The raw stacks are kept in bench/results/ for a
flame graph (e.g. `py-spy`'s own SVG output, or speedscope). Needs py-spy (requirements-bench.txt).
"""

from __future__ import annotations

import argparse
import collections
import datetime as dt
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import psutil

from bench.paths import app_path, raw_path, wait_ready
from bench.run import DEFAULT_PRESET, RESULTS

NAMES = {"frontend": None, "enginecore": "VLLM::EngineCore", "worker": "VLLM::Worker"}


def find(root_pid: int, which: str) -> int:
    if which == "frontend":
        return root_pid
    for child in psutil.Process(root_pid).children(recursive=True):
        try:
            if NAMES[which] in " ".join(child.cmdline()) or NAMES[which] in child.name():
                return child.pid
        except psutil.Error:
            continue
    raise LookupError(f"no {which} process under {root_pid}")


def top(raw_file: Path, n: int = 25) -> str:
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw_file.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        k = int(count)
        total += k
        frames = [f for f in stack.split(";") if f]
        if frames:
            own[frames[-1]] += k
        for f in set(frames):
            inclusive[f] += k
    out = [f"{total} samples", "", "own time:"]
    out += [f"{100 * k / total:5.1f}%  {f}" for f, k in own.most_common(n)]
    out += ["", "inclusive:"]
    out += [f"{100 * k / total:5.1f}%  {f}" for f, k in inclusive.most_common(n)]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.spy", description=__doc__.split("\n\n")[0])
    ap.add_argument("target", choices=["app", "raw"])
    ap.add_argument("--process", choices=sorted(NAMES), default="frontend")
    ap.add_argument("--preset", type=Path, default=DEFAULT_PRESET)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--requests", type=int, default=0, help="default: twice the concurrency")
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    ap.add_argument("--native", action="store_true", help="also sample C/C++ frames (py-spy --native)")
    ap.add_argument("--all-threads", action="store_true",
                    help="sample every thread; by default only the one holding the GIL (py-spy --gil), "
                         "so time waiting in the event loop's poll is not counted as work")
    ap.add_argument("--flush-ms", type=int, default=None, help="the app's --flush-ms")
    ap.add_argument("--engine-env", action="append", default=[], metavar="KEY=VALUE")
    args = ap.parse_args(argv)
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    logs = RESULTS / f"profile-{stamp}"
    env = dict(x.split("=", 1) for x in args.engine_env)
    from transformers import AutoTokenizer

    from chat.models import resolve_model
    from chat.presets import load_preset

    tok = AutoTokenizer.from_pretrained(str(resolve_model(load_preset(args.preset), report=print)))
    count = lambda text: len(tok(text, add_special_tokens=False).input_ids)  # noqa: E731
    target = (app_path("app", args.preset, logs, env, count, 0, flush_ms=args.flush_ms) if args.target == "app"
              else raw_path(args.preset, logs, env, 0))
    try:
        wait_ready([target])
        target.run(8, 8, 50_000, 8)
        pid = find(target.servers[0].pid, args.process)
        out = logs / f"{args.target}-{args.process}.txt"
        cmd = [spy, "record", "--pid", str(pid), "--rate", str(args.rate), "--format", "raw", "--output", str(out),
               "--nonblocking", *(["--native"] if args.native else []), *([] if args.all_threads else ["--gil"])]
        spy_proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        done = threading.Event()
        timelines = target.run(args.concurrency, args.requests or 2 * args.concurrency, 60_000, args.max_tokens)
        done.set()
        spy_proc.send_signal(2)  # SIGINT: py-spy writes its output and exits
        _, err = spy_proc.communicate(timeout=60)
        tokens = sum(t.tokens for t in timelines if t.error is None)
        print(f"{args.target} {args.process} (pid {pid}) at concurrency {args.concurrency}: {tokens} tokens")
        if out.exists():
            print(top(out))
            print(f"\nstacks: {out}")
        else:
            print(f"py-spy wrote nothing: {err[-2000:]}")
    finally:
        for server in target.servers:
            server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
