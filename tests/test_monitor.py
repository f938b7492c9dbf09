"""The Monitor's charts: shaped into what a person reads before the browser draws them."""

from __future__ import annotations

import pytest

from chat.charts import COLOURS
from chat.monitor import CHARTS, Monitor, Sample, chart_data, is_quiet, time_axis, window_words
from chat.ui.monitor_tab import PRESET, TIME, frame, updates
from tests.stand_in_fixtures import engine, registry, service  # noqa: F401 - on the stand-in engine

NOW = 29_833_333 * 60 + 17.0  # 17 s past a whole minute
BY_FIELD = {chart.field: chart for chart in CHARTS}


def sample(ago_s: float, preset: str = "Tiny", *, tokens_per_s: float = 12.345, running: int = 1, waiting: int = 0,
           kv: float = 0.4567, p50: float | None = 721.376285, p95: float | None = 980.5) -> Sample:
    return Sample(NOW - ago_s, preset, tokens_per_s, running, waiting, kv, p50, p95)


def idle(ago_s: float) -> Sample:
    return sample(ago_s, tokens_per_s=0.0, running=0, kv=0.0, p50=None, p95=None)


def monitor_with(*samples: Sample) -> Monitor:
    monitor = Monitor(registry=[], window_s=300)  # type: ignore[arg-type]  # sampling is not under test
    monitor.samples.extend(samples)
    return monitor


def test_axis_titles_are_words_with_units_never_field_names():
    for chart in CHARTS:
        for text in (chart.title, chart.y_title):
            assert "_" not in text and text[0].isupper(), text
    assert [chart.y_title for chart in CHARTS] == [
        "Tokens per second", "Replies", "Replies", "Percent used", "Milliseconds", "Milliseconds",
    ]


@pytest.mark.parametrize(("field", "shown"), [
    ("ttft_p50_ms", 721), ("ttft_p95_ms", 980), ("tokens_per_s", 12.3), ("kv_cache_percent", 0.5), ("running", 1),
])
def test_values_are_rounded_to_what_a_person_reads(field, shown):
    data = chart_data([sample(10)], BY_FIELD[field], NOW, 300)
    (_, _, value), = data.points
    assert value == shown and type(value) is type(shown)


@pytest.mark.parametrize(("field", "values", "top"), [
    ("kv_cache_percent", [0.3], 100),  # percent is drawn 0-100, not magnified to 0-1
    ("kv_cache_percent", [97.0], 100),
    ("tokens_per_s", [0.0], 10),  # a quiet chart keeps a floor, so small values look small
    ("tokens_per_s", [16.1], 20),
    ("tokens_per_s", [21.0], 25),
    ("running", [0], 5),
    ("running", [7], 10),
    ("ttft_p50_ms", [721.4], 1000),
    ("ttft_p50_ms", [31.0], 100),
])
def test_the_value_axis_starts_at_zero_and_ends_at_a_round_number(field, values, top):
    samples = [sample(10 + i, **{{"kv_cache_percent": "kv", "ttft_p50_ms": "p50"}.get(field, field): v})
               for i, v in enumerate(values)]
    assert chart_data(samples, BY_FIELD[field], NOW, 300).y_lim == (0.0, top)


def test_the_time_axis_spans_whole_minutes_around_the_window_even_with_one_point():
    start, end = time_axis(NOW, 300)
    assert end % 60 == 0 and start % 60 == 0
    assert start <= NOW - 300 and end >= NOW and end - start == 360
    one = chart_data([sample(1)], BY_FIELD["tokens_per_s"], NOW, 300)
    assert one.x_lim == (start, end) and len(one.points) == 1
    assert time_axis(NOW + 30, 300) == (start, end), "the axis moves once a minute, not on every refresh"


def test_old_samples_are_left_out_and_missing_values_break_the_line():
    data = chart_data([sample(301), sample(10, p50=None), sample(5)], BY_FIELD["ttft_p50_ms"], NOW, 300)
    assert [(at, value) for at, _, value in data.points] == [(NOW - 10, None), (NOW - 5, 721)]


