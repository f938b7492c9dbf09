"""`--ui-workers 2`: two Gradio processes behind Caddy, every preset on both, on the embedded model.

Everything is the real thing: app.py's supervisor with its engine owner, Caddy on the public port,
two UI workers, and an engine core per engine; real curl, gradio_client, the WebSocket client and
Chromium as readers. Three presets of the embedded model with different context lengths are three
engines, and the memory budget holds two of them, so the third makes the owner unload one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
from gradio_client import Client

from chat.client import ReplyStream
from chat.embedded import model_dir
from chat.front_door import COOKIE, worker_cookie
from chat.models import weights_bytes
from chat.stats import REPLIED, SUMMARY
from tests.conftest import (
    OUTPUT,
    PROBLEM_LINE,
    RunningApp,
    api_client,
    app_command,
    finished,
    launch_app,
    replies_started,
    small_preset,
    start_in_folder,
    still_running,
    stop_app,
    without_vllm,
)
from tests.pages import wait_drawn
from tests.test_browser import send, watch_reply

A, B, C = "Tiny A", "Tiny B", "Tiny C"
CONTEXTS = {A: 1024, B: 768, C: 512}  # three engines of one model
KV_BYTES = 268435456  # small_preset's
# What the tests here cause on purpose: a killed worker, a killed engine core and what its clients then say.
EXPECTED = re.compile(r"UI worker \d stopped \(exit code -9\)|The engine for .* died|died under a stream|"
                      r"EngineDeadError|EngineCore|engine core|Engine core")
CHECKED_LOG: dict[str, int] = {}  # the log is checked up to here at the end


# Alone: its tests start a third engine and kill cores and workers. With the app behind a login
# launched beside them the kernel once killed an engine's worker for memory (24 GiB, a full run, with
# ~5 GB of engines a killed run had left behind); without either, ~15 GB are in use during them.
def launch_workers_app(folder: Path) -> RunningApp:
    for name, context in CONTEXTS.items():
        small_preset(folder, name, context=context, sampling={"temperature": 0.0, "max_tokens": {"default": 12, "max": 64}})
    need = KV_BYTES + weights_bytes(model_dir(), "float32")
    return launch_app("workers", "--ui-workers", "2", "--presets-dir", str(folder), "--preset", A,
                      "--memory-budget-gb", f"{2.5 * need / 1e9:.3f}", "--votes-db", str(folder / "votes.sqlite3"),
                      "--admin-local", "--host", "0.0.0.0")


@pytest.fixture(scope="module")
def workers_app():
    app = start_in_folder("workers_app", launch_workers_app)
    yield app
    started = descendants(app)  # none left when the module's last test killed the app (it checks this itself)
    stop_app(app)
    assert not (alive := still_running(started, 60)), f"processes outlived the app: {alive}"
    text = app.log_path.read_text(errors="replace")
    problems = [line for line in text.splitlines() if PROBLEM_LINE.search(line) and not EXPECTED.search(line)]
    assert not problems, "the app logged a problem:\n" + "\n".join(problems[:20])


def descendants(app: RunningApp) -> list[psutil.Process]:
    try:
        return psutil.Process(app.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def engine_cores(app: RunningApp) -> list[psutil.Process]:
    cores = []
    for process in descendants(app):
        try:
            if "EngineCore" in process.name() or "EngineCore" in " ".join(process.cmdline()):
                cores.append(process)
        except psutil.NoSuchProcess:
            pass
    return cores


def front_door(app: RunningApp) -> tuple[str, list[int]]:
    """The secret and the workers' ports, read from the Caddyfile the app wrote."""
    caddy = next(p for p in descendants(app) if p.name() == "caddy")
    config = Path(caddy.cmdline()[caddy.cmdline().index("--config") + 1]).read_text()
    secret = re.search(rf"lb_policy cookie {COOKIE} (\S+)", config)[1]
    ports = [int(p) for p in re.search(r"reverse_proxy ((?:127\.0\.0\.1:\d+ ?)+)", config)[1].replace("127.0.0.1:", "").split()]
    return secret, ports


