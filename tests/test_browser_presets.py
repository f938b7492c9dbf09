"""Switching presets in the browser while another person keeps chatting.

The app runs with two presets on different engine arguments (so switching loads a second engine)
next to each other; one page streams a long reply while another switches preset and chats.
"""

from __future__ import annotations

import textwrap
import time

import pytest

from tests.conftest import OUTPUT, start_app, stop_app
from tests.test_browser import REPLY_TEXT, send, watch_reply

pytestmark = pytest.mark.browser

PRESET = """\
name: {name}
description: {description}
model: embedded
engine:
  dtype: float32
  max_model_len: {context}
  kv_cache_memory_bytes: 268435456
  enforce_eager: true
  max_num_seqs: 8
sampling:
  temperature: {temperature}
  max_tokens: {{default: {max_tokens}, max: 512}}
system_prompt: {system_prompt}
"""


@pytest.fixture(scope="module")
def two_engine_app(tmp_path_factory):
    folder = tmp_path_factory.mktemp("presets")
    (folder / "storyteller.yaml").write_text(textwrap.dedent(PRESET.format(
        name="Storyteller", description="Long, creative replies.", context=1024, temperature=0.9,
        max_tokens=400, system_prompt="You tell long stories.")))
    (folder / "terse.yaml").write_text(textwrap.dedent(PRESET.format(
        name="Terse", description="Short, exact replies.", context=1536, temperature=0.0,
        max_tokens=24, system_prompt="Answer in one short sentence.")))
    app = start_app("presets", "--presets-dir", str(folder), "--preset", "storyteller")
    yield app
    stop_app(app)


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path="/usr/bin/chromium",
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"],
        )
        yield browser
        browser.close()


def open_page(browser, url):
    page = browser.new_context(viewport={"width": 1280, "height": 900}).new_page()
    page.set_default_timeout(30_000)
    page.goto(url)
    page.wait_for_selector("#message textarea")
    return page


def test_one_page_switches_preset_while_another_streams(browser, two_engine_app):
    reader = open_page(browser, two_engine_app.url)
    switcher = open_page(browser, two_engine_app.url)
    send(reader, "Tell me a long story about a cat who sails around the world.")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not reader.locator(REPLY_TEXT).all_inner_texts():
        time.sleep(0.1)

    # Pick the other preset: its card, system prompt and sliders follow, and its engine loads.
    switcher.locator("#preset input").click()
    switcher.get_by_role("option", name="Terse").click()
    switcher.wait_for_function(
        "document.querySelector('#preset-card').innerText.includes('Short, exact replies.')"
    )
    assert switcher.locator("#system-prompt textarea").input_value() == "Answer in one short sentence."
    assert switcher.locator("#knob-max_tokens input[type=number]").input_value() == "24"
    send(switcher, "What colour is the sky?")
    switcher.wait_for_function(  # the new engine is loading, and the page says so with the time
        "/Starting the engine for Terse: .*\\d+ s/.test(document.querySelector('#chatbot').innerText)",
        timeout=30_000,
    )
    _, title = watch_reply(switcher, "first token", within_s=120)
    assert "24 tokens" in title or "finished" in title

    # The first reader was never interrupted: its story went on growing and ends normally.
    _, story_title = watch_reply(reader, "first token", within_s=120)
    assert "tokens" in story_title and "stopped" not in story_title and "⚠️" not in story_title
    status, body = two_engine_app.health()
    assert status == 200 and {e["preset"] for e in body["engines"]} == {"Storyteller", "Terse"}
    OUTPUT.mkdir(parents=True, exist_ok=True)
    switcher.screenshot(path=str(OUTPUT / "preset-switch.png"), full_page=True)
    reader.context.close()
    switcher.context.close()
