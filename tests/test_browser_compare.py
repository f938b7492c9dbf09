"""The Compare tab in a real browser (Debian's Chromium, headless, driven by Playwright; the
`open_page` fixture is in conftest)."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from urllib.parse import quote

import pytest

from chat.stats import REPLIED, SUMMARY
from tests.conftest import OUTPUT
from tests.test_browser import COMPARE_TEXT, COMPARE_TITLE, TO_STOP, is_text

pytestmark = pytest.mark.browser

CREATIVE, DETERMINISTIC = "SmolLM2 135M (CPU)", "SmolLM2 135M (CPU, deterministic)"


@pytest.fixture
def open_page(open_page, app_server):
    """`open_page(query)`: the app's page with `query`, wide enough for two columns side by side."""
    return lambda query="": open_page(app_server.url + query, width=1400, height=1000)


def test_compare_is_made_when_first_opened_and_keeps_what_was_typed(open_page):
    page = open_page()
    assert page.locator("#compare-prompt").count() == 0  # not in the page until the tab is opened
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").fill("Kept while I look at the chat.")
    page.get_by_role("tab", name="Chat").click()
    page.locator("#message textarea").wait_for()
    page.get_by_role("tab", name="Compare").click()
    assert page.locator("#compare-prompt textarea").input_value() == "Kept while I look at the chat."
    assert page.locator("#compare-prompt").count() == 1  # made once


def heading(page, column: int) -> str:
    return page.locator(f"#compare-heading-{column}").inner_text().strip()


def set_number(page, selector: str, value: str) -> None:
    """Type into a slider's number box once it shows its value (the accordion renders it on opening)."""
    box = page.locator(selector)
    page.wait_for_function(f"(document.querySelector({selector!r})?.value ?? '') !== ''")
    for _ in range(5):
        box.fill(value)
        box.press("Tab")
        time.sleep(0.3)
        if box.input_value() == value:
            return
    raise AssertionError(f"{selector} kept {box.input_value()!r}")


def watch_columns(page, within_s: float = 120, done: str = REPLIED) -> list[str]:
    """Wait until both columns show their stats line (`done`); return those lines."""
    titles = [COMPARE_TITLE.format(column) for column in (0, 1)]
    page.wait_for_function(f"{titles!r}.every(s => [...document.querySelectorAll(s)].at(-1)?.innerText.includes({done!r}))",
                           timeout=within_s * 1000)
    return [page.locator(title).last.inner_text() for title in titles]


# Every text each column's last reply shows, frame by frame as the page paints (a poll from here
# could miss steps on a busy machine: a reply of 200 tokens is written in ~3 s; at 100, ~1.5 s, a page
# starved of CPU in a full run could paint as few as 4 frames of it).
RECORD_COLUMNS = """texts => {
  window.__columns = texts.map(() => []);
  const take = () => {
    texts.forEach((selector, i) => {
      const text = [...document.querySelectorAll(selector)].at(-1)?.innerText ?? '';
      const seen = window.__columns[i];
      if (text && seen.at(-1) !== text) seen.push(text);
    });
    window.__recorder = requestAnimationFrame(take);
  };
  take();
}"""
RECORDED_COLUMNS = "() => { cancelAnimationFrame(window.__recorder); return window.__columns; }"


