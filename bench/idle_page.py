"""The machine's CPU while a page of the app sits open after a reply and nobody uses it, and how many
animation frames the page asks for meanwhile: what every open tab costs its visitor's machine.

    python tests/stand_in.py --port 17990 &                   # the app as it is
    (cd ../before && python tests/stand_in.py --port 17991 &) # e.g. a worktree of an earlier commit
    python -m bench.idle_page http://127.0.0.1:17990/ http://127.0.0.1:17991/ --rounds 3

Each round opens each URL in turn in a fresh headless Chromium (the tests' build and flags), sends a
short message, waits for the reply and then `--settle-s`, and measures the next `--idle-s`. The CPU is
the whole machine's (/proc/stat), so the app's own share is in it: run it on a quiet machine.
"""

from __future__ import annotations

import argparse
import tempfile

from playwright.sync_api import sync_playwright

from bench.page_cpu import machine_cpu_s
from chat.stats import REPLIED
from tests.conftest import CHROMIUM, LAPTOP
from tests.pages import wait_drawn
from tests.test_browser import FRAMES_ASKED, SHORT, send, watch_reply


def one_page(url: str, settle_s: float, idle_s: float) -> tuple[float, int]:
    """(CPU seconds per second, frames asked for) of `url`'s page left alone after a reply."""
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        context = playwright.chromium.launch_persistent_context(profile, viewport=LAPTOP, **CHROMIUM)
        page = context.new_page()
        page.add_init_script(FRAMES_ASKED)
        page.goto(url)
        wait_drawn(page)
        send(page, "Hello there.", max_tokens=SHORT)
        watch_reply(page, REPLIED)
        page.wait_for_timeout(settle_s * 1000)
        frames, before = page.evaluate("window.framesAsked"), machine_cpu_s()
        page.wait_for_timeout(idle_s * 1000)
        spent, frames = machine_cpu_s() - before, page.evaluate("window.framesAsked") - frames
        context.close()
    return spent / idle_s, frames


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("urls", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--settle-s", type=float, default=5.0)
    parser.add_argument("--idle-s", type=float, default=10.0)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for url in args.urls:
            cpu, frames = one_page(url, args.settle_s, args.idle_s)
            print(f"{url:28s} idle: {cpu:5.3f} s of CPU a second, {frames / args.idle_s:5.1f} frames asked a second",
                  flush=True)


if __name__ == "__main__":
    main()
