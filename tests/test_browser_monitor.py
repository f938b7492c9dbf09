"""The Monitor tab in a real browser: words on the axes, the reader's own clock, and lines that
break where there is no data."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest

from chat.monitor import CHARTS
from chat.stats import REPLIED
from tests.conftest import OUTPUT, free_port
from tests.test_browser import REPLY_TITLE, SHORT, send
from tests.test_browser_layout import CUT_TEXT, PAST_THE_EDGE, UNREADABLE_CHART_TEXT

pytestmark = pytest.mark.browser

ZONE = "Asia/Kolkata"  # UTC+5:30: a clock no server runs on by accident, so UTC labels would show


def test_the_monitor_draws_words_and_local_clock_times_after_a_reply(browser, app_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id=ZONE)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        page.goto(app_server.url)
        send(page, "Say hello in five words.", max_tokens=SHORT)
        page.locator(REPLY_TITLE).filter(has_text=REPLIED).first.wait_for(timeout=90_000)

        page.get_by_role("tab", name="Monitor").click()
        charts = page.locator("#monitor-charts")
        # Each chart is drawn on its own (Vega, one after another): wait for all of them.
        page.wait_for_function("(n) => document.querySelectorAll('#monitor-charts svg.marks').length === n", arg=len(CHARTS))
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / "monitor.png"), full_page=True)

        texts = charts.locator("svg text").all_text_contents()
        assert {"Time", "Tokens per second", "Replies", "Percent used", "Milliseconds"} <= set(texts)
        assert page.locator("#monitor-legend li").all_inner_texts(), "one legend names each preset's colour"
        assert [chart.title for chart in CHARTS] == [page.locator(f"#monitor-{chart.field}").get_by_text(chart.title).inner_text()
                                                     for chart in CHARTS], "each chart's title above it"
        assert not [text for text in texts if "_" in text], "no variable names on the charts"
        assert "100" in page.locator("#monitor-kv_cache_percent svg text").all_text_contents(), "percent runs to 100"

        clock = re.compile(r"^(\d{1,2}:\d{2}):\d{2} [AP]M$")
        labels = [match.group(1) for text in texts if (match := clock.match(text))]
        assert labels, texts
        now = dt.datetime.now(ZoneInfo(ZONE))
        near = {f"{t.hour % 12 or 12}:{t.minute:02d}" for t in (now + dt.timedelta(minutes=m) for m in range(-8, 3))}
        assert set(labels) <= near, f"labels {sorted(set(labels))} are not the reader's clock ({ZONE}) near {now:%H:%M}"
        assert page.evaluate(UNREADABLE_CHART_TEXT, "#monitor-charts") == [], "the charts' text on a laptop"

        # On a phone: a chart a row, drawn again at the screen's width; no text under 11 px, no title cut.
        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_function("""(n) => [...document.querySelectorAll('#monitor-charts svg.marks')]
            .filter((svg) => svg.getBoundingClientRect().width > 250 && svg.getBoundingClientRect().right <= innerWidth)
            .length === n""", arg=len(CHARTS))
        assert page.evaluate(UNREADABLE_CHART_TEXT, "#monitor-charts") == [], "the charts' text on a phone"
        titles = [page.locator(f"#monitor-{chart.field}").get_by_text(chart.title) for chart in CHARTS]
        assert page.evaluate(CUT_TEXT, ["#monitor-charts", "[data-testid='block-info'], .chart-legend li"]) == []
        assert all(title.is_visible() for title in titles)
        assert page.evaluate(PAST_THE_EDGE, "body") == [], "nothing on the Monitor past a phone's edge"
        page.screenshot(path=str(OUTPUT / "monitor-phone.png"), full_page=True)
    finally:
        context.close()



def test_a_monitor_line_breaks_in_the_browser_where_the_data_has_a_gap(browser):
    """The chart library (Vega-Lite in Gradio's plot) breaks a line at a null value; our gap points
    are those nulls. One line with a gap in the middle must be drawn as two pieces."""
    import gradio as gr

    from chat.monitor import CHARTS, Sample, chart_data
    from chat.ui.monitor_tab import PRESET, TIME, frame

    now = 29_833_333 * 60 + 17.0
    ttft = next(chart for chart in CHARTS if chart.field == "ttft_p50_ms")

    def at(ago: float, p50: float | None) -> Sample:
        return Sample(now - ago, "Tiny", 1.0, 1, 0, 1.0, p50, p50)

    joined = chart_data([at(250, 1200.0), at(248, 1200.0), at(100, 300.0), at(98, 300.0)], ttft, now, 300, gap_s=1e9)
    broken = chart_data([at(250, 1200.0), at(248, 1200.0), at(100, 300.0), at(98, 300.0)], ttft, now, 300)
    with gr.Blocks() as demo:
        for name, data in (("joined", joined), ("broken", broken)):
            gr.LinePlot(frame(data), x=TIME, y=ttft.y_title, color=PRESET, x_lim=list(data.x_lim), y_lim=list(data.y_lim),
                        elem_id=f"plot-{name}")
    port = free_port()
    demo.launch(server_port=port, prevent_thread_lock=True, quiet=True)
    page = browser.new_page()
    try:
        page.goto(f"http://127.0.0.1:{port}/")
        pieces = {}
        for name in ("joined", "broken"):
            line = page.locator(f"#plot-{name} svg path[aria-roledescription='line mark']")
            line.first.wait_for()
            d = line.first.get_attribute("d") or ""
            pieces[name] = d.count("M")  # each piece of a path starts with a move
        assert pieces == {"joined": 1, "broken": 2}, pieces
    finally:
        page.close()
        demo.close()