def test_a_line_breaks_across_idle_minutes_instead_of_joining_them():
    ttft = BY_FIELD["ttft_p50_ms"]
    # Replies, then two idle minutes (no reply started: no median), then replies again.
    busy_then_idle = [sample(250, p50=1200.0), sample(248, p50=1200.0),
                      *(sample(ago, p50=None) for ago in range(246, 120, -2)), sample(100, p50=300.0), sample(98, p50=300.0)]
    points = chart_data(busy_then_idle, ttft, NOW, 300).points
    values = [value for _, _, value in points]
    assert values[:2] == [1200, 1200] and values[-2:] == [300, 300] and set(values[2:-2]) == {None}
    # No sample at all for minutes (the engine was asleep): a None point between the two runs.
    asleep = chart_data([sample(250), sample(248), sample(100), sample(98)], ttft, NOW, 300).points
    assert [value for _, _, value in asleep] == [721, 721, None, 721, 721]
    assert asleep[2][0] == NOW - 174, "the gap sits between the last sample before and the first after"
    # Samples at the sampling interval (2 s, a little late at times) are one line.
    steady = chart_data([sample(ago + 0.5 * (ago % 3)) for ago in range(60, 0, -2)], ttft, NOW, 300).points
    assert None not in [value for _, _, value in steady]


def test_each_preset_gets_its_own_gaps_and_a_preset_without_load_stays_off_the_load_charts():
    shared = Sample(NOW - 10, "Deterministic", None, None, None, None, 400.0, 450.0)
    samples = [sample(12, "Tiny"), shared, sample(8, "Tiny"), Sample(NOW - 6, "Deterministic", None, None, None, None, 410.0, 460.0)]
    ttft = chart_data(samples, BY_FIELD["ttft_p50_ms"], NOW, 300)
    assert [(p, v) for _, p, v in ttft.points] == [("Tiny", 721), ("Tiny", 721), ("Deterministic", 400), ("Deterministic", 410)]
    load = chart_data(samples, BY_FIELD["running"], NOW, 300)
    assert {p for _, p, _ in load.points} == {"Tiny"}


def test_a_chart_says_why_it_has_no_line_yet():
    ttft = BY_FIELD["ttft_p50_ms"]
    assert chart_data([sample(4, p50=None)], ttft, NOW, 300).note == "No reply started in the last minute."
    assert chart_data([sample(4)], ttft, NOW, 300).note.startswith("One sample so far: the line appears with the next one")
    assert chart_data([sample(4), sample(2)], ttft, NOW, 300).note is None
    two_presets = chart_data([sample(4, "A"), sample(4, "B"), sample(2, "A")], ttft, NOW, 300)
    assert two_presets.note is None
    assert chart_data([sample(6, p50=None), sample(4, p50=None)], ttft, NOW, 300).note == "No reply started in the last minute."


def test_nothing_happened_in_the_window_gives_one_plain_sentence_instead_of_flat_lines():
    assert window_words(300) == "5 minutes" and window_words(60) == "minute" and window_words(90) == "90 seconds"
    quiet = monitor_with(idle(20), idle(10), sample(400))  # the busy one is older than the window
    assert is_quiet(quiet.samples) is False and quiet.charts(NOW) is None
    assert quiet.quiet_message == "No replies in the last 5 minutes: send a message on the Chat tab to see the load here."
    assert monitor_with().charts(NOW) is None
    busy = monitor_with(idle(20), sample(10)).charts(NOW)
    assert busy is not None and [data.chart for data in busy] == list(CHARTS)


