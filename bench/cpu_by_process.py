"""Where a command's CPU goes, by kind of process: Chromium's renderers and the rest of it, the apps,
their UI workers, Caddy, pytest. Every process on the machine is read once a second from
/proc/<pid>/stat (Linux), so a process that lives under a second may be missed and one that ends
loses its last second; processes that ran before the command count only what they spend during it.

    python -m bench.cpu_by_process -- scripts/test --dev

It prints the command's wall time and the CPU seconds of each kind, the largest first.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def kind_of(pid: int) -> str | None:
    """What a process is, from its command line (None when it has gone)."""
    try:
        words = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
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


def cpu_ticks(pid: int) -> int | None:
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[11]) + int(fields[12])  # utime, stime


class Sampler:
    """CPU ticks spent by each kind of process since it started sampling."""

    def __init__(self) -> None:
        self.seen: dict[int, tuple[str, int]] = {}  # pid -> (kind, ticks when last read)
        self.totals: Counter[str] = Counter()
        for pid in self.pids():  # already running: counted from now
            if (kind := kind_of(pid)) is not None and (ticks := cpu_ticks(pid)) is not None:
                self.seen[pid] = (kind, ticks)
        self.done = threading.Event()

    @staticmethod
    def pids() -> list[int]:
        return [int(name) for name in os.listdir(PROC) if name.isdigit()]

    def sample(self) -> None:
        for pid in self.pids():
            if (ticks := cpu_ticks(pid)) is None:
                continue
            if pid not in self.seen:
                if (kind := kind_of(pid)) is None:
                    continue
                self.seen[pid] = (kind, 0)
            kind, last = self.seen[pid]
            self.totals[kind] += ticks - last
            self.seen[pid] = (kind, ticks)

    def run(self) -> None:
        while not self.done.wait(1.0):
            self.sample()
        self.sample()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command to run, after --")
    command = [word for word in parser.parse_args().command if word != "--"]
    sampler = Sampler()
    thread = threading.Thread(target=sampler.run, daemon=True)
    thread.start()
    started = time.monotonic()
    status = subprocess.call(command)
    wall_s = time.monotonic() - started
    sampler.done.set()
    thread.join()
    total_s = sum(sampler.totals.values()) / TICKS_PER_S
    cores = len(os.sched_getaffinity(0))
    print(f"\n{' '.join(command)}: exit {status}, {wall_s:.0f} s; {total_s:.0f} s of CPU "
          f"({total_s / (wall_s * cores):.0%} of {cores} cores)")
    for kind, ticks in sampler.totals.most_common():
        print(f"{ticks / TICKS_PER_S:8.0f} s  {kind}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
