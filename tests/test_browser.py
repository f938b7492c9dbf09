"""The page in a real browser: Debian's Chromium, headless, driven by Playwright."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import OUTPUT

pytestmark = pytest.mark.browser

CHROMIUM = "/usr/bin/chromium"
REPLY_TEXT = "#chatbot .bot-row .message:not(.thought) > [data-testid=bot]"
REPLY_TITLE = "#chatbot .bot-row .thought .title"


@pytest.fixture(scope="module")
def browser():
    """Module-scoped: Playwright's sync API holds an event loop in this thread until it stops,
    which the async tests of later modules need free."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        yield browser
        browser.close()


@pytest.fixture
def page(browser, app_server, request):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(app_server.url)
    page.wait_for_selector("#message textarea")
    yield page
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / f"{request.node.name}.png"), full_page=True)
    context.close()


def send(page, text: str) -> None:
    box = page.locator("#message textarea")
    box.fill(text)
    box.press("Enter")


def watch_reply(page, until: str, within_s: float = 90) -> tuple[list[str], str]:
    """Poll the last reply until its stats title contains `until`; return texts seen and the title."""
    seen: list[str] = []
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        texts = page.locator(REPLY_TEXT).all_inner_texts()
        if texts and (not seen or texts[-1] != seen[-1]):
            seen.append(texts[-1])
        titles = page.locator(REPLY_TITLE).all_inner_texts()
        if titles and until in titles[-1]:
            return seen, titles[-1]
        time.sleep(0.05)
    raise AssertionError(f"no reply title containing {until!r} within {within_s} s; texts seen: {seen[-3:]}")


def test_a_reply_grows_word_by_word_with_stats_beneath_it(page, app_server):
    send(page, "Write a short poem about the moon.")
    seen, title = watch_reply(page, "first token")
    growing = [text for text in seen if text.strip() and not text.startswith("⏳")]
    assert len(growing) >= 3, f"the reply should grow in steps, saw {growing}"
    assert all(len(a) <= len(b) for a, b in zip(growing, growing[1:], strict=False)), growing
    assert re.search(r"first token [\d.]+ m?s · [\d.]+ tokens/s · [\d,]+ tokens · [\d.]+ m?s total", title)
    reply_box = page.locator(REPLY_TEXT).last.bounding_box()
    stats_box = page.locator(REPLY_TITLE).last.bounding_box()
    assert stats_box["y"] > reply_box["y"] + reply_box["height"] - 1, "stats sit beneath the reply"
    assert page.locator(REPLY_TITLE).last.is_visible()
    page.screenshot(path=str(OUTPUT / "chat-with-stats.png"))


def test_stop_ends_the_reply_as_stopped_by_you_and_frees_the_engine(page, app_server):
    send(page, "Tell me a very long story about a dragon who learns to bake bread.")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        texts = page.locator(REPLY_TEXT).all_inner_texts()
        if texts and len(texts[-1]) > 20:
            break
        time.sleep(0.05)
    page.locator("#stop").click()
    _, title = watch_reply(page, "stopped by you", within_s=15)
    assert "tokens" in title
    body = app_server.wait_idle()
    assert all(e["running"] == 0 and e["unfinished"] == 0 for e in body["engines"])
    # The conversation goes on after a stop.
    send(page, "Say hi.")
    watch_reply(page, "first token")
