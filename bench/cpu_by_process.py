"""Where a command's CPU goes, by kind of process: Chromium's renderers and the rest of it, the apps,
their UI workers, Caddy, pytest. Every process on the machine is read once a second (psutil), so a process that lives under a second may be missed and one that ends
loses its last second; processes that ran before the command count only what they spend during it.

    python -m bench.cpu_by_process -- scripts/test --dev

It prints the command's wall time and the CPU seconds of each kind, the largest first; with
--by-command, of each command line instead (temporary paths and port numbers made alike).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable

import psutil


def command_line(process: psutil.Process) -> str | None:
    """A process's command line (None when it has gone)."""
    try:
        return " ".join(process.cmdline())
    except psutil.Error:
        return None


def kind_of(process: psutil.Process) -> str | None:
    """What a process is, from its command line (None when it has gone)."""
    if (words := command_line(process)) is None:
        return None
    if "chrom" in words:
        return "chromium: renderer" if "--type=renderer" in words else "chromium: other"
    if "playwright" in words:
        return "playwright's driver"
    for needle, kind in (("pytest", "pytest"), ("stand_in", "app"), ("app.py", "app"), ("caddy", "caddy"),
                         ("multiprocessing", "UI workers and engine processes (forked or spawned)")):
        if needle in words:
            return kind
    return "other" if words.strip() else "kernel"


def command_of(process: psutil.Process) -> str | None:
    """A process's command line with what differs between runs (temporary paths, ports) made alike;
    Chromium's by kind."""
    if (words := command_line(process)) is None or "chrom" in words:
        return kind_of(process)
    words = re.sub(r"/tmp/\S+", "TMP", words)
    return re.sub(r"(--port[ =]|:)\d{4,5}\b", r"\1PORT", words)[:160]


def cpu_s(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return None
    return times.user + times.system


class Sampler:
    """CPU seconds spent by each kind of process since it started sampling."""

    def __init__(self, name_of: Callable[[psutil.Process], str | None] = kind_of) -> None:
        self.name_of = name_of
        self.seen: dict[int, tuple[str, float]] = {}  # pid -> (kind, CPU seconds when last read)
        self.totals: Counter[str] = Counter()
        for process in psutil.process_iter():  # already running: counted from now
            if (kind := name_of(process)) is not None and (spent := cpu_s(process)) is not None:
                self.seen[process.pid] = (kind, spent)
        self.done = threading.Event()

    def sample(self) -> None:
        for process in psutil.process_iter():
            if (spent := cpu_s(process)) is None:
                continue
            if process.pid not in self.seen:
                if (kind := self.name_of(process)) is None:
                    continue
                self.seen[process.pid] = (kind, 0.0)
            kind, last = self.seen[process.pid]
            self.totals[kind] += spent - last
            self.seen[process.pid] = (kind, spent)

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.sample()
        self.sample()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--by-command", action="store_true", help="group by command line, not by kind")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    arguments = parser.parse_args()
    command = [word for word in arguments.command if word != "--"]
    sampler = Sampler(command_of if arguments.by_command else kind_of)
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    started = time.monotonic()
    status = subprocess.call(command)
    wall_s = time.monotonic() - started
    sampler.done.set()
    thread.join()
    total_s = sum(sampler.totals.values())
    cores = len(os.sched_getaffinity(0))
    print(f"\n{' '.join(command)}: exit {status}, {wall_s:.0f} s; {total_s:.0f} s of CPU "
          f"({total_s / (wall_s * cores):.0%} of {cores} cores)")
    for kind, spent in sampler.totals.most_common():
        print(f"{spent:8.0f} s  {kind}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
