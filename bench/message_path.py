"""Which modules of chat/ one message passes, traced in the real app (README "One message, from the
browser to the engine and back").

    .venv/bin/python -m bench.message_path            # the embedded model; a minute or two

Runs app.py under bench/traced_app.py (every call from one module of chat/ into another is
recorded while a message is under way) and sends one message each way: typed on the Chat tab of a
page in Chromium, a comparison's prompt on the Compare tab (two columns), one reply over the
WebSocket API (`python -m chat.client`) and one through the Gradio API's /reply. For each it prints
the modules on the path, how many places of other modules call into each (more than one: entered
again), and the helpers beside the path. A place is a function (with the comprehensions and
lambdas inside it): calls repeated per token, per redraw or per column, and several calls from one
function, count once; calls within a module are not entries. Calls made by the app's own background work (the engine line's polling, Monitor, the registry's watch) are left out: their
entry points are listed in BACKGROUND and their calls are reported apart.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bench.procs import free_port, python

ROOT = Path(__file__).resolve().parent.parent
# Modules that only compute a value and return, and the wrappers around every request: beside the path.
HELPERS = {
    "presets", "history", "sampling", "stats", "metrics", "pacing", "errors", "api_schema", "compare",
    "compare_report", "exports", "share_link", "charts", "voters", "ui/messages", "ui/downloads",
    "ui/gradio_errors", "ui/gradio_internals", "ui/page_shell", "ui/style",
}
# Entry points of the app's own background work, running whatever the visitor does.
BACKGROUND = ("monitor.", "registry.EngineRegistry.watch", "web.", "logs.", "engine_load.")
# The last reply's line beneath it, once the reply has ended (its stats, or in a blind comparison why none).
DONE = "[...document.querySelectorAll('{} .bot-row .thought .title')].at(-1)?.innerText.startsWith('📊')"
Call = tuple[str, str, str, str, str]  # caller module, caller function, callee module, callee function, root
INNER = re.compile(r"(\.<locals>\.<(?:listcomp|dictcomp|setcomp|genexpr|lambda)>)+$")  # part of the function around it


def traced(app: subprocess.Popen, folder: Path, send: Callable[[], None]) -> list[Call]:
    """The calls between modules of chat/ while `send` runs (and until the app is idle again)."""
    app.send_signal(signal.SIGUSR1)
    time.sleep(0.5)  # the signal is handled between two bytecodes of the app's main thread
    send()
    app.send_signal(signal.SIGUSR2)
    out = folder / "calls.json"
    deadline = time.monotonic() + 30
    while not out.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    calls = [tuple(call) for call in json.loads(out.read_text())]
    out.unlink()
    return calls  # type: ignore[return-value]


def report(name: str, calls: list[Call]) -> dict[str, object]:
    background = [c for c in calls if c[4].startswith(BACKGROUND)]
    message = [c for c in calls if not c[4].startswith(BACKGROUND)]
    places: dict[str, set[tuple[str, str]]] = collections.defaultdict(set)
    for caller, function, callee, _, _ in message:
        places[callee].add((caller, INNER.sub("", function)))
    modules = {c[0] for c in message} | {c[2] for c in message}
    path = sorted(m for m in modules if m not in HELPERS)
    again = {m: len(places[m]) for m in path if len(places[m]) > 1}
    print(f"\n{name}: {len(path)} modules on the path, {len(modules)} with the helpers")
    for module in path:
        callers = sorted(f"{caller}.{function}" for caller, function in places[module])
        print(f"  {module:24} entered from {len(callers)} place(s): {', '.join(callers) or '(its own entry point)'}")
    print(f"  helpers: {', '.join(sorted(modules - set(path)))}")
    print(f"  entry points: {', '.join(sorted({c[4] for c in message}))}")
    print(f"  left out as background: {', '.join(sorted({c[4] for c in background})) or 'none'}")
    return {"path": path, "entered_again": again, "helpers": sorted(modules - set(path))}


def wait_idle(url: str, within_s: float = 60) -> None:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        with urllib.request.urlopen(url + "healthz", timeout=5) as response:
            engines = json.loads(response.read()).get("engines", [])
        if not any(e["running"] or e["waiting"] or e["unfinished"] or e["streams"] for e in engines):
            return
        time.sleep(0.2)
    raise TimeoutError("the app did not go idle")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "message_path.json")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    folder = Path(tempfile.mkdtemp(prefix="message-path-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    log = open(folder / "app.log", "w")  # noqa: SIM115 - the app's, for its lifetime
    app = subprocess.Popen([python(), str(ROOT / "bench" / "traced_app.py"), "--port", str(port),
                            "--votes-db", str(folder / "votes.sqlite3")], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "MESSAGE_PATH_DIR": str(folder), "GRADIO_ANALYTICS_ENABLED": "False"})
    results = {}
    try:
        deadline = time.monotonic() + 600
        while True:
            try:
                with urllib.request.urlopen(url + "healthz", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if app.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the app did not start; its log: {folder / 'app.log'}")
            time.sleep(0.5)
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                 args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_function("window.chatLive?.render('x') != null")

            def chat() -> None:
                page.locator("#message textarea").fill("Say hello in five words.")
                page.locator("#message textarea").press("Enter")
                page.wait_for_function(DONE.format("#chatbot"))
                wait_idle(url)

            results["Chat tab, in a page"] = report("Chat tab, in a page", traced(app, folder, chat))
            page.get_by_role("tab", name="Compare").click()
            page.locator("#compare-prompt textarea").wait_for()

            def compare() -> None:
                page.locator("#compare-prompt textarea").fill("Say hello in five words.")
                page.locator("#compare-prompt textarea").press("Enter")
                for column in (0, 1):
                    page.wait_for_function(DONE.format(f"#compare-chat-{column}"))
                wait_idle(url)

            results["Compare, two columns, in a page"] = report("Compare, two columns, in a page",
                                                                 traced(app, folder, compare))
            browser.close()

        def socket() -> None:
            subprocess.run([python(), "-m", "chat.client", "Say hello in five words.", "--url", url],
                           cwd=ROOT, check=True, capture_output=True)
            wait_idle(url)

        results["WebSocket API /chat"] = report("WebSocket API /chat", traced(app, folder, socket))

        def gradio_api() -> None:
            from gradio_client import Client

            Client(url, verbose=False).predict("Say hello in five words.", api_name="/reply")
            wait_idle(url)

        results["Gradio API /reply"] = report("Gradio API /reply", traced(app, folder, gradio_api))
    finally:
        app.terminate()
        app.wait(timeout=60)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"\nwritten to {args.out} (the app's log: {folder / 'app.log'})")


if __name__ == "__main__":
    sys.exit(main())
