"""A quiet stop: Ctrl-C in a terminal sends SIGINT to the app's whole process group, and a stop may
send SIGTERM to the group too. Either ends the app within seconds, in two lines, with a reply in
flight, with one UI worker (on the real engine, whose processes are in the group) and with several
(on the stand-in engine: a shared core's processes leave the group, and tests/test_workers.py stops
the real one), and leaves nothing running (chat/lifeline.py, chat/server.py, chat/supervisor.py).
The apps here run in sessions of their own, as in a terminal: the other tests stop theirs by
signalling the main process only, which never showed what a terminal does. The several workers are
conftest's `front_door_app`, which this test ends after every other test has used it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from chat import logs
from tests.conftest import PROBLEM_LINE, RunningApp, launch_app, small_preset, still_running, wait_ready
from tests.test_server import in_session

pytestmark = pytest.mark.app

PRESET = "Stop test"
STOPS_WITHIN_S = 30.0  # a bound for a busy machine; it takes 3-7 s on the 2-core Xeon
LEFT_WITHIN_S = 30.0  # the resource tracker ends once the app has, after cleaning up
# A stop still under way this long after the signal: what each of the app's processes is doing then
# goes into the test's failure (py-spy). Once in ~20 runs on a busy machine the real engine's core
# outlived vLLM's 15 s and was killed; where it waited is not known yet (issue 49's note).
SLOW_STOP_S = 12.0


def launch_in_session(name: str, folder: Path, *args: str) -> RunningApp:
    """app.py with a small preset in a session of its own, so that its process group is the app's
    alone, as a terminal's foreground group is."""
    small_preset(folder, PRESET, sampling={"temperature": 0.0, "max_tokens": {"default": 400, "max": 512}})
    return launch_app(name, "--presets-dir", str(folder), "--preset", PRESET, "--votes-db",
                      str(folder / "votes.sqlite3"), *args, new_session=True)


def stopped_mid_reply(app: RunningApp, signum: signal.Signals, preset: str | None = PRESET) -> tuple[list[str], dict | None]:
    """Start a long reply over the WebSocket API (on `preset`; None: the app's first), signal the app's
    whole group once it streams, and wait for the app's end. The lines it printed after the signal,
    and the reply's last event other than a delta (None when its connection closed first)."""
    last: dict | None = None
    with connect(app.url.replace("http", "ws") + "chat", open_timeout=30) as ws:
        # "a long list": the stand-in's cue for a reply to Max tokens (tests/stand_in.py)
        ws.send(json.dumps({"type": "chat", "id": "long", "preset": preset,
                            "messages": [{"role": "user", "content": "A long list: count from 1 to 500, one number a line."}]}))
        while (event := json.loads(ws.recv(timeout=120)))["type"] != "delta":
            assert event["type"] == "progress", event
        printed = len(app.log_path.read_text(errors="replace").splitlines())
        os.killpg(app.process.pid, signum)
        slow = threading.Timer(SLOW_STOP_S, record_stacks, (app,))
        slow.start()
        try:
            with contextlib.suppress(ConnectionClosed):  # closed by the stop
                while True:
                    event = json.loads(ws.recv(timeout=STOPS_WITHIN_S))
                    last = event if event.get("type") != "delta" else last
            app.process.wait(timeout=STOPS_WITHIN_S)
        except (TimeoutError, subprocess.TimeoutExpired) as exc:
            slow.join()
            raise AssertionError(f"still running {STOPS_WITHIN_S:g} s after the signal ({exc!r})\n{stacks(app)}") from exc
        finally:
            slow.cancel()
            slow.join()
    return app.log_path.read_text(errors="replace").splitlines()[printed:], last


def quiet(app: RunningApp, for_s: float = 1.0, within_s: float = 30.0) -> None:
    """Wait until the app's log has not grown for `for_s`."""
    deadline, size, since = time.monotonic() + within_s, -1, time.monotonic()
    while (now := time.monotonic()) - since < for_s:
        assert now < deadline, f"the app's log still grew {within_s:g} s on:\n{app.log_tail()}"
        if (grown := app.log_path.stat().st_size) != size:
            size, since = grown, now
        time.sleep(0.05)


def stacks_path(app: RunningApp) -> Path:
    return app.log_path.with_suffix(".stacks.txt")


def stacks(app: RunningApp) -> str:
    return stacks_path(app).read_text(errors="replace") if stacks_path(app).exists() else ""


def record_stacks(app: RunningApp) -> None:
    """Every Python stack of the app's processes still running, into `stacks_path` (shown on failure)."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    with stacks_path(app).open("w") as out:
        out.write(f"{SLOW_STOP_S:g} s after the signal, still running:\n")
        for process in in_session(app.process.pid):
            with contextlib.suppress(Exception):
                out.write(f"\n== {process.pid} {process.name()}\n")
                if spy is not None:
                    out.write(subprocess.run([spy, "dump", "--pid", str(process.pid)], capture_output=True,
                                             text=True, timeout=20).stdout)


def assert_quiet_stop(app: RunningApp, after: list[str]) -> None:
    said = "\n".join([*after, stacks(app)])
    assert app.process.returncode == 0, said
    assert 1 <= len(after) <= 2 and after[0] == logs.STOPPING, said
    assert after[-1].startswith("==> Stopped in "), said
    left = still_running(in_session(app.process.pid), LEFT_WITHIN_S)
    assert not left, f"processes of the app's session outlived it: {left}"
    text = app.log_path.read_text(errors="replace")  # read once the resource tracker has ended too
    problems = [line for line in text.splitlines() if PROBLEM_LINE.search(line) or "leaked" in line]
    assert not problems, "\n".join(problems)


def kill_session(app: RunningApp) -> None:
    """After a failed test: nothing of the app may go on running into the next ones."""
    for process in in_session(app.process.pid):
        with contextlib.suppress(Exception):
            process.kill()
    with contextlib.suppress(subprocess.TimeoutExpired):
        app.process.wait(timeout=10)


@pytest.mark.real_engine
def test_ctrl_c_in_a_terminal_stops_the_app_and_its_reply_in_two_lines(tmp_path):
    """SIGINT to the whole group, as a terminal's Ctrl-C sends it: before, vLLM's worker quit on its
    own, its engine core logged it as a fatal error with two tracebacks, the app began restarting the
    engine, and the resource tracker warned of leaked shared memory."""
    app = wait_ready(launch_in_session("stop-ctrl-c", tmp_path))
    try:
        after, last = stopped_mid_reply(app, signal.SIGINT)
        assert_quiet_stop(app, after)
        assert last is not None and last["type"] in ("done", "error"), f"the reply did not end: {last}"
    finally:
        kill_session(app)


@pytest.mark.stops_front_door
def test_sigterm_to_the_group_stops_several_ui_workers_in_two_lines(front_door_app):
    """SIGTERM to the whole group, as a container's stop sends it, mid-reply, to two UI workers behind
    Caddy. Before, every worker printed Gradio's "Keyboard interruption" line, and the group's signal
    reached the engine's processes too. The front door stops first, so the reply's connection is
    closed (no last event)."""
    try:
        quiet(front_door_app)  # what the tests before wrote (a flood's INFO lines) is not the stop's
        after, _ = stopped_mid_reply(front_door_app, signal.SIGTERM, preset=None)
        assert_quiet_stop(front_door_app, after)
    finally:
        kill_session(front_door_app)
