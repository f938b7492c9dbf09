"""Accessibility in a real browser: axe-core (bundled by axe-playwright-python) finds no serious or
critical problem on any tab, fresh or with replies, charts and a comparison on it; and the chat works
from the keyboard alone (type, send, stop, switch preset)."""

from __future__ import annotations

import contextlib
import time

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from chat.stats import REPLIED
from chat.ui.messages import WAITING
from tests.pages import open_tab
from tests.test_browser import COMPARE_TITLE, MAX_TOKENS, REPLY_TEXT, REPLY_TITLE, TO_STOP
from tests.test_browser_layout import PAST_THE_EDGE

pytestmark = pytest.mark.browser

AXE = Axe()
WIDTHS = {"phone": (390, 844), "laptop": (1366, 900)}
BLOCKING = {"serious", "critical"}
# No exceptions: the tables that scrolled inside an unfocusable box (Gradio's Dataframe, which axe
# reported as scrollable-region-focusable on a phone) are plain tables now (chat/ui/tables.py).


# Gradio dims a component to a fifth while it updates (`.pending`) and rings one being written
# (`.generating`): a scan then would judge the dimmed colours and a half-made reply, not the page.
SETTLED = "() => !document.querySelector('.pending, .generating')"


def problems(page, settled: bool = True) -> list[str]:
    """axe's serious and critical findings on the page, one line per element: once Gradio has no
    update in flight (or, if one never ends, after half a minute), unless `settled` is False."""
    if settled:
        with contextlib.suppress(PlaywrightTimeout):
            page.wait_for_function(SETTLED, timeout=30_000)
    found = []
    for rule in AXE.run(page).response["violations"]:
        if rule["impact"] not in BLOCKING:
            continue
        for node in rule["nodes"]:
            found.append(f"{rule['id']} ({rule['impact']}, {rule['help']}): {node['target']} {node['html'][:160]}")
    return found


@pytest.fixture
def new_page(open_page, app_server):
    """`new_page(device)`: a page on the app at a phone's (touch, a mobile viewport) or a laptop's size,
    in reduced motion (the page then drops Gradio's fades, which axe would catch half-way: a fading
    progress timer measures as low contrast)."""
    def new_page(device: str = "laptop"):
        width, height = WIDTHS[device]
        phone = device == "phone"
        return open_page(app_server.url, width=width, height=height, touch=phone, mobile=phone, reduced_motion="reduce")

    return new_page


def tab_names(page) -> list[str]:
    """Every tab the page shows, including those a narrow screen keeps under "More tabs"."""
    more = page.get_by_role("button", name="More tabs")
    hidden = page.locator(".overflow-dropdown button").all_inner_texts() if more.count() else []
    return page.get_by_role("tab").all_inner_texts() + hidden


def focused(page) -> str:
    """The id of the element (or nearest ancestor with one) that has the keyboard focus."""
    return page.evaluate("() => document.activeElement?.closest('[id]')?.id ?? ''")


@pytest.mark.parametrize("device", list(WIDTHS))
def test_every_tab_has_no_serious_accessibility_problem(new_page, device):
    page = new_page(device)
    found = {}
    names = tab_names(page)
    assert {"Chat", "Compare", "Monitor"} <= set(names), names
    for name in names:
        open_tab(page, name)
        found[name] = problems(page)
    if device == "phone":
        open_tab(page, "Chat")
        page.locator("#settings-open").click()
        page.locator("#preset").wait_for(state="visible")
        found["Chat's settings"] = problems(page)
    assert not any(found.values()), found


# A button's disabled look and its enabled one, read as the page turns it from the one to the other.
# Any transition, however short, starts only at the next frame drawn: until then the button kept its
# disabled look, which axe judged (the Leaderboard's downloads, enabled as the tab opens, measured
# 3.28:1 while the page was busy drawing the tab's table and chart).
ENABLED_AT_ONCE = """async (selector) => {
  const button = document.querySelector(selector);
  button.disabled = true;
  await new Promise((drawn) => requestAnimationFrame(() => requestAnimationFrame(drawn)));
  const dimmed = getComputedStyle(button).opacity;
  button.disabled = false;
  return [dimmed, getComputedStyle(button).opacity];
}"""


def test_a_button_enabled_under_reduced_motion_looks_enabled_at_once(new_page):
    page = new_page()
    open_tab(page, "Leaderboard")
    button = "#leaderboard-export-leaderboard-json"
    page.wait_for_function(f"() => document.querySelector('{button}')?.disabled === false")
    assert page.evaluate(ENABLED_AT_ONCE, button) == ["0.5", "1"], "dimmed while disabled, then at once not"


def test_replies_charts_and_a_comparison_have_no_serious_accessibility_problem(new_page):
    page = new_page()
    found = {}
    box = page.locator("#message textarea")
    box.fill("Say hello in five words.")
    box.press("Enter")
    page.locator("#stop").wait_for(state="visible")
    # The busy stats line as a reader meets it: with its words. Gradio adds the line's button
    # first and its Markdown words a moment later; a scan in between judged a nameless button.
    page.locator(REPLY_TITLE).filter(has_text=WAITING).first.wait_for()
    found["Chat, writing"] = problems(page, settled=False)  # Stop and a busy stats line on screen
    page.locator(REPLY_TITLE).filter(has_text=REPLIED).first.wait_for(timeout=90_000)
    found["Chat, after a reply"] = problems(page)  # the stats fold beneath the reply

    open_tab(page, "Monitor")
    page.locator("#monitor-charts svg").first.wait_for()
    found["Monitor, with charts"] = problems(page)

    compare_with_replies(page)
    found["Compare, after a comparison"] = problems(page)  # votes, summary table, bar charts
    assert not any(found.values()), found


