"""The page on a phone, a tablet and a laptop: the message box on screen and usable, settings where
they act, Stop only while a reply is written. Screenshots of each tab at each width land in tests/output/."""

from __future__ import annotations

import os

import pytest

from chat.stats import REPLIED
from tests.conftest import OUTPUT, ROOT
from tests.pages import open_tab
from tests.test_browser import REPLY_TITLE, send, watch_reply

pytestmark = pytest.mark.browser

WIDTHS = {"phone": (390, 844), "tablet": (768, 1024), "laptop": (1366, 900)}
CHAT_SETTINGS = "#preset"


def covered_by(page, selector: str) -> str:
    """What the browser would click at the centre of the element: its own tag when nothing covers it."""
    return page.evaluate(
        """(selector) => {
          const el = document.querySelector(selector);
          const box = el.getBoundingClientRect();
          const hit = document.elementFromPoint(box.x + box.width / 2, box.y + box.height / 2);
          return hit === el ? 'itself' : (hit ? hit.outerHTML.slice(0, 120) : 'nothing (off screen)');
        }""",
        selector,
    )


# Whether Stop showed at any moment from now on: a 12-token reply can be written between two looks
# of a wait for it (a full run once missed it over 62 looks), so every change of the page is watched.
WATCH_STOP = """() => {
  window.stopShown = false;
  const look = () => {
    if (document.querySelector('#stop')?.checkVisibility()) { window.stopShown = true; observer.disconnect(); }
  };
  const observer = new MutationObserver(look);
  observer.observe(document.body, {attributes: true, childList: true, subtree: true});
}"""
# Visible elements whose right edge passes the screen's (a control reachable only by scrolling
# sideways), and boxes that scroll sideways inside themselves (a table wider than its box). Left out:
# Gradio's plots, which draw at their box's width (their text is checked by UNREADABLE_CHART_TEXT),
# and a code block, whose long lines scroll as code does.
PAST_THE_EDGE = """(root) => [...document.querySelectorAll(root + ' *')]
    .filter((e) => e.checkVisibility() && !e.closest('.vega-embed, pre'))
    .filter((e) => e.getBoundingClientRect().right > window.innerWidth + 1
                   || (e.scrollWidth > e.clientWidth + 1 && ['auto', 'scroll'].includes(getComputedStyle(e).overflowX)))
    .map((e) => e.tagName + '#' + e.id + '.' + String(e.className).slice(0, 40))"""

# Text of the charts (SVG) under `root` that reads smaller than 11 px as drawn (a chart shrunk to
# the screen shrinks its text), or that passes its chart's edges or those of a box around it that
# hides what overflows (a title cut off, axis labels below a box's fixed height).
UNREADABLE_CHART_TEXT = """(root) => [...document.querySelectorAll(root + ' svg text')]
    .filter((t) => t.checkVisibility() && t.textContent.trim())
    .flatMap((t) => {
      const ctm = t.getScreenCTM(), box = t.getBoundingClientRect();
      const px = parseFloat(getComputedStyle(t).fontSize) * Math.hypot(ctm.a, ctm.b);
      const faults = [];
      if (px < 11) faults.push(px.toFixed(1) + ' px');
      for (let e = t.ownerSVGElement; e && e !== document.body; e = e.parentElement) {
        const style = getComputedStyle(e);
        if (e.tagName.toLowerCase() !== 'svg' && style.overflowX === 'visible' && style.overflowY === 'visible') continue;
        const edge = e.getBoundingClientRect();
        if (box.left < edge.left - 1 || box.right > edge.right + 1 || box.top < edge.top - 1 || box.bottom > edge.bottom + 1) {
          faults.push('cut at the edge of ' + e.tagName.toLowerCase() + '#' + e.id);
          break;
        }
      }
      return faults.length ? [t.textContent.trim().slice(0, 60) + ': ' + faults.join(', ')] : [];
    })"""

# Text in elements under `root` matching `selector` that is cut: ellipsis, clipped, or past the screen.
CUT_TEXT = """([root, selector]) => [...document.querySelectorAll(root + ' ' + selector)]
    .filter((e) => e.checkVisibility())
    .filter((e) => e.scrollWidth > e.clientWidth + 1 || e.getBoundingClientRect().right > window.innerWidth + 1)
    .map((e) => e.textContent.trim())"""


def visible_count(page, selector: str) -> int:
    return page.evaluate("(s) => [...document.querySelectorAll(s)].filter((e) => e.checkVisibility()).length", selector)