def worker_pid(app: RunningApp, port: int) -> int | None:
    """The process listening on a worker's port (None while its replacement starts)."""
    for process in descendants(app):
        try:
            if any(c.laddr.port == port and c.status == psutil.CONN_LISTEN for c in process.net_connections("tcp")):
                return process.pid
        except psutil.Error:
            pass
    return None


def can_listen_on(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
            probe.listen()
        except OSError:
            return False
    return True


def pinned(app: RunningApp, worker: int) -> Client:
    """A gradio_client session that the front door sends to `worker`, as a browser with its cookie."""
    secret, ports = front_door(app)
    # As a cookie of the client's own (a Cookie header would hide the others, the voter's among them).
    return api_client(app.url, cookies={COOKIE: worker_cookie(secret, ports[worker])})


def chat(client: Client, message: str, preset: str) -> str:
    history = client.predict(message, preset, None, api_name="/chat")
    text = "".join(m["content"] for m in history if not m.get("metadata", {}).get("title"))
    assert text.strip(), history
    return text


def health(app: RunningApp) -> dict:
    return app.health()[1]


def engines(app: RunningApp) -> dict[str, str]:
    return {e["preset"]: e["state"] for e in health(app).get("engines", [])}


def serving(app: RunningApp) -> bool:
    return [w["state"] for w in health(app).get("workers", [])] == ["serving", "serving"]


def banner(app: RunningApp, worker: int) -> str:
    secret, ports = front_door(app)
    request = urllib.request.Request(app.url + "status", headers={"Cookie": f"{COOKIE}={worker_cookie(secret, ports[worker])}"})
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(json.loads(response.read())["banner"])


def wait_for(condition, within_s: float, what: str):
    deadline = time.monotonic() + within_s
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.25)


def test_each_engine_has_one_core_that_both_workers_use(workers_app):
    body = health(workers_app)
    assert body["status"] == "ok" and [(w["index"], w["state"]) for w in body["workers"]] == [(0, "serving"), (1, "serving")]
    assert "pid" not in json.dumps(body) and "connections" not in json.dumps(body)
    assert len(engine_cores(workers_app)) == 1
    for worker in (0, 1):
        assert chat(pinned(workers_app, worker), "Name a colour.", A)


def test_a_preset_on_another_engine_starts_its_core_once_for_both_workers(workers_app):
    assert chat(pinned(workers_app, 1), "Name a fruit.", B)
    assert len(engine_cores(workers_app)) == 2 and engines(workers_app) == {A: "ready", B: "ready"}
    assert chat(pinned(workers_app, 0), "Name a tree.", B)
    assert len(engine_cores(workers_app)) == 2, "the second worker joined the core instead of starting one"


def test_compare_across_engines_and_a_vote_reach_the_leaderboard_of_the_other_worker(workers_app):
    client = pinned(workers_app, 0)
    settings = {"temperature": 0.0, "max_tokens": 6}
    result = client.predict([A, B], True, "Say yes.", [settings, settings], api_name="/compare")
    assert len(result["columns"]) == 2  # blind: every column finished, its stats shown after the vote
    assert all("Stats are shown after you vote" in column["messages"][-1]["metadata"]["title"]
               for column in result["columns"])
    assert client.predict("A", None, api_name="/vote")["ok"]
    board = pinned(workers_app, 1).predict(False, api_name="/leaderboard")
    assert board["votes_stored"] == 1 and {row["preset"] for row in board["standings"]} == {A, B}


def test_a_third_engine_makes_the_owner_unload_the_least_recently_used_one(workers_app):
    assert chat(pinned(workers_app, 1), "Name a bird.", A)  # B is now the least recently used
    assert chat(pinned(workers_app, 0), "Name a river.", C)
    assert engines(workers_app) == {A: "ready", C: "ready"}
    assert len(engine_cores(workers_app)) == 2
    assert chat(pinned(workers_app, 1), "Name a city.", B)  # back, on a new core: A goes
    assert engines(workers_app) == {C: "ready", B: "ready"}
    assert chat(pinned(workers_app, 0), "Name a stone.", B)


