"""Limits, faults and observability on the real engine and the real server."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
import urllib.parse
import urllib.request
from pathlib import Path

import psutil
import pytest

from chat.errors import EngineBusy
from chat.stats import Finish
from chat.ui.page_shell import STATUS_TIMERS
from tests.conftest import PROBLEM_LINE, USER, api_client, get_json, running, start_app, still_running
from tests.test_stream import engine_idle, reply_to

PRESET = "SmolLM2 135M (CPU)"


async def test_a_reply_with_no_progress_is_given_up_with_one_sentence(engine, default_preset):
    reply = reply_to(engine, default_preset, "Summarise this: " + "the quick brown fox jumps. " * 200, max_tokens=50)
    reply.idle_timeout_s = 0.05  # reading a 1,500-token prompt takes far longer on a CPU
    async for _ in reply.stream():
        pass
    assert reply.stats.finish is Finish.TIMED_OUT
    assert reply.notice == (
        "The model produced nothing for 0.05 s, so this reply was stopped; the demo may be very busy, please try again."
    )
    # Idle once the step that reads the prompt ends, which takes as long as the prompt on a busy CPU.
    assert await engine_idle(engine, within_s=30)


async def test_beyond_the_waiting_limit_a_request_is_refused_at_once(engine, default_preset):
    saved = engine.max_waiting
    engine.max_waiting = 2 - engine.max_num_seqs  # room for two streams in all
    try:
        running = [reply_to(engine, default_preset, f"Count to {n}.", max_tokens=400).stream() for n in (100, 200)]
        for stream in running:
            await anext(stream)
        refused = reply_to(engine, default_preset, "And me?", max_tokens=4)
        with pytest.raises(EngineBusy) as caught:
            await anext(refused.stream())
        assert caught.value.message == "The demo is busy, try again in a moment."
        # At once: while both streams still ran (it did not wait for one to end), and it never entered the engine.
        assert engine.streams == 2 and engine.num_unfinished() == 2
        for stream in running:
            await stream.aclose()
    finally:
        engine.max_waiting = saved
    assert await engine_idle(engine)


def test_metrics_show_the_apps_and_vllms_numbers(real_app):
    """On the real engine: vLLM's own metrics come from its front end, which the stand-in has not."""
    api_client(real_app.url).predict("Say hello.", PRESET, "", 0.0, 0.9, 0, 6, 1.0, 1, api_name="/chat")
    with urllib.request.urlopen(real_app.url + "metrics", timeout=10) as response:
        text = response.read().decode()
    for name in (
        'chat_replies_total{finish="max_tokens",preset="SmolLM2 135M (CPU)"}',
        'chat_time_to_first_token_seconds_count{preset="SmolLM2 135M (CPU)"}',
        "chat_inter_token_latency_seconds_bucket",
        'chat_streams_in_flight{preset="SmolLM2 135M (CPU)"} 0.0',
        "vllm:num_requests_running",
        "vllm:time_to_first_token_seconds_bucket",
        "vllm:kv_cache_usage_perc",
    ):
        assert name in text, name


def engine_core_of(process: psutil.Popen | int) -> psutil.Process:
    for child in psutil.Process(process if isinstance(process, int) else process.pid).children(recursive=True):
        if child.name().startswith("VLLM::EngineCor"):
            return child
    raise AssertionError("no EngineCore process under the app")


AUTH = USER  # an account of conftest's `protected_app`


