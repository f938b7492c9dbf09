"""How long the app takes to serve from `python`, and how much CPU each of its processes spent on the
way: the main process, the UI workers (forked from the worker server, or spawned in checkouts before
it), Caddy, Python's helpers; and the memory they hold once serving. On the stand-in engine (tests/stand_in.py) by default, so what it
measures is the app's own start, not an engine's.

    python -m bench.app_start --ui-workers 2 --repeats 3
    python -m bench.app_start --root ../other-checkout --ui-workers 2 --repeats 3   # another checkout
    python -m bench.app_start --real-engine                                        # app.py itself

Run two checkouts one after the other in one loop (the machine's pace drifts between runs).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil

from bench.procs import free_port

ROOT = Path(__file__).resolve().parent.parent


def kind(process: psutil.Process, main: int) -> str:
    if process.pid == main:
        return "main"
    line = " ".join(process.cmdline())
    for mark, name in (("forkserver", "worker server and its forks"), ("spawn_main", "spawned"),
                       ("resource_tracker", "resource tracker"), ("caddy", "caddy")):
        if mark in line:
            return name
    return process.name()


def one_start(root: Path, args: argparse.Namespace) -> dict:
    port = free_port()
    script = root / ("app.py" if args.real_engine else "tests/stand_in.py")
    log = open(f"/tmp/app-start-{port}.log", "w")  # noqa: SIM115 - the app's output, for a failed start
    started = time.monotonic()
    app = subprocess.Popen([sys.executable, str(script), "--port", str(port), "--ui-workers", str(args.ui_workers)],
                           cwd=root, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"})
    cpu: dict[int, tuple[str, float]] = {}
    main = psutil.Process(app.pid)
    while True:
        for process in [main, *main.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):  # ended meanwhile
                cpu[process.pid] = (kind(process, app.pid), sum(process.cpu_times()[:4]))
        if app.poll() is not None:
            raise SystemExit(f"the app ended with {app.returncode}: see {log.name}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as answer:
                if answer.status == 200:
                    break
        except OSError:
            pass
        time.sleep(0.2)
    serving_s = time.monotonic() - started
    # Memory once serving: each process's own pages (USS), and its share of pages it shares (PSS):
    # forked workers share what the worker server imported until they write to it.
    uss = pss = 0
    for process in [main, *main.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            memory = process.memory_full_info()
            uss, pss = uss + memory.uss, pss + memory.pss
    app.terminate()
    app.wait(60)
    by_kind: dict[str, list[float]] = {}
    for name, seconds in cpu.values():
        by_kind.setdefault(name, []).append(round(seconds, 1))
    return {"serving_s": round(serving_s, 1), "cpu_s": round(sum(s for _, s in cpu.values()), 1),
            "uss_gb": round(uss / 1e9, 2), "pss_gb": round(pss / 1e9, 2), "cpu_by_process": by_kind}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ui-workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--root", type=Path, default=ROOT, help="the checkout whose app to start")
    ap.add_argument("--real-engine", action="store_true", help="app.py on the embedded model, not the stand-in")
    args = ap.parse_args()
    runs = []
    for _ in range(args.repeats):
        runs.append(one_start(args.root.resolve(), args))
        print(json.dumps(runs[-1]), flush=True)
    for what in ("serving_s", "cpu_s", "pss_gb"):
        values = [run[what] for run in runs]
        print(f"{what}: median {statistics.median(values):.1f}, min {min(values):.1f}, max {max(values):.1f} "
              f"({len(values)} starts, {args.ui_workers} UI workers, {args.root.resolve().name})")


if __name__ == "__main__":
    main()