async def test_the_websocket_api_streams_through_the_front_door(workers_app):
    stream = ReplyStream("Count to five.", url=workers_app.url, preset=B, sampling={"max_tokens": 12})
    text = "".join([part async for part in stream])
    assert text.strip() and stream.via == "websocket" and stream.stats["generated_tokens"] > 0


def test_one_capacity_test_at_a_time_for_the_whole_app(workers_app):
    first, second = pinned(workers_app, 0), pinned(workers_app, 1)
    job = first.submit(C, "(none)", 2, 20, 16, 32, "95th percentile time to first token", 800, api_name="/capacity")
    wait_for(lambda: "capacity test is running" in banner(workers_app, 1), 60, "the other worker never heard of the test")
    refused = second.predict(C, "(none)", 2, 20, 16, 32, "95th percentile time to first token", 800,
                             api_name="/capacity")
    assert "already running" in refused[0], refused
    assert second.predict(api_name="/capacity_stop").startswith("Stopping the capacity test")
    outputs = job.result(timeout=120)
    assert "stopped by you" in outputs[0], outputs[0]
    wait_for(lambda: banner(workers_app, 0) == banner(workers_app, 1) == "", 30, "the banner stayed")


def test_metrics_name_each_series_once_with_the_workers_labelled(workers_app):
    text = urllib.request.urlopen(workers_app.url + "metrics", timeout=10).read().decode()
    samples = [line.rsplit(" ", 1)[0] for line in text.splitlines() if line and not line.startswith("#")]
    assert len(samples) == len(set(samples)), "a series appears twice"
    assert 'chat_ui_worker_up{ui_worker="0"} 1.0' in text and 'chat_ui_worker_up{ui_worker="1"} 1.0' in text
    replies = sum(float(v) for v in re.findall(r'^chat_replies_total\{[^}]*\} (\S+)$', text, re.M))
    assert replies >= 10, "replies from both workers are counted"


@pytest.mark.browser
def test_a_browser_switches_presets_and_stays_with_its_worker(browser, workers_app):
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(60_000)
    page.goto(workers_app.url)
    wait_drawn(page)
    cookie = {c["name"]: c["value"] for c in context.cookies()}.get(COOKIE)
    secret, ports = front_door(workers_app)
    assert cookie in {worker_cookie(secret, p) for p in ports}, "the front door gives the page its worker's cookie"
    # From the default (A) to B, whose engine the tests before left running beside C's: a switch
    # that starts no engine (each start is ~20 s of these two cores).
    assert engines(workers_app).get(B) == "ready", engines(workers_app)
    page.locator("#preset input").click()
    page.get_by_role("option", name=B, exact=True).click()
    page.locator("#title").filter(has_text=B).wait_for()
    page.wait_for_function("window.chatLive.connected()")
    started = replies_started(workers_app, "page")
    send(page, "Say hello in five words.")
    _, title = watch_reply(page, REPLIED, within_s=240)
    assert (numbers := SUMMARY.search(title)) and numbers["rate"], title
    # The reply began over the page's socket and the turn followed it: both reached the same worker.
    assert replies_started(workers_app, "page") == started + 1
    OUTPUT.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(OUTPUT / "ui-workers-switched.png"))
    assert {c["name"]: c["value"] for c in context.cookies()}.get(COOKIE) == cookie
    context.close()


# --- faults ------------------------------------------------------------------------------------