def http_status(url: str, auth: tuple[str, str] | None = None) -> int:
    import base64
    import urllib.error

    request = urllib.request.Request(url)
    if auth:
        request.add_header("Authorization", "Basic " + base64.b64encode(":".join(auth).encode()).decode())
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.mark.app
def test_a_login_protects_the_ui_the_api_and_the_metrics(protected_app):
    import websockets.sync.client as ws

    url = protected_app.url
    assert http_status(url + "metrics") == 401 and http_status(url + "metrics", AUTH) == 200
    assert http_status(url + "metrics", ("demo", "wrong")) == 401
    # Open for load balancers; strangers learn only whether the app serves, not its engines' states.
    assert get_json(url + "healthz") == (200, {"status": "ok"})
    assert http_status(url + "status") == 401 and http_status(url + "status", AUTH) == 200  # the engine line
    # Signed in on the login page, as a browser is: its cookie opens the app's own routes too.
    browser = urllib.request.build_opener(urllib.request.HTTPCookieProcessor())
    form = urllib.parse.urlencode({"username": AUTH[0], "password": AUTH[1]}).encode()
    browser.open(urllib.request.Request(url + "login", data=form), timeout=10).close()
    with browser.open(url + "metrics", timeout=10) as response:
        assert response.status == 200 and b"chat_" in response.read()
    with urllib.request.urlopen(url, timeout=10) as page:  # a login form: no title of the chat behind it
        form_page = page.read()
    with browser.open(url, timeout=10) as page:  # signed in: the chat
        chat_page = page.read()
    assert b'id="page-shell"' not in form_page
    # Both end the loop Gradio's page-loading indicator leaves running (chat/ui/status_timers.js).
    assert STATUS_TIMERS.encode() + b"<gradio-app" in form_page and STATUS_TIMERS.encode() + b"<gradio-app" in chat_page
    with pytest.raises(Exception, match="(?i)log ?in|auth|401|403"):
        api_client(url)
    with pytest.raises(Exception, match="403|rejected|InvalidStatus"):
        ws.connect(url.replace("http", "ws") + "chat", open_timeout=10).close()
    messages = api_client(url, auth=AUTH).predict("Hi", PRESET, "", 0.0, 0.9, 0, 3, 1.0, 1, api_name="/chat")
    assert messages[-1]["metadata"]["title"].startswith("📊 ")
    from chat.client import ReplyStream

    async def over_the_socket() -> str:
        stream = ReplyStream("Hi", url=url, preset=PRESET, auth=AUTH, sampling={"max_tokens": 3, "temperature": 0})
        return "".join([text async for text in stream])

    assert asyncio.run(over_the_socket())


FIRST_TEXT_WITHIN_S = 180.0  # a bound for a loaded machine; seconds on a quiet one


@pytest.mark.app
@pytest.mark.logs_errors  # "The engine ... died; restarting it": what an operator must see
def test_a_killed_engine_ends_streams_plainly_and_restarts(real_app):
    app = real_app
    client = api_client(app.url)
    sent = time.monotonic()
    job = client.submit("Tell me a very long story about a lighthouse.", PRESET, "", 0.8, 0.9, 0, 800, 1.0, -1, api_name="/chat")
    # Killed before its first text, the reply started on the restarted engine and outran job.result's
    # bound (a fresh clone's two-process run, where the first text took over 60 s): wait for it.
    while not any(m.get("content") for m in (job.outputs() or [[]])[-1] if not m.get("metadata")):
        assert time.monotonic() - sent < FIRST_TEXT_WITHIN_S, f"no text {FIRST_TEXT_WITHIN_S:g} s after the message"
        time.sleep(0.1)
    victim = engine_core_of(app.process.pid)
    victim.send_signal(signal.SIGKILL)
    messages = job.result(timeout=60)
    assert messages[-1]["metadata"]["title"] == (
        "⚠️ The model's engine stopped working and is being restarted; your next message will wait for it."
    )
    assert messages[0]["content"] and not messages[0].get("metadata")  # the text so far is kept
    status, body = get_json(app.url + "healthz")
    assert status == 503 and "Restarting the engine" in body["reason"], body
    # The next message waits for the new engine instead of failing.
    after = api_client(app.url).predict("Say hi.", PRESET, "", 0.0, 0.9, 0, 4, 1.0, 1, api_name="/chat")
    assert after[-1]["metadata"]["title"].startswith("📊 ")
    assert app.health()[0] == 200
    assert engine_core_of(app.process.pid).pid != victim.pid
    with urllib.request.urlopen(app.url + "metrics", timeout=10) as response:
        assert f'chat_engine_restarts_total{{preset="{PRESET}"}} 1.0' in response.read().decode()