def test_blind_comparison_streams_votes_reveals_summarises_and_exports(open_page):
    page = open_page()
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-prompt textarea").wait_for()
    presets = page.locator("#compare-presets")
    page.locator("#compare-heading-1").wait_for(state="visible")  # drawn, so that "hidden" below is the pick's answer
    presets.get_by_label(DETERMINISTIC).uncheck()
    page.locator("#compare-heading-1").wait_for(state="hidden")
    presets.get_by_label(DETERMINISTIC).check()
    page.locator("#compare-heading-1").wait_for(state="visible")
    assert presets.get_by_label(CREATIVE).is_checked()
    page.locator("#compare-blind input").check()
    page.wait_for_function("document.querySelector('#compare-heading-0')?.innerText.trim() === 'A'")
    page.locator("#compare-settings").get_by_text("Settings per preset").click()
    # Blind: one set of settings for every column (the second preset's would tell the columns apart).
    page.locator("#compare-settings").get_by_text("Every column").wait_for()
    assert page.locator("#compare-knob-1-max_tokens").is_hidden()
    set_number(page, "#compare-knob-0-max_tokens input[type=number]", "200")

    page.locator("#compare-prompt textarea").fill("Write a long poem about the sea.")
    page.evaluate(RECORD_COLUMNS, [COMPARE_TEXT.format(column) for column in (0, 1)])
    page.locator("#compare-prompt textarea").press("Enter")
    titles = watch_columns(page, done="Stats are shown after you vote")
    seen = {column: [text for text in texts if is_text(text)] for column, texts in enumerate(page.evaluate(RECORDED_COLUMNS))}
    for column, texts in seen.items():
        assert len(texts) >= 3, f"column {column} should grow in steps, saw {texts}; stats: {titles}"
        assert all(len(a) <= len(b) for a, b in zip(texts, texts[1:], strict=False)), texts
    # Before the vote nothing beneath the replies tells the columns apart: no tokens, no times.
    assert titles[0] == titles[1] and not re.search(r"\d", titles[0]), titles
    reply_box = page.locator(COMPARE_TEXT.format(0)).last.bounding_box()
    stats_box = page.locator(COMPARE_TITLE.format(0)).last.bounding_box()
    assert stats_box["y"] > reply_box["y"] + reply_box["height"] - 1, "stats sit beneath the reply"
    assert (heading(page, 0), heading(page, 1)) == ("A", "B"), "names stay hidden until the vote"

    # The buttons come with Gradio's last redraw of the turn, which may follow the live text's last
    # line; the summary comes with them.
    page.locator("#compare-vote-0").wait_for(state="visible", timeout=60_000)
    summary = page.locator("#compare-summary").inner_text()
    assert "SmolLM2" not in summary and not re.search(r"\d+\.\d", summary), summary
    votes = page.locator("[id^=compare-vote-]:visible")
    assert votes.all_inner_texts() == ["A is better", "B is better", "Tie", "Both bad"]
    page.locator("#compare-vote-0").click()
    page.wait_for_function("document.querySelector('#compare-heading-0')?.innerText.includes('SmolLM2')")
    status = page.locator("#compare-status").inner_text()
    assert "You voted “A is better” on turn 1." in status and f"was {CREATIVE}" in status
    names = {heading(page, 0).removeprefix("A · "), heading(page, 1).removeprefix("B · ")}
    assert names == {CREATIVE, DETERMINISTIC}
    page.wait_for_function("document.querySelector('#compare-summary')?.innerText.includes('SmolLM2')")
    titles = watch_columns(page)  # the vote shows each reply's stats
    for title in titles:
        # at most 200 tokens: the creative preset may end its poem sooner
        assert (numbers := SUMMARY.search(title)) and numbers["rate"] and 2 <= int(numbers["tokens"]) <= 200, title
    rows = [[cell.strip() for cell in row.locator("td").all_inner_texts()]
            for row in page.locator("#compare-summary tbody tr").all()]
    assert [(row[0], row[2], row[-1]) for row in rows] == [("A", "1", "1"), ("B", "1", "0")], rows
    assert all(0 < float(row[-2]) <= 200 for row in rows), rows
    assert {rows[0][1], rows[1][1]} == names
    page.screenshot(path=str(OUTPUT / "compare.png"), full_page=True)

    with page.expect_download() as download:
        page.locator("#compare-export-json").click()
    assert download.value.suggested_filename == "comparison.json"
    data = json.loads(Path(download.value.path()).read_text(encoding="utf-8"))
    turn = data["turns"][0]
    assert turn["prompt"] == "Write a long poem about the sea."
    assert turn["vote"] == {"choice": "A", "text": "A is better", "cast_blind": True}
    assert [r["sampling"]["max_tokens"] for r in turn["replies"]] == [200, 200]
    assert all(0 < r["stats"]["generated_tokens"] <= 200 and r["text"].strip() for r in turn["replies"])
    assert data["summary"][0]["votes_won"] == 1

    page.locator("#compare-share").click()
    page.wait_for_function("document.querySelector('#compare-link textarea')?.value.includes('blind=1')")
    link = page.locator("#compare-link textarea").input_value()
    # Blind: the one set of settings every column used travels as the first preset's.
    assert link.startswith("http") and "s1=max_tokens:200&blind=1" in link and "q=Write%20a%20long%20poem" in link, link


