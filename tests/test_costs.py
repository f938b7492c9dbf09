"""The cost-by-tier summary's arithmetic and its reading of the machine's CPU time."""

from __future__ import annotations

import time

import pytest

from tests.costs import TierCost, busy_cpu_s, costliest, line

pytestmark = pytest.mark.unit


def test_the_machines_busy_time_grows_while_this_process_computes():
    before = busy_cpu_s()
    assert before is not None and before > 0
    deadline = time.process_time() + 0.2
    while time.process_time() < deadline:
        pass
    assert busy_cpu_s() - before >= 0.15


def test_a_tier_line_gives_how_busy_the_cores_were():
    assert line("app", TierCost(tests=4, wall_s=100.0, cpu_s=150.0), cores=2) == "app          4     100s     150s        75%"
    assert line("unit", TierCost(), cores=2).endswith("0%")


def test_the_costliest_come_first_with_their_names_aligned():
    costs = {"tests/a.py::cheap": TierCost(1, 10.0, 5.0), "tests/b.py::dear": TierCost(1, 10.0, 20.0),
             "tests/c.py::middle_one": TierCost(1, 10.0, 10.0)}
    lines = costliest(costs, cores=2, count=2)
    assert [named.split()[0] for named in lines] == ["tests/b.py::dear", "tests/c.py::middle_one"]
    assert len({named.index("s ") for named in lines}) == 1, lines  # the figures line up
