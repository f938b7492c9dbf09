"""The machine's CPU for a browser's start and for each page of the app it draws, per Chromium build:
what the browser tests pay (tests/conftest.py opens pages the same way: one context, pages in turn).

    python tests/stand_in.py --port 17990 &
    python -m bench.page_cpu http://127.0.0.1:17990/ /usr/bin/chromium /usr/bin/chromium-headless-shell --rounds 3

Each round starts every build in turn, on a fresh profile: the start, the first page, the mean of
the later pages (drawn as `tests/pages.py` `wait_drawn` finds them), and a last page that also sends
a message and opens Compare. The CPU is the whole machine's (/proc/stat): run it on a quiet one.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import psutil
from playwright.sync_api import sync_playwright

from chat.stats import REPLIED
from tests.conftest import CHROMIUM, LAPTOP
from tests.pages import open_tab, wait_drawn
from tests.test_browser import send, watch_reply


def machine_cpu_s() -> float:
    times = psutil.cpu_times()
    return times.user + times.system + times.nice


def one_round(url: str, executable: str, pages: int) -> tuple[float, list[float]]:
    """(the browser's start, each page's) CPU seconds."""
    spent: list[float] = []
    with sync_playwright() as playwright, tempfile.TemporaryDirectory() as profile:
        before = machine_cpu_s()
        context = playwright.chromium.launch_persistent_context(
            profile, viewport=LAPTOP, **{**CHROMIUM, "executable_path": executable})
        started = machine_cpu_s() - before
        for i in range(pages):
            before = machine_cpu_s()
            page = context.new_page()
            page.goto(url)
            wait_drawn(page)
            if i == pages - 1:
                send(page, "Name three colours.")
                watch_reply(page, REPLIED)
                open_tab(page, "Compare")
            page.close()
            spent.append(machine_cpu_s() - before)
        context.close()
    return started, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url")
    parser.add_argument("executables", nargs="+")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--pages", type=int, default=6)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for executable in args.executables:
            started, pages = one_round(args.url, executable, args.pages)
            print(f"{executable:34s} start {started:4.1f} s  first page {pages[0]:4.2f} s  "
                  f"later pages {statistics.mean(pages[1:-1]):4.2f} s  with a reply and Compare {pages[-1]:4.2f} s", flush=True)


if __name__ == "__main__":
    main()
