"""The cost-by-tier summary's arithmetic and its reading of the machine's CPU time."""

from __future__ import annotations

import time

import pytest

from tests.costs import TierCost, busy_cpu_s, line

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