def test_the_frame_names_its_columns_in_words_and_sends_times_the_browser_shows_in_local_time():
    import gradio as gr

    data = chart_data([sample(10), sample(8)], BY_FIELD["ttft_p50_ms"], NOW, 300)
    table = frame(data)
    assert list(table.columns) == [TIME, PRESET, "Milliseconds"]
    sent = gr.LinePlot(x=TIME, y="Milliseconds", color=PRESET).postprocess(table)
    assert sent.datatypes == {TIME: "temporal", PRESET: "nominal", "Milliseconds": "quantitative"}
    # Epoch milliseconds: the chart (Vega) draws them in the reader's own time zone.
    assert sent.data == [[(NOW - 10) * 1000, "Tiny", 721], [(NOW - 8) * 1000, "Tiny", 721]]


def test_a_gap_is_sent_to_the_browser_as_null_in_whole_and_decimal_charts():
    import gradio as gr

    for field, y in (("running", "Replies"), ("ttft_p50_ms", "Milliseconds"), ("tokens_per_s", "Tokens per second")):
        data = chart_data([sample(250), sample(248), sample(100)], BY_FIELD[field], NOW, 300)
        sent = gr.LinePlot(x=TIME, y=y, color=PRESET).postprocess(frame(data))
        assert [row[2] is None for row in sent.data] == [False, False, True, False], (field, sent.data)
        assert sent.datatypes[y] == "quantitative"


def test_an_empty_frame_keeps_its_column_types():
    import gradio as gr

    table = frame(chart_data([], BY_FIELD["tokens_per_s"], NOW, 300))
    sent = gr.LinePlot(x=TIME, y="Tokens per second", color=PRESET).postprocess(table)
    # A numeric empty Preset column would draw a colour gradient from -Infinity to Infinity.
    assert sent.data == [] and sent.datatypes[PRESET] == "nominal" and sent.datatypes[TIME] == "temporal"


def test_updates_show_the_note_alone_when_quiet_and_the_charts_otherwise():
    quiet = monitor_with(idle(3))
    note, column, _, *plots = updates(quiet, NOW)
    assert note.visible is True and note.value == quiet.quiet_message and column.visible is False
    assert len(plots) == len(CHARTS)
    note, column, legend, *plots = updates(monitor_with(sample(3), sample(1)), NOW)
    assert note.visible is False and column.visible is True
    assert ">Tiny</li>" in legend and all(plot.color_map == {"Tiny": COLOURS[0]} for plot in plots), "one colour per preset"
    assert [plot.y_lim for plot in plots] == [[0, 20], [0, 5], [0, 5], [0, 100], [0, 1000], [0, 1000]]
    assert all(plot.x_lim[1] - plot.x_lim[0] == 360 and plot.caption is None for plot in plots)


@pytest.mark.engine
async def test_a_preset_sharing_another_presets_engine_gets_its_own_first_token_line(registry, engine, default_preset):
    """Compare's two SmolLM2 presets share one engine, whose view is named after the preset that
    started it: the other one (used only in Compare, say) was missing from the Monitor."""
    from chat.presets import load_presets
    from chat.service import ChatService, Finished, ReplyRequest

    presets = load_presets()
    other = next(p for p in presets.presets.values() if p.engine_key == default_preset.engine_key and p is not default_preset)
    service = ChatService(presets, registry, default_preset.name)
    monitor = Monitor(registry)
    for name in (default_preset.name, other.name):
        events = [event async for event in service.reply(ReplyRequest("Say yes.", preset=name, sampling={"max_tokens": 2}))]
        assert isinstance(events[-1], Finished)
    monitor.sample()
    monitor.sample()
    charts = monitor.charts()
    assert charts is not None
    by_chart = {data.chart.field: {preset for _, preset, value in data.points if value is not None} for data in charts}
    # Both presets have their line (presets of other tests' engines may have theirs too: first tokens are
    # kept for minutes, and the session's engines are shared).
    assert by_chart["ttft_p50_ms"] == by_chart["ttft_p95_ms"] >= {default_preset.name, other.name}
    # The engine's load is drawn once, under the engine's name (other engines of the session may be drawn too).
    assert default_preset.name in by_chart["running"] and other.name not in by_chart["running"]
