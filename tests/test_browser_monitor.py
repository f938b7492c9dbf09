"""The Monitor tab in a real browser: words on the axes, and the reader's own clock."""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

import pytest

from tests.conftest import OUTPUT

pytestmark = pytest.mark.browser

REPLY_TITLE = "#chatbot .bot-row .thought .title"
ZONE = "Asia/Kolkata"  # UTC+5:30: a clock no server runs on by accident, so UTC labels would show


def test_the_monitor_draws_words_and_local_clock_times_after_a_reply(browser, app_server):
    context = browser.new_context(viewport={"width": 1280, "height": 900}, timezone_id=ZONE)
    page = context.new_page()
    page.set_default_timeout(30_000)
    try:
        page.goto(app_server.url)
        box = page.locator("#message textarea")
        box.fill("Say hello in five words.")
        box.press("Enter")
        page.locator(REPLY_TITLE).filter(has_text="first token").first.wait_for(timeout=90_000)

        page.get_by_role("tab", name="Monitor").click()
        charts = page.locator("#monitor-charts")
        charts.locator("svg").first.wait_for()
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / "monitor.png"), full_page=True)

        texts = charts.locator("svg text").all_text_contents()
        assert {"Time", "Preset", "Tokens per second", "Replies", "Percent used", "Milliseconds"} <= set(texts)
        assert not [text for text in texts if "_" in text], "no variable names on the charts"
        assert "100" in page.locator("#monitor-kv_cache_percent svg text").all_text_contents(), "percent runs to 100"

        clock = re.compile(r"^(\d{1,2}:\d{2}):\d{2} [AP]M$")
        labels = [match.group(1) for text in texts if (match := clock.match(text))]
        assert labels, texts
        now = dt.datetime.now(ZoneInfo(ZONE))
        near = {f"{t.hour % 12 or 12}:{t.minute:02d}" for t in (now + dt.timedelta(minutes=m) for m in range(-8, 3))}
        assert set(labels) <= near, f"labels {sorted(set(labels))} are not the reader's clock ({ZONE}) near {now:%H:%M}"
    finally:
        context.close()

