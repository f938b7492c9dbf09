"""`--ui-workers 2`: two Gradio processes on one vLLM engine core behind one port, on the embedded model.

Everything here is the real thing: app.py's supervisor, its router on the public port, two UI
workers and one engine core; a real Chromium, gradio_client and the WebSocket client as readers.
"""

from __future__ import annotations

import os
import re
import signal
import time
import urllib.request

import psutil
import pytest

from chat.client import ReplyStream
from chat.router import COOKIE
from tests.conftest import OUTPUT, PROBLEM_LINE, RunningApp, start_app, stop_app
from tests.test_browser import send, watch_reply

pytestmark = pytest.mark.app

EXPECTED_ERRORS = re.compile(r"ERROR chat\.workers: UI worker 1 stopped \(exit code -9\)")
CHECKED_LOG = {}  # the log is checked up to here: after the engine core is killed, its clients say so


@pytest.fixture(scope="module")
def workers_app(tmp_path_factory):
    votes = tmp_path_factory.mktemp("votes") / "votes.sqlite3"
    app = start_app("workers", "--ui-workers", "2", "--votes-db", str(votes))
    yield app
    stop_app(app)
    assert not [p for p in _descendants(app) if p.is_running()], "processes outlived the app"
    text = app.log_path.read_text(errors="replace")[:CHECKED_LOG.get("until")]
    problems = [line for line in text.splitlines() if PROBLEM_LINE.search(line) and not EXPECTED_ERRORS.search(line)]
    assert not problems, "the app logged a problem:\n" + "\n".join(problems[:20])


def _descendants(app: RunningApp) -> list[psutil.Process]:
    try:
        return psutil.Process(app.process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def engine_cores(app: RunningApp) -> list[psutil.Process]:
    cores = []
    for process in _descendants(app):
        try:
            if "EngineCore" in process.name() or "EngineCore" in " ".join(process.cmdline()):
                cores.append(process)
        except psutil.NoSuchProcess:
            pass
    return cores


def workers(app: RunningApp) -> list[dict]:
    return app.health()[1]["workers"]


def replies_by_worker(app: RunningApp) -> dict[str, float]:
    """chat_replies_total summed per ui_worker, from the aggregated /metrics."""
    text = urllib.request.urlopen(app.url + "metrics", timeout=10).read().decode()
    counts: dict[str, float] = {}
    for match in re.finditer(r'^chat_replies_total\{ui_worker="(\d+)",[^}]*\} ([\d.e+]+)$', text, re.M):
        counts[match[1]] = counts.get(match[1], 0.0) + float(match[2])
    return counts


def pinned_client(app: RunningApp, worker: int):
    """A gradio_client session that the router sends to `worker` (as if a browser had its cookie)."""
    from gradio_client import Client

    return Client(app.url, verbose=False, headers={"Cookie": f"{COOKIE}={worker}"})


def test_two_workers_serve_on_one_engine_core(workers_app):
    status, body = workers_app.health()
    assert status == 200 and body["status"] == "ok"
    assert [(w["index"], w["state"]) for w in body["workers"]] == [(0, "serving"), (1, "serving")]
    assert {e["ui_worker"] for e in body["engines"] if e["state"] == "ready"} == {0, 1}
    cores = engine_cores(workers_app)
    assert len(cores) == 1, f"one engine core for both workers, found {[c.pid for c in cores]}"
    worker_pids = {w["pid"] for w in body["workers"]}
    assert cores[0].ppid() not in worker_pids, "the core belongs to the supervisor, not to a worker"


def test_programs_reach_the_workers_through_the_one_port(workers_app):
    before = replies_by_worker(workers_app)
    for worker in (0, 1):
        history = pinned_client(workers_app, worker).predict("Name a colour.", api_name="/chat")
        assert history and history[-1]["content"], history
    after = replies_by_worker(workers_app)
    assert all(after.get(w, 0) > before.get(w, 0) for w in ("0", "1")), (before, after)


async def test_the_websocket_api_streams_through_the_router(workers_app):
    stream = ReplyStream("Count to five.", url=workers_app.url, sampling={"max_tokens": 24, "temperature": 0.0})
    text = "".join([part async for part in stream])
    assert text.strip() and stream.via == "websocket"
    assert stream.stats["generated_tokens"] > 0


def test_metrics_carry_each_workers_label_once_per_family(workers_app):
    text = urllib.request.urlopen(workers_app.url + "metrics", timeout=10).read().decode()
    assert 'ui_worker="0"' in text and 'ui_worker="1"' in text
    types = re.findall(r"^# TYPE (\S+) ", text, re.M)
    assert len(types) == len(set(types)), "each metric family is described once"


@pytest.mark.browser
def test_each_browser_stays_with_its_worker_and_gets_replies_with_stats(browser, workers_app):
    before = replies_by_worker(workers_app)
    fresh = browser.new_context()
    page = fresh.new_page()
    page.goto(workers_app.url)
    page.wait_for_selector("#message textarea")
    given = {c["name"]: c["value"] for c in fresh.cookies()}
    assert given.get(COOKIE) in {"0", "1"}, f"the page should set the router's cookie, got {given}"
    fresh.close()
    for worker in (0, 1):
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        context.add_cookies([{"name": COOKIE, "value": str(worker), "url": workers_app.url}])
        page = context.new_page()
        page.set_default_timeout(30_000)
        page.goto(workers_app.url)
        page.wait_for_selector("#message textarea")
        send(page, "Say hello in five words.")
        _, title = watch_reply(page, "first token")
        assert re.search(r"first token [\d.]+ m?s · [\d.]+ tokens/s", title)
        OUTPUT.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(OUTPUT / f"ui-worker-{worker}.png"))
        assert {c["name"]: c["value"] for c in context.cookies()}.get(COOKIE) == str(worker)
        context.close()
    after = replies_by_worker(workers_app)
    for worker in ("0", "1"):
        assert after.get(worker, 0) > before.get(worker, 0), f"worker {worker} wrote no reply: {before} -> {after}"


