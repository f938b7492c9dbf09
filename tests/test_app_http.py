"""The whole app over HTTP, driven with gradio_client as any program would drive it."""

from __future__ import annotations

import http.client
import re
import subprocess
import sys
import threading
import time
from urllib.parse import quote, urlsplit

from chat.stats import REPLIED
from tests.conftest import ROOT, get_json

PRESET = "SmolLM2 135M (CPU)"


def chat(client, message, **sampling):
    values = {"temperature": 0.0, "top_p": 0.9, "top_k": 0, "max_tokens": 24, "repetition_penalty": 1.1, "seed": 1}
    values.update(sampling)
    return client.submit(message, PRESET, "You are a helpful assistant.", *values.values(), api_name="/chat")


def final_title(messages):
    return messages[-1]["metadata"]["title"]


def test_a_reply_streams_over_http_with_stats_beneath_it(client, app_server):
    job = chat(client, "Write two sentences about autumn.", max_tokens=80)  # ~1.2 s of updates on the stand-in
    texts = []
    for update in job:
        body = [m["content"] for m in update if not m.get("metadata")]
        texts.append(body[0] if body else "")
    messages = job.outputs()[-1]
    growing = [t for t in texts if t]
    assert len(set(growing)) >= 3, "the reply should arrive in several updates"
    assert all(later.startswith(earlier) for earlier, later in zip(growing, growing[1:], strict=False))
    assert messages[0]["content"] == growing[-1]
    title = final_title(messages)
    assert title.startswith(f"📊 {REPLIED} ") and "80 tokens at " in title and " a second · " in title
    assert "reached the Max tokens limit" in title
    assert "| Preset | SmolLM2 135M (CPU) |" in messages[-1]["content"]
    assert app_server.wait_idle()["engines"][0]["running"] == 0


def test_two_conversations_at_once_both_complete_and_overlap(client):
    arrivals: dict[int, list[float]] = {0: [], 1: []}
    results = {}

    def converse(index):
        job = chat(client, f"List {index + 3} kinds of trees.", max_tokens=96)  # ~1.4 s each: room to overlap when busy
        for _ in job:
            arrivals[index].append(time.monotonic())
        results[index] = job.outputs()[-1]

    threads = [threading.Thread(target=converse, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert set(results) == {0, 1}
    for messages in results.values():
        assert "96 tokens" in final_title(messages)
    assert arrivals[1][0] < arrivals[0][-1] and arrivals[0][0] < arrivals[1][-1]


def test_out_of_range_values_through_the_api_give_a_plain_sentence(client):
    messages = chat(client, "Hello", temperature=9).result()
    assert final_title(messages) == "⚠️ Temperature must be a number from 0 to 2; it was 9."
    messages = chat(client, "Hello", max_tokens=5000).result()
    assert final_title(messages) == "⚠️ Max new tokens must be a whole number from 1 to 1024; it was 5000."
    assert "Traceback" not in str(messages)
    assert "📊" in final_title(chat(client, "Still there?", max_tokens=4).result())  # and it keeps serving


def test_an_empty_message_is_refused_plainly(client):
    assert final_title(chat(client, "   ").result()) == "⚠️ Type a message first."


def test_a_conversation_longer_than_the_context_gives_the_numbers(client):
    title = final_title(chat(client, "word " * 2500).result())
    assert re.fullmatch(
        r"⚠️ Your conversation is [\d,]+ tokens; this model accepts 2,048\. Start a new chat or shorten your message\.", title
    )


def test_a_preset_is_chosen_by_name_only(client):
    """A path or any other name is refused with a sentence, before any engine work; the app keeps serving."""
    job = client.submit("Hi", "../../etc/passwd", "", 0.7, 0.9, 0, 8, 1.0, -1, api_name="/chat")
    assert final_title(job.result()).startswith("⚠️ There is no preset named '../../etc/passwd'")
    assert "📊" in final_title(chat(client, "Hi", max_tokens=2).result())


def test_an_idle_connection_is_kept_longer_than_programs_keep_theirs(app_server):
    """httpx, and so gradio_client, keeps an idle connection 5 s, uvicorn's default too: a request sent
    on it as the server closes it is reset unanswered. The app keeps one 20 s (chat/ui/gradio_internals.py,
    item 6), so the program always lets go first."""
    address = urlsplit(app_server.url)
    connection = http.client.HTTPConnection(address.hostname, address.port, timeout=30)
    try:
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        kept = connection.sock
        time.sleep(6)  # idle between two calls, a second longer than those programs keep a connection
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 200 and connection.sock is kept, "the second request should reuse the connection"
    finally:
        connection.close()


def test_health_reports_the_engine_and_its_start_time(app_server):
    status, body = app_server.health()
    assert status == 200 and body["status"] == "ok"
    (engine,) = body["engines"]
    assert engine["preset"] == PRESET and engine["state"] == "ready" and engine["start_seconds"] > 0


def test_status_gives_the_chat_tabs_engine_line_for_a_preset(app_server):
    """What the page's engine line asks for every few seconds (chat/ui/engine_line.js)."""
    status, body = get_json(app_server.url + "status?preset=" + quote(PRESET))
    assert status == 200 and body["line"].startswith("Engine: Ready · ") and "KV cache" in body["line"]
    status, body = get_json(app_server.url + "status?preset=" + quote("../../etc/passwd"))
    assert status == 200 and body["line"].startswith("There is no preset named '../../etc/passwd'")


def test_the_page_holds_only_the_chat_tab_and_programs_reach_every_endpoint(app_server):
    """Compare, Leaderboard and Monitor are made when first opened (chat/ui/lazy.py): none of their
    components is in the page's configuration, while their endpoints for programs are."""
    status, config = get_json(app_server.url + "config")
    assert status == 200
    ids = {c["props"].get("elem_id") or "" for c in config["components"]}
    assert "message" in ids and "engine-status" in ids
    assert not [i for i in ids if i.startswith(("compare-", "leaderboard-", "monitor-"))], sorted(ids)
    named = {d.get("api_name") for d in config["dependencies"]}
    assert {"chat", "reply", "compare", "vote", "compare_stop", "leaderboard"} <= named


def test_help_documents_every_flag_and_its_environment_variable():
    out = subprocess.run([sys.executable, "app.py", "--help"], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    for flag, env in (("--host", "CHAT_HOST"), ("--port", "CHAT_PORT"), ("--preset", "CHAT_PRESET"), ("--share", "CHAT_SHARE")):
        assert flag in out and env in out
    assert "127.0.0.1" in out