def test_a_killed_worker_is_replaced_on_a_port_no_one_else_can_take_and_no_request_meets_a_502(workers_app):
    secret, ports = front_door(workers_app)
    victim = worker_pid(workers_app, ports[1])
    cookie = {"Cookie": f"{COOKIE}={worker_cookie(secret, ports[1])}"}
    statuses: list[int | str] = []  # a status, or the name of what failed without one
    stop = threading.Event()

    def keep_asking() -> None:
        while not stop.is_set():
            request = urllib.request.Request(workers_app.url + "status?preset=" + urllib.request.quote(C), headers=cookie)
            try:
                with urllib.request.urlopen(request, timeout=20) as response:
                    statuses.append(response.status)
            except urllib.error.HTTPError as exc:
                statuses.append(exc.code)
            except OSError as exc:  # a refused or reset connection, a timeout: named in the failure, not lost
                statuses.append(type(exc).__name__)
            # A reader's pace, not a flood: the replacement worker starts on these two cores too.
            stop.wait(0.05)

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        wait_for(lambda: len(statuses) > 5, 30, "no answers before the kill")
        os.kill(victim, signal.SIGKILL)
        taken: list[int] = []

        def replaced() -> bool:
            # Until the replacement serves, no other program can take the dead worker's port.
            taken.extend(port for port in ports if can_listen_on(port))
            return worker_pid(workers_app, ports[1]) not in (None, victim) and serving(workers_app)

        wait_for(replaced, 180, "the worker was not replaced")
        assert not taken, f"another program could listen on a worker's port: {taken}"
        after = len(statuses)
        wait_for(lambda: len(statuses) > after + 5, 30, "no answers after the replacement")
    finally:
        stop.set()
        asker.join(30)
    assert statuses and set(statuses) == {200}, f"answers while a worker died: {sorted(set(map(str, statuses)))}"
    assert chat(pinned(workers_app, 1), "Say no.", A)  # the default, which the new worker made sure of


def test_a_killed_engine_core_is_started_again_and_its_workers_rejoin(workers_app):
    secret, ports = front_door(workers_app)
    wait_for(lambda: serving(workers_app), 180, "the workers are not serving")
    pids = [worker_pid(workers_app, port) for port in ports]
    before = {p.pid for p in engine_cores(workers_app)}
    victim = engine_cores(workers_app)[0]
    victim.kill()
    wait_for(lambda: health(workers_app).get("status") == "ok" and len(engine_cores(workers_app)) == 2
             and {p.pid for p in engine_cores(workers_app)} != before, 300, "the engine did not come back")
    loaded = engines(workers_app)  # the restarted one and the other: asking for a third would start one more
    assert len(loaded) == 2 and set(loaded.values()) == {"ready"}, loaded
    for worker in (0, 1):
        for preset in loaded:
            assert chat(pinned(workers_app, worker), "Say yes.", preset)
    assert [worker_pid(workers_app, port) for port in ports] == pids, "the workers kept running"


def test_a_killed_app_takes_every_process_it_started_with_it(workers_app):
    """SIGKILL (or the out-of-memory killer) gives the app no chance to stop what it started: the UI
    workers, the engine cores and Caddy end by themselves (chat/lifeline.py), and the port is free
    for the next start. Last: it ends the module's app."""
    started = descendants(workers_app)
    assert "caddy" in {p.name() for p in started} and engine_cores(workers_app)
    workers_app.process.kill()
    workers_app.process.wait()
    assert not (alive := still_running(started, 60)), f"processes outlived the killed app: {alive}"
    port = int(workers_app.url.rstrip("/").rsplit(":", 1)[1])
    assert can_listen_on(port), "the app's port is still taken"


@pytest.mark.app  # runs app.py
def test_without_caddy_the_app_says_what_to_run(tmp_path):
    from chat.front_door import MISSING

    done = finished(app_command("--ui-workers", "2", "--port", "1",  # at once: no vLLM
                                env={**without_vllm(tmp_path), "CHAT_CADDY": str(tmp_path / "no-such-caddy")}))
    assert done.returncode == 2 and done.stderr.strip().splitlines()[-1] == MISSING
    assert "Traceback" not in done.stdout + done.stderr