def test_a_killed_worker_is_replaced_while_the_other_keeps_serving(workers_app):
    old = {w["index"]: w["pid"] for w in workers(workers_app)}
    os.kill(old[1], signal.SIGKILL)
    history = pinned_client(workers_app, 0).predict("Say yes.", api_name="/chat")  # worker 0 never stopped
    assert history[-1]["content"]
    deadline = time.monotonic() + 180
    while True:
        listed = {w["index"]: w for w in workers(workers_app)}
        status, body = workers_app.health()
        ready = {e["ui_worker"] for e in body["engines"] if e["state"] == "ready"}
        if listed[1]["pid"] != old[1] and listed[1]["state"] == "serving" and status == 200 and 1 in ready:
            break
        assert time.monotonic() < deadline, f"worker 1 was not replaced: {body}"
        time.sleep(0.5)
    assert listed[0]["pid"] == old[0], "the other worker kept running"
    assert len(engine_cores(workers_app)) == 1, "the engine core was not restarted"
    before = replies_by_worker(workers_app).get("1", 0)
    history = pinned_client(workers_app, 1).predict("Say no.", api_name="/chat")
    assert history[-1]["content"]
    assert replies_by_worker(workers_app).get("1", 0) > before


def test_a_killed_engine_core_comes_back_with_every_worker(workers_app):
    CHECKED_LOG["until"] = len(workers_app.log_path.read_text(errors="replace"))
    (core,) = engine_cores(workers_app)
    old_workers = {w["pid"] for w in workers(workers_app)}
    core.kill()
    deadline = time.monotonic() + 300
    while True:
        status, body = workers_app.health()
        cores = engine_cores(workers_app)
        ready = {e["ui_worker"] for e in body.get("engines", []) if e["state"] == "ready"}
        if status == 200 and ready == {0, 1} and len(cores) == 1 and cores[0].pid != core.pid:
            break
        assert time.monotonic() < deadline, f"the engine did not come back: {body}"
        time.sleep(0.5)
    assert not old_workers & {w["pid"] for w in body["workers"]}, "the workers were started again"
    assert "stopped; starting it and its UI workers again" in workers_app.log_path.read_text(errors="replace")
    for worker in (0, 1):
        assert pinned_client(workers_app, worker).predict("Say yes.", api_name="/chat")[-1]["content"]