@pytest.mark.app
@pytest.mark.logs_errors
def test_an_idle_engine_that_dies_is_restarted_before_anyone_asks(real_app):
    """No stream notices the death of an idle engine: the app's watch does (chat/registry.py `watch`,
    which a process serving alone runs; with UI workers, the owner sees its cores' processes end)."""
    app = real_app

    def health() -> tuple[int, str]:
        status, body = get_json(app.url + "healthz")
        return status, body.get("reason", "")

    assert health()[0] == 200
    victim = engine_core_of(app.process.pid)
    victim.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while "Restarting the engine" not in health()[1]:
        assert time.monotonic() < deadline, "nobody noticed that the idle engine died"
        time.sleep(0.2)
    deadline = time.monotonic() + 240
    while health()[0] != 200:
        assert time.monotonic() < deadline, "the engine did not come back"
        time.sleep(0.5)
    assert engine_core_of(app.process.pid).pid != victim.pid


@pytest.mark.app
def test_failed_sign_ins_from_one_address_are_refused_for_a_while(protected_app):
    """From an address of its own (127.0.0.3, on the loopback network): it stays locked out of the
    shared app for 5 minutes, and no other test's sign-ins count toward it."""
    import httpx

    from chat.auth import MAX_FAILURES, TOO_MANY

    with httpx.Client(transport=httpx.HTTPTransport(local_address="127.0.0.3"), timeout=10) as there:
        def sign_in(password: str) -> httpx.Response:
            return there.post(protected_app.url + "login", data={"username": AUTH[0], "password": password})

        refused = [sign_in(f"guess {i}").status_code for i in range(MAX_FAILURES + 1)]
        assert refused == [400] * MAX_FAILURES + [429], refused
        right = sign_in(AUTH[1])  # the right password, from an address that guessed too often
        assert right.status_code == 429 and right.json()["detail"] == TOO_MANY
        assert there.get(protected_app.url + "metrics", auth=AUTH).status_code == 401
    assert http_status(protected_app.url + "metrics", AUTH) == 200, "this machine's own address is not locked out"


@pytest.mark.app
@pytest.mark.real_engine
@pytest.mark.parametrize(("workers", "moment"), [(1, "engine processes"), (2, "engine processes"), (1, "first page")])
def test_stopping_the_app_while_its_engine_starts_ends_the_start_and_leaves_nothing_running(tmp_path, workers, moment):
    """Ctrl-C or `docker stop` during the first minute: the start is cut short (the exit used to wait
    for it, and a stop that would not wait that long left the engine running without the app). The
    stop may come before vLLM's processes exist ("first page": as soon as the app answers), when
    the start is only asked for or has just begun: none may be left behind either."""
    app = start_app("stop-while-starting", "--votes-db", str(tmp_path / "votes.sqlite3"), "--ui-workers", str(workers),
                    engine_ready=False)
    try:
        deadline = time.monotonic() + 120
        while moment == "engine processes":  # the engine's own processes exist: its start is under way
            with contextlib.suppress(AssertionError, psutil.Error):
                engine_core_of(app.process)
                break
            assert time.monotonic() < deadline, "no engine process appeared"
            time.sleep(0.2)
        assert "ready in" not in app.log_path.read_text(errors="replace")
        app.process.terminate()
        app.process.wait(timeout=120)
    finally:
        if app.process.poll() is None:
            app.process.kill()
    # Every process the app started writes to its log: none may be left.
    left = [p for p in psutil.process_iter() if writes_to(p, app.log_path) and running(p)]
    assert not (alive := still_running(left, 10)), f"processes outlived the app: {alive}"
    text = app.log_path.read_text(errors="replace")
    if moment == "engine processes":
        assert "Stopping the engine for 'SmolLM2 135M (CPU)' while it starts" in text, text[-3000:]
    assert not PROBLEM_LINE.search(text), text[-3000:]


def writes_to(process: psutil.Process, log: Path) -> bool:
    try:
        return any(Path(f.path) == log for f in process.open_files())
    except psutil.Error:
        return False