def test_a_share_link_opens_the_compare_tab_with_its_presets_settings_and_prompt(open_page):
    query = (f"?p={quote(DETERMINISTIC)}&p={quote(CREATIVE)}&s2=temperature:0.3,max_tokens:32"
             f"&q={quote('Name three rivers.')}")
    page = open_page(query)
    page.wait_for_function("document.querySelector('#compare-prompt textarea')?.value === 'Name three rivers.'")
    assert page.get_by_role("tab", name="Compare").get_attribute("aria-selected") == "true"
    assert not page.locator("#compare-blind input").is_checked()
    assert page.locator("#compare-presets").get_by_label(CREATIVE).is_checked()
    page.locator("#compare-settings").get_by_text("Settings per preset").click()
    assert page.locator("#compare-knob-1-temperature input[type=number]").input_value() == "0.3"
    assert page.locator("#compare-knob-1-max_tokens input[type=number]").input_value() == "32"
    assert page.locator("#compare-knob-0-seed input").input_value() == "1234"  # the deterministic preset's own
    assert "Opened from a share link" in page.locator("#compare-status").inner_text()

    blind = open_page(f"?p={quote(DETERMINISTIC)}&p={quote(CREATIVE)}&s1=max_tokens:32&blind=1&q={quote('Hi.')}")
    blind.wait_for_function("document.querySelector('#compare-prompt textarea')?.value === 'Hi.'")
    assert blind.locator("#compare-blind input").is_checked()
    blind.locator("#compare-settings").get_by_text("Settings per preset").click()
    blind.locator("#compare-settings").get_by_text("Every column").wait_for()  # one set for all: the first's
    assert blind.locator("#compare-knob-0-max_tokens input[type=number]").input_value() == "32"
    assert blind.locator("#compare-knob-1-max_tokens").is_hidden()

    bad = open_page(f"?p=Nope&p={quote(CREATIVE)}")
    bad.wait_for_function("document.querySelector('#compare-status')?.innerText.includes('could not be opened')")
    assert "There is no preset named 'Nope'" in bad.locator("#compare-status").inner_text()


def test_a_prompt_sent_while_the_columns_write_is_kept_with_a_sentence_and_sent_once_they_end(open_page):
    """Gradio's page drops a second Enter or Send on a running event ("once") without a word; here it
    reaches the server, which says to wait, and the prompt stays in the box to be sent afterwards."""
    # Each column's story long enough to be still written when Stop is clicked on a busy machine.
    page = open_page(f"?p={quote(CREATIVE)}&p={quote(DETERMINISTIC)}&s1=max_tokens:{TO_STOP}&s2=max_tokens:{TO_STOP}")
    prompt = page.locator("#compare-prompt textarea")
    page.wait_for_function("document.querySelector('#compare-status')?.innerText.includes('Opened from a share link')")
    page.locator("#compare-blind input").uncheck()
    prompt.fill("Tell me a very long story about a dragon who learns to bake bread.")
    prompt.press("Enter")
    page.wait_for_function(f"[...document.querySelectorAll({COMPARE_TEXT.format(0)!r})].some(e => e.innerText.length > 20)")
    prompt.fill("Now say hi, in a single word.")  # (not the story's cue again: 1,024 tokens a column)
    prompt.press("Enter")
    page.wait_for_function("document.querySelector('#compare-status')?.innerText.includes('Wait until every column')")
    assert prompt.input_value() == "Now say hi, in a single word."  # kept, to send once the columns have ended
    page.locator("#compare-stop").click()
    watch_columns(page, done="stopped by you")
    page.locator("#compare-send").dblclick()  # as people do: one turn, and no word about the second click
    page.wait_for_function(" && ".join(f"document.querySelectorAll({COMPARE_TITLE.format(c)!r}).length === 2" for c in (0, 1)))
    titles = watch_columns(page)
    assert all(REPLIED in title for title in titles), titles
    assert prompt.input_value() == "" and "Wait until" not in page.locator("#compare-status").inner_text()
