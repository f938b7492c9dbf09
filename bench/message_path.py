"""Which modules of chat/ one message passes, traced in the real app (docs/architecture.md "One message, from the
browser to the engine and back").

    .venv/bin/python -m bench.message_path            # the embedded model; a minute or two

Runs app.py with one UI worker (the CPU default; a worker process of several is not traced) under
bench/traced_app.py (every call from one module of chat/ into another is recorded while a message
is under way) and sends one message each way: typed on the Chat tab of a page in Chromium, a
comparison's prompt on the Compare tab (two columns), one reply over the WebSocket API
(`python -m chat.client`) and one through the Gradio API's /reply. For each it prints the modules
on the path, from how many other modules and how many places of theirs each is entered (more than
one place: entered again), and the helpers beside the path. A place is a function (with the
comprehensions and lambdas inside it): calls repeated per token, per redraw or per column, and
several calls from one function, count once; calls within a module are not entries. Calls made by
the app's own background work (the engine line's polling, Monitor, the registry's watch) are left
out: their entry points are listed in BACKGROUND and their calls are reported apart.
"""

from __future__ import annotations

import argparse
import collections
import json
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

from bench.procs import Server, base_env, free_port, python

ROOT = Path(__file__).resolve().parent.parent
# Modules that only compute a value and return, and the wrappers around every request: beside the path.
# (ui/compare_view draws a comparison's columns and summary from its record, as ui/messages draws a
# reply's events; of ui/live_script a message calls only `is_browser`, which reads one header.)
HELPERS = {
    "presets", "history", "sampling", "stats", "metrics", "pacing", "errors", "api_schema", "compare",
    "compare_report", "exports", "share_link", "charts", "voters", "ui/messages", "ui/compare_view",
    "ui/downloads", "ui/live_script", "ui/gradio_errors", "ui/gradio_internals", "ui/page_shell", "ui/style",
}
# Entry points of the app's own background work, running whatever the visitor does.
BACKGROUND = ("monitor.", "registry.EngineRegistry.watch", "web.", "logs.", "engine_load.")
# The last reply's line beneath it, once the reply has ended (its stats, or in a blind comparison why none).
DONE = "[...document.querySelectorAll('{} .bot-row .thought .title')].at(-1)?.innerText.startsWith('📊')"
MESSAGE = "Say hello in five words."
PROBLEM = re.compile(r"Traceback \(most recent call last\)|\bERROR\b")
Call = tuple[str, str, str, str, str]  # caller module, caller function, callee module, callee function, root
INNER = re.compile(r"(\.<locals>\.<(?:listcomp|dictcomp|setcomp|genexpr|lambda)>)+$")  # part of the function around it


def traced(app: Server, folder: Path, send: Callable[[], None]) -> list[Call]:
    """The calls between modules of chat/ while `send` runs."""
    assert app.process is not None
    app.process.send_signal(signal.SIGUSR1)
    time.sleep(0.5)  # the signal is handled between two bytecodes of the app's main thread
    send()
    app.process.send_signal(signal.SIGUSR2)
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
    from_modules = {m: sorted({caller for caller, _ in places[m]}) for m in path}
    print(f"\n{name}: {len(path)} modules on the path, {len(modules)} with the helpers")
    for module in path:
        callers = sorted(f"{caller}.{function}" for caller, function in places[module])
        print(f"  {module:20} from {len(from_modules[module])} module(s), {len(callers)} place(s): "
              f"{', '.join(callers) or '(its own entry point)'}")
    print(f"  helpers: {', '.join(sorted(modules - set(path)))}")
    print(f"  entry points: {', '.join(sorted({c[4] for c in message}))}")
    print(f"  left out as background: {', '.join(sorted({c[4] for c in background})) or 'none'}")
    return {"path": path, "entered_again": again, "helpers": sorted(modules - set(path)),
            "entered_from_modules": {m: callers for m, callers in from_modules.items() if len(callers) > 1}}


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
    url = f"http://127.0.0.1:{(port := free_port())}/"
    app = Server("traced app", [python(), str(ROOT / "bench" / "traced_app.py"), "--port", str(port),
                                "--votes-db", str(folder / "votes.sqlite3")],
                 folder / "app.log", env=base_env({"MESSAGE_PATH_DIR": str(folder)})).start()
    results = {}

    def measure(name: str, send: Callable[[], None]) -> None:
        def then_idle() -> None:
            send()
            wait_idle(url)

        results[name] = report(name, traced(app, folder, then_idle))

    try:
        app.wait_http(url + "healthz")
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path="/usr/bin/chromium",
                                                 args=["--headless", "--no-sandbox", "--disable-gpu"])
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            page.set_default_timeout(120_000)
            page.goto(url)
            page.wait_for_function("window.chatLive?.render('x') != null")

            def chat() -> None:
                page.locator("#message textarea").fill(MESSAGE)
                page.locator("#message textarea").press("Enter")
                page.wait_for_function(DONE.format("#chatbot"))

            measure("Chat tab, in a page", chat)
            page.get_by_role("tab", name="Compare").click()
            page.locator("#compare-prompt textarea").wait_for()

            def compare() -> None:
                page.locator("#compare-prompt textarea").fill(MESSAGE)
                page.locator("#compare-prompt textarea").press("Enter")
                for column in (0, 1):
                    page.wait_for_function(DONE.format(f"#compare-chat-{column}"))

            measure("Compare, two columns, in a page", compare)
            browser.close()
        measure("WebSocket API /chat", lambda: subprocess.run(
            [python(), "-m", "chat.client", MESSAGE, "--url", url], cwd=ROOT, check=True, capture_output=True))

        def gradio_api() -> None:
            from gradio_client import Client

            Client(url, verbose=False).predict(MESSAGE, api_name="/reply")

        measure("Gradio API /reply", gradio_api)
    finally:
        app.stop()
    problems = [line for line in app.log_path.read_text(errors="replace").splitlines() if PROBLEM.search(line)]
    print(f"\nthe app's log ({app.log_path}): " + ("\n".join(problems) if problems else "no traceback, no ERROR line"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2))
    print(f"written to {args.out}")


if __name__ == "__main__":
    sys.exit(main())
