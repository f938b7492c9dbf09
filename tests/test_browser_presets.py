"""Switching presets in the browser while another person keeps chatting.

The app runs with two presets on different engine arguments (so switching loads a second engine)
next to each other; one page streams a long reply while another switches preset and chats.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from chat.stats import REPLIED
from tests.conftest import OUTPUT, RunningApp, launch_app, small_preset, start_in_folder, stop_app
from tests.pages import wait_drawn
from tests.test_browser import REPLY_TEXT, is_text, send, watch_reply

pytestmark = pytest.mark.browser

def launch_two_engine_app(folder: Path) -> RunningApp:
    # On the stand-in engine (the subject is the page's switch; an unload on the real engine is
    # tests/test_workers.py's): 25 tokens a second, so the 200-token story streams for 8 s while the
    # other page switches (~3 s on a busy machine), and an engine start of 3 s that the switching page shows.
    small_preset(folder, "Storyteller", context=1024, description="Long, creative replies.",
                 system_prompt="You tell long stories.", examples=["Tell me a story about a lighthouse."],
                 sampling={"temperature": 0.9, "max_tokens": {"default": 200, "max": 512}})
    small_preset(folder, "Terse", context=1536, description="Short, exact replies.",
                 system_prompt="Answer in one short sentence.", examples=["What is 2 + 2?"],
                 sampling={"temperature": 0.0, "max_tokens": {"default": 24, "max": 512}})
    return launch_app("presets", "--presets-dir", str(folder), "--preset", "storyteller", stand_in=True,
                      env={"STAND_IN_STEP_MS": "40", "STAND_IN_START_S": "3"})


@pytest.fixture(scope="module")
def two_engine_app():
    app = start_in_folder("two_engine_app", launch_two_engine_app)
    yield app
    stop_app(app)


def open_page(browser, url):
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(30_000)
    page.goto(url)
    wait_drawn(page)
    return page


def test_one_page_switches_preset_while_another_streams(browser, two_engine_app):
    reader = open_page(browser, two_engine_app.url)
    switcher = open_page(browser, two_engine_app.url)
    send(reader, "Tell me a long story about a cat who sails around the world.")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(is_text(t) for t in reader.locator(REPLY_TEXT).all_inner_texts()):
        time.sleep(0.1)  # the reply's bubble shows before its first word: wait for words

    # A setting the person changed stays through the switch; the others follow the new preset.
    temperature = switcher.locator("#knob-temperature input[type=number]")
    temperature.fill("0.6")
    temperature.press("Tab")
    switcher.wait_for_function("document.querySelector('#knob-temperature input[type=number]').value === '0.6'")
    # Pick the other preset: its card, system prompt and sliders follow, and its engine loads.
    switcher.locator("#preset input").click()
    switcher.get_by_role("option", name="Terse").click()
    switcher.wait_for_function(
        "document.querySelector('#preset-card')?.innerText.includes('Short, exact replies.')"
    )
    assert switcher.locator("#system-prompt textarea").input_value() == "Answer in one short sentence."
    assert switcher.locator("#knob-max_tokens input[type=number]").input_value() == "24"
    assert temperature.input_value() == "0.6", "the temperature the person chose was kept"
    switcher.get_by_text("What is 2 + 2?").wait_for()  # the empty chat offers the new preset's examples
    assert not switcher.get_by_text("Tell me a story about a lighthouse.").is_visible()
    switcher.get_by_text("What is 2 + 2?").click()  # and clicking one asks it
    switcher.wait_for_function("document.querySelector('#chatbot .user-row')?.innerText.includes('2 + 2')")
    switcher.wait_for_function(  # the new engine is loading, and the page says so with the time
        "/Starting the engine for Terse: .*\\d+ s/.test(document.querySelector('#chatbot').innerText)",
        timeout=30_000,
    )
    # An engine start while the other engine writes: up to 80 s seen on CI's two cores.
    _, title = watch_reply(switcher, REPLIED, within_s=240)
    assert "24 tokens" in title or "finished" in title

    # The first reader was never interrupted: its story went on growing and ends normally.
    _, story_title = watch_reply(reader, REPLIED, within_s=240)
    assert "tokens" in story_title and "stopped" not in story_title and "⚠️" not in story_title
    status, body = two_engine_app.health()
    assert status == 200 and {e["preset"] for e in body["engines"]} == {"Storyteller", "Terse"}
    OUTPUT.mkdir(parents=True, exist_ok=True)
    switcher.screenshot(path=str(OUTPUT / "preset-switch.png"), full_page=True)
    reader.context.close()
    switcher.context.close()
