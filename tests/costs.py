"""What each tier of tests costs: wall time and the machine's CPU time, printed after every run with
the costliest test modules and tests.

A run's CPU time says more than its wall time on a small machine: the engines, servers and browsers
the tests start are other processes, so the test process's own CPU time misses most of it. The
machine's busy time (from /proc/stat, Linux) counts everything, other programs on the machine too,
which is why the summary says how busy the cores were: the CPU time divided by the cores is the
least wall time that work could take in any order.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

PROC_STAT = Path("/proc/stat")
# After the "cpu" label: user, nice, system, idle, iowait, irq, softirq, steal, guest, guest_nice.
# Busy is work done here: not idle or waiting, not stolen by a virtual machine's host, and not guest
# time (already counted in user and nice).
BUSY_FIELDS = (0, 1, 2, 5, 6)


def busy_cpu_s() -> float | None:
    """Seconds of CPU the whole machine has spent busy since it booted (None off Linux)."""
    try:
        fields = [int(value) for value in PROC_STAT.read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return None
    return sum(fields[i] for i in BUSY_FIELDS if i < len(fields)) / os.sysconf("SC_CLK_TCK")


@dataclass
class TierCost:
    tests: int = 0
    wall_s: float = 0.0
    cpu_s: float = 0.0


COSTS = pytest.StashKey[dict[str, TierCost]]()  # by tier
MODULE_COSTS = pytest.StashKey[dict[str, TierCost]]()  # by test module
TEST_COSTS = pytest.StashKey[dict[str, TierCost]]()  # by test
COSTLIEST = 10  # modules, and tests, named in the summary
# Spread over processes (pytest-xdist, `scripts/test --fast`), the tests overlap, so a test's share of
# the machine's CPU cannot be told: the process that reports measures the whole run instead.
RUN_START = pytest.StashKey[tuple[float, float | None]]()  # wall, and the machine's busy CPU, at the start
TESTS_SEEN: dict[str, int] = {}  # by tier: the tests reported by the processes that ran them


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[RUN_START] = (time.monotonic(), busy_cpu_s())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Count each test once (its tear-down), by the tier marker it carries: this is how a run spread
    over processes learns its tiers (the reports come back with their markers among the keywords)."""
    from tests.conftest import TIERS

    if report.when == "teardown" and (tier := next((t for t in TIERS if t in report.keywords), None)):
        TESTS_SEEN[tier] = TESTS_SEEN.get(tier, 0) + 1


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """A test's set-up, call and tear-down: what starts for it is counted with it."""
    from tests.conftest import tier_of

    cpu, wall = busy_cpu_s(), time.monotonic()
    yield
    used_wall_s, now = time.monotonic() - wall, busy_cpu_s()
    used_cpu_s = now - cpu if cpu is not None and now is not None else 0.0
    module = item.nodeid.split("::", 1)[0]
    for key, name in ((COSTS, tier_of(item)), (MODULE_COSTS, module), (TEST_COSTS, item.nodeid)):
        cost = item.config.stash.setdefault(key, {}).setdefault(name, TierCost())
        cost.tests += 1
        cost.wall_s += used_wall_s
        cost.cpu_s += used_cpu_s


def pytest_terminal_summary(terminalreporter, config: pytest.Config) -> None:
    costs = config.stash.get(COSTS, {})
    if busy_cpu_s() is None or not (costs or TESTS_SEEN):
        return
    from tests.conftest import TIERS

    cores = len(os.sched_getaffinity(0))
    write = terminalreporter.write_line
    terminalreporter.section("cost by tier")
    write(f"{'tier':8} {'tests':>5} {'wall':>8} {'CPU':>8} {'cores busy':>10}   (CPU: the whole machine's, {cores} cores)")
    if not costs:  # the tests ran in other processes (pytest-xdist)
        write(spread_run_line(config, cores))
        write("The tests ran in several processes at once: the line is the whole run, starting the processes and "
              "collecting the tests included; a test's own cost is not measured.")
        return
    for tier in (tier for tier in TIERS if tier in costs):
        write(line(tier, costs[tier], cores))
    total = TierCost(sum(c.tests for c in costs.values()), sum(c.wall_s for c in costs.values()),
                     sum(c.cpu_s for c in costs.values()))
    write(line("all", total, cores))
    write(f"The least wall time this CPU time allows on {cores} cores: {total.cpu_s / cores:.0f} s.")
    for what, key in (("test modules", MODULE_COSTS), ("tests", TEST_COSTS)):
        write(f"The {what} that cost the most CPU (at most {COSTLIEST}):")
        for named in costliest(config.stash.get(key, {}), cores):
            write(named)


def spread_run_line(config: pytest.Config, cores: int) -> str:
    """One line for a run whose tests other processes ran: its tier if it had one, else "all"."""
    wall, cpu = config.stash[RUN_START]
    now = busy_cpu_s()
    run = TierCost(sum(TESTS_SEEN.values()), time.monotonic() - wall, now - cpu if cpu is not None and now is not None else 0.0)
    return line(next(iter(TESTS_SEEN)) if len(TESTS_SEEN) == 1 else "all", run, cores)


def costliest(costs: dict[str, TierCost], cores: int, count: int = COSTLIEST) -> list[str]:
    """The lines of the `count` costliest by CPU time, names aligned."""
    top = sorted(costs.items(), key=lambda named: -named[1].cpu_s)[:count]
    width = max((len(name) for name, _ in top), default=8)
    return [line(name, cost, cores, width) for name, cost in top]


def line(name: str, cost: TierCost, cores: int, width: int = 8) -> str:
    busy = cost.cpu_s / (cost.wall_s * cores) if cost.wall_s else 0.0
    return f"{name:{width}} {cost.tests:5d} {cost.wall_s:7.0f}s {cost.cpu_s:7.0f}s {busy:10.0%}"
