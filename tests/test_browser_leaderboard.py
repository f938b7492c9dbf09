"""The Leaderboard tab in a real browser: a blind vote in Compare shows up ranked, with its chart and
exports; the shared app names no administrator, so Reset is nowhere to be seen."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from chat.ui.leaderboard_tab import COLUMNS
from tests.conftest import OUTPUT
from tests.test_browser_compare import CREATIVE, DETERMINISTIC, set_number, watch_columns
from tests.test_browser_layout import PAST_THE_EDGE, UNREADABLE_CHART_TEXT, visible_count

pytestmark = pytest.mark.browser


@pytest.fixture
def page(open_page, app_server):
    return open_page(app_server.url, width=1400, height=1000)


def table_rows(page) -> list[list[str]]:
    return [[cell.strip() for cell in row.locator("td").all_inner_texts()]
            for row in page.locator("#leaderboard-table tbody tr").all()]


def test_a_blind_vote_is_ranked_on_the_leaderboard_with_its_chart_and_exports(page):
    page.get_by_role("tab", name="Compare").click()
    page.locator("#compare-blind input").check()
    page.locator("#compare-settings").get_by_text("Settings per preset").click()
    set_number(page, "#compare-knob-0-max_tokens input[type=number]", "12")  # blind: one set for every column
    prompt = "Name one fruit for the leaderboard."
    page.locator("#compare-prompt textarea").fill(prompt)
    page.locator("#compare-prompt textarea").press("Enter")
    watch_columns(page, done="Stats are shown after you vote")
    page.locator("#compare-vote-0").click()
    page.wait_for_function("document.querySelector('#compare-status')?.innerText.includes('You voted')")

    page.get_by_role("tab", name="Leaderboard").click()
    page.wait_for_function("document.querySelectorAll('#leaderboard-chart .chart-wide svg g.row').length === 2")
    rows = table_rows(page)
    assert {row[1] for row in rows} == {CREATIVE, DETERMINISTIC}, rows
    assert int(rows[0][2]) >= int(rows[1][2]), "best first"
    assert all(row[5].count("·") == 2 and row[6].endswith("%") for row in rows), rows
    for row in rows:  # a range with width, or words for one without: never "1131 – 1131"
        spread = re.fullmatch(r"(\d+) – (\d+)", row[3])
        assert row[3] in ("not enough votes yet", "±0") or (spread and int(spread[1]) < int(spread[2])), rows
    intro = page.locator("#leaderboard-intro").inner_text()
    assert "likely range" in intro and "Bradley-Terry" not in intro, intro
    assert page.locator("#leaderboard-method").is_hidden(), "the method waits in its fold"
    page.locator("#leaderboard-how").get_by_text("How the ranking works").click()
    page.get_by_text("Bradley-Terry model").wait_for()
    summary = page.locator("#leaderboard-summary").inner_text()  # other tests may have voted on this app too
    assert re.search(r"\d+ blind votes? from \d+ voters?, ranked over 2 presets", summary), summary
    assert "read this ranking as a first hint" in summary, summary
    labels = page.locator("#leaderboard-chart svg text.label").all_text_contents()
    assert set(labels) == {CREATIVE, DETERMINISTIC}
    assert page.locator("#leaderboard-admin").is_hidden(), "no administrator on this app: no Reset"
    assert page.evaluate(UNREADABLE_CHART_TEXT, "#leaderboard-chart") == [], "the chart's text at its full size"
    page.screenshot(path=str(OUTPUT / "leaderboard.png"), full_page=True)

    assert page.locator("#leaderboard-export-votes-json").is_hidden(), "visitors' prompts are for administrators"
    with page.expect_download() as download:
        page.locator("#leaderboard-export-leaderboard-csv").click()
    assert download.value.suggested_filename == "leaderboard.csv"
    assert CREATIVE in Path(download.value.path()).read_text(encoding="utf-8")
    with page.expect_download() as download:
        page.locator("#leaderboard-png").click()
    png = Path(download.value.path()).read_bytes()
    assert download.value.suggested_filename == "leaderboard.png" and png.startswith(b"\x89PNG")

    # On a phone: every column of the ranking readable without sideways scrolling, and the chart's
    # text no smaller than 11 px, none of it cut.
    page.set_viewport_size({"width": 390, "height": 844})
    page.locator("#leaderboard-chart .chart-narrow svg").wait_for()
    assert page.evaluate(PAST_THE_EDGE, "body") == [], "nothing on the Leaderboard past a phone's edge"
    cells = page.evaluate("""() => [...document.querySelectorAll('#leaderboard-table tbody td')]
        .filter((td) => td.textContent.trim())
        .map((td) => [td.dataset.label, getComputedStyle(td, '::before').content, td.checkVisibility(),
                      td.getBoundingClientRect().left >= 0 && td.getBoundingClientRect().right <= innerWidth])""")
    assert {label for label, *_ in cells} == set(COLUMNS), cells
    assert all(shown and inside and before == f'"{label}"' for label, before, shown, inside in cells), cells
    assert visible_count(page, "#leaderboard-chart svg g.row") == 2, "one drawing of the chart on a phone"
    assert page.evaluate(UNREADABLE_CHART_TEXT, "#leaderboard-chart") == [], "the chart's text on a phone"
    page.screenshot(path=str(OUTPUT / "leaderboard-phone.png"), full_page=True)