def compare_with_replies(page) -> None:
    """On the Compare tab, a comparison with names showing, until both replies and the charts are there."""
    open_tab(page, "Compare")
    page.locator("#compare-blind input").uncheck()  # the stats, summary and charts show without a vote
    prompt = page.locator("#compare-prompt textarea")
    prompt.fill("Name a fruit.")
    prompt.press("Enter")
    for column in (0, 1):
        title = page.locator(COMPARE_TITLE.format(column)).filter(has_text=REPLIED)
        title.first.wait_for(timeout=120_000)
    page.locator("#compare-ttft-plot svg").first.wait_for()


def test_a_comparison_with_replies_on_a_phone_has_no_serious_accessibility_problem(new_page):
    page = new_page("phone")
    compare_with_replies(page)
    page.locator("#compare-summary tbody td[data-label=Preset]").first.wait_for()
    assert problems(page) == []
    assert page.evaluate(PAST_THE_EDGE, "body") == [], "the summary table and all else within a phone's width"


def open_preset_list(page) -> None:
    """From the message box, Shift+Tab back to the preset list, which opens as it takes the focus."""
    tab_to(page, "Shift+Tab", "preset", tries=80)
    page.locator("#preset [role=listbox]").wait_for()


def tab_to(page, key: str, target: str, tries: int) -> None:
    """Press `key` until the element `target` (an id) has the keyboard focus, at most `tries` times."""
    for _ in range(tries):
        page.keyboard.press(key)
        if focused(page) == target:
            return
    raise AssertionError(f"{key} never reached #{target} (at {focused(page)!r})")


STAYS_CLOSED = """() => new Promise((resolve) => {
  // Watched for 30 frames (half a second): Gradio's dropdown reopened its list a tick after Tab.
  let frames = 0, opened = false;
  const look = () => {
    opened ||= !!document.querySelector('#preset [role=listbox]')?.checkVisibility();
    if (++frames < 30) requestAnimationFrame(look); else resolve(!opened);
  };
  requestAnimationFrame(look);
})"""


@pytest.mark.parametrize("key", ["Tab", "Shift+Tab"])
def test_tab_away_from_the_preset_list_closes_it(new_page, key):
    page = new_page()
    page.locator("#message textarea").focus()
    open_preset_list(page)
    page.keyboard.press(key)
    page.locator("#preset [role=listbox]").wait_for(state="hidden")
    assert page.evaluate(STAYS_CLOSED), "the list opened again after the focus left it"
    assert page.evaluate("document.activeElement !== document.body"), "the focus moved to a control, not to the page"
    assert focused(page) != "preset", "the focus moved on from the preset list"


def test_the_chat_works_from_the_keyboard_alone(new_page):
    page = new_page()
    assert focused(page) == "message", "the message box has the focus when the page opens"
    # A reply long enough to be still written when Stop is reached (set with the mouse: the
    # keyboard's part starts in the message box again).
    page.locator(MAX_TOKENS).fill(str(TO_STOP))
    page.locator(MAX_TOKENS).press("Tab")
    page.wait_for_function(f"document.querySelector({MAX_TOKENS!r}).value === '{TO_STOP}'")
    page.locator("#message textarea").focus()
    page.keyboard.type("Tell me a very long story about a dragon who learns to bake bread.")
    page.keyboard.press("Enter")

    # Stop is reachable with Tab once the reply is being written, and Enter presses it.
    deadline = time.monotonic() + 60
    while not any(len(text) > 20 for text in page.locator(REPLY_TEXT).all_inner_texts()):
        assert time.monotonic() < deadline, "no reply is being written"
        time.sleep(0.05)
    tab_to(page, "Tab", "stop", tries=10)
    page.keyboard.press("Enter")
    page.locator(REPLY_TITLE).filter(has_text="stopped by you").first.wait_for(timeout=30_000)

    # The preset list is reachable with Shift+Tab; arrows and Enter pick another preset.
    before = page.locator("#preset input").input_value()
    tab_to(page, "Shift+Tab", "preset", tries=80)
    page.keyboard.press("ArrowDown")
    page.keyboard.press("Enter")
    page.wait_for_function("(before) => document.querySelector('#preset input').value !== before", arg=before)
    chosen = page.locator("#preset input").input_value()
    page.locator("#title").filter(has_text=chosen).wait_for()

    # From the top of the page, the first Tab offers the way to the message box, from any tab.
    page.get_by_role("tab", name="Leaderboard").click()
    first = page.evaluate("""() => [...document.querySelectorAll('a[href], button, input, textarea, select, [tabindex]')]
        .filter((e) => e.tabIndex >= 0 && !e.disabled)[0].id""")
    assert first == "skip-to-message", "the first stop of Tab from the top of the page"
    page.focus("#skip-to-message")
    assert page.locator("#skip-to-message").is_visible()
    page.keyboard.press("Enter")
    page.wait_for_function("document.activeElement === document.querySelector('#message textarea')")
    assert page.get_by_role("button", name="Send message").is_visible()
