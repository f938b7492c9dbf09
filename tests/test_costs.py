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


def test_a_run_spread_over_processes_is_one_line_for_its_tier_or_all(monkeypatch):
    """With pytest-xdist the reports come back with their markers, and the run is measured whole."""
    from _pytest.reports import TestReport

    from tests import costs

    monkeypatch.setattr(costs, "TESTS_SEEN", {})
    for when in ("setup", "call", "teardown"):
        costs.pytest_runtest_logreport(TestReport("t.py::a", ("t.py", 1, "a"), {"unit": 1}, "passed", None, when))
    costs.pytest_runtest_logreport(TestReport("t.py::b", ("t.py", 2, "b"), {"b": 1}, "passed", None, "teardown"))
    assert costs.TESTS_SEEN == {"unit": 1}, "one test, counted once, by its tier; a test without one is not"

    config = type("Config", (), {"stash": pytest.Stash()})()
    config.stash[costs.RUN_START] = (time.monotonic() - 20.0, costs.busy_cpu_s())
    assert costs.spread_run_line(config, cores=2).split()[:3] == ["unit", "1", "20s"]
    costs.TESTS_SEEN["engine"] = 2
    assert costs.spread_run_line(config, cores=2).split()[:2] == ["all", "3"]
