"""bench/cpu_by_process.py counts a process's CPU under its kind, and only what it spends while sampled."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from bench.cpu_by_process import Sampler, command_of, cpu_s, kind_of

# Spend `s` seconds of CPU, then wait for a line; "caddy" in the command line makes its kind caddy.
BUSY = "import time\nstart = time.process_time()\nwhile time.process_time() - start < {s}: pass\ninput()\n# caddy"


def busy(seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BUSY.format(s=seconds)], stdin=subprocess.PIPE)


def spent_s(process: subprocess.Popen, at_least_s: float) -> None:
    while (cpu_s(psutil.Process(process.pid)) or 0.0) < at_least_s:
        time.sleep(0.02)


def test_a_process_counts_under_its_kind_and_only_from_when_sampling_began():
    before = busy(0.6)
    try:
        spent_s(before, 0.6)
        sampler = Sampler()  # `before` has spent 0.6 s, then waits: none of it is counted
        after = busy(0.3)
        try:
            spent_s(after, 0.3)
            assert kind_of(psutil.Process(after.pid)) == kind_of(psutil.Process(before.pid)) == "caddy"
            sampler.sample()
        finally:
            after.communicate(b"\n")
    finally:
        before.communicate(b"\n")
    assert 0.28 <= sampler.totals["caddy"] < 0.75, sampler.totals


def test_by_command_two_runs_of_one_command_on_other_ports_and_folders_count_as_one():
    started = [subprocess.Popen([sys.executable, "-c", "print(); input()", "--port", port, f"/tmp/{folder}/votes.sqlite3"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE) for port, folder in (("7861", "a1"), ("18423", "b2"))]
    for process in started:  # its command line is read once it runs it (right after the fork it is empty)
        process.stdout.readline()
    handles = [psutil.Process(process.pid) for process in started]
    try:
        commands = {command_of(handle) for handle in handles}
    finally:
        for process in started:
            process.communicate(b"\n")
    # (The interpreter's own path may be under /tmp too, as in a fresh clone there.)
    assert len(commands) == 1 and commands.pop().endswith(" -c print(); input() --port PORT TMP"), commands
    assert command_of(handles[0]) is None  # gone