def on_first_screen(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    size = page.viewport_size
    return box is not None and box["y"] >= 0 and box["y"] + box["height"] <= size["height"] and box["x"] + box["width"] <= size["width"]


@pytest.mark.parametrize("device", list(WIDTHS))
def test_the_chat_works_at_every_width_with_the_message_box_on_screen(open_page, app_server, device):
    width, height = WIDTHS[device]
    page = open_page(app_server.url, width=width, height=height, touch=device != "laptop", mobile=device == "phone")

    assert covered_by(page, "#message textarea") == "itself"
    assert page.evaluate("document.scrollingElement.scrollWidth <= window.innerWidth + 1"), "no sideways scrolling"
    assert not page.locator("#stop").is_visible(), "Stop shows only while a reply is written"
    if device == "phone":  # settings wait behind a button, and close again
        saved_chats = page.locator("#saved-chats")
        assert saved_chats.evaluate("e => getComputedStyle(e).maxHeight") != "none", "a short list of saved chats"
        page.locator(CHAT_SETTINGS).wait_for(state="attached")  # drawn, and hidden
        assert not page.locator(CHAT_SETTINGS).is_visible()
        tabs = page.get_by_role("tab").all()
        assert len({round(tab.bounding_box()["y"]) for tab in tabs}) == 1, "the tabs sit on one row"
        page.locator("#settings-open").click()
        page.locator(CHAT_SETTINGS).wait_for(state="visible")
        assert on_first_screen(page, "#settings-done")
        page.locator("#knob-max_tokens").scroll_into_view_if_needed()
        assert page.evaluate(PAST_THE_EDGE, "#chat-settings") == [], "every setting within the screen's width"
        assert on_first_screen(page, "#knob-max_tokens input[type=number]")
    page.locator(CHAT_SETTINGS).wait_for(state="visible")  # on a laptop, beside the chat once drawn
    page.locator("#knob-max_tokens input[type=number]").fill("12")  # a short reply
    page.locator("#knob-max_tokens input[type=number]").press("Tab")
    if device == "phone":
        page.locator("#settings-done").click()
        page.locator(CHAT_SETTINGS).wait_for(state="hidden")
        assert covered_by(page, "#message textarea") == "itself"

    page.evaluate(WATCH_STOP)
    send(page, "Name three colours.")
    _, title = watch_reply(page, REPLIED)
    assert page.evaluate("window.stopShown"), "Stop shows while the reply is written"
    assert "12 tokens" in title or "finished" in title
    page.locator("#stop").wait_for(state="hidden")
    assert page.locator(REPLY_TITLE).last.is_visible()
    assert covered_by(page, "#message textarea") == "itself"
    page.screenshot(path=str(OUTPUT / f"layout-{device}-chat.png"))
    if device == "phone" and os.environ.get("UPDATE_SCREENSHOTS"):  # the README's phone picture
        page.screenshot(path=str(ROOT / "docs" / "screenshot-phone.png"))

    for tab in ("Compare", "Monitor"):
        open_tab(page, tab)
        assert not page.locator(CHAT_SETTINGS).is_visible(), f"the chat's settings do not show on {tab}"
        assert not page.locator("#stop").is_visible()
        page.screenshot(path=str(OUTPUT / f"layout-{device}-{tab.lower()}.png"))
    open_tab(page, "Compare")
    page.evaluate("window.scrollTo(0, 0)")
    assert on_first_screen(page, "#compare-prompt textarea") and on_first_screen(page, "#compare-send"), \
        "Compare opens ready to use: its prompt and Send on the first screen"
    assert page.locator("#compare-blind input").is_checked(), "blind for a first visitor"
    for tab in ("Chat", "Compare", "Leaderboard", "Monitor"):
        open_tab(page, tab)
        assert page.evaluate(PAST_THE_EDGE, "body") == [], f"nothing on {tab} past the screen's edge"


@pytest.mark.parametrize("device", ["phone", "laptop"])
def test_the_title_shows_before_the_scripts_run_where_gradio_will_draw_it(browser, app_server, device):
    """The page's HTML carries the Chat tab's title (chat/ui/page_shell.py): a visitor reads it at
    once, not after Gradio's scripts have built the page, and it gives way to Gradio's own title in
    the same place, so nothing jumps."""
    width, height = WIDTHS[device]
    sizes = {"viewport": {"width": width, "height": height}, "is_mobile": device == "phone"}
    title = "(e) => { const b = e.getBoundingClientRect(); return {x: b.x, y: b.y, h: b.height, text: e.textContent}; }"
    without_scripts = browser.new_context(java_script_enabled=False, **sizes)
    page = without_scripts.new_page()
    page.goto(app_server.url)
    shell = page.locator("#page-shell h2")
    assert shell.is_visible(), "the title is in the page's HTML"
    before = shell.evaluate(title)
    without_scripts.close()

    context = browser.new_context(**sizes)
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.goto(app_server.url)
    drawn = page.locator("#title h2")
    drawn.wait_for()
    after = drawn.evaluate(title)
    assert not page.locator("#page-shell").is_visible(), "gone once Gradio has drawn the page"
    assert after["text"] == before["text"]
    # The same line; on a laptop Gradio's page has a scroll bar, which moves its centred column 7.5 px.
    assert abs(after["y"] - before["y"]) <= 1 and abs(after["h"] - before["h"]) <= 1, (before, after)
    assert abs(after["x"] - before["x"]) <= 10, (before, after)
    # marked, the reply renderer's parser, comes as a script of its own, kept by the browser.
    page.wait_for_function("() => typeof window.marked?.Marked === 'function'")  # it may load after the page is drawn
    context.close()
