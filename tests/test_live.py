"""How a reply reaches a socket (chat/live.py): a reply's log and the store of them, a page's live
text, and the reply a page begins over its socket before Gradio runs the turn, taken over by the turn
only when asked for exactly the same and ended when nobody takes it over. (Resuming, watching and the
grace period through a real socket: tests/test_api.py; the page's rendering: tests/test_browser_live.py.)"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from types import SimpleNamespace

import pytest
import websockets

from chat import live
from chat.client import websocket_url
from chat.live import LiveText, ReplyLog, ReplyStore, claim, same_turn
from chat.service import Finished, ReplyRequest, Writing
from chat.stats import REPLIED, Finish
from tests.conftest import early_replies, eventually
from tests.pages import wait_drawn
from tests.stand_in_fixtures import engine, registry, service  # noqa: F401 - on the stand-in engine
from tests.test_api import IDLE, events_of, idle, next_error
from tests.test_browser import send, watch_reply, watch_second_reply
from tests.test_stream import engine_idle

VISITOR = "voter:0123456789abcdef01234567"  # whose replies these are (chat.voters.visitor_of)
STRANGER = "address:192.0.2.7"


def new_id() -> str:
    return f"live-{secrets.token_hex(16)}"


@pytest.mark.unit
def test_the_store_keeps_running_replies_and_only_the_latest_finished_ones():
    logs = ReplyStore(keep_s=60, keep_max=2)
    running, old, *recent = [ReplyLog(f"r{i}", VISITOR) for i in range(5)]
    for reply_log in (running, old, *recent):
        logs.add(reply_log)
    old.end()
    old.ended_at = time.monotonic() - 61  # finished longer ago than the store keeps replies
    for reply_log in recent:
        reply_log.end()
    assert logs.get(VISITOR, "r1") is None  # too old
    assert logs.get(VISITOR, "r2") is None  # the earliest ended of three, where two are kept
    assert logs.get(VISITOR, "r3") is recent[1] and logs.get(VISITOR, "r4") is recent[2]
    assert logs.get(VISITOR, "r0") is running  # never dropped while it runs


@pytest.mark.unit
async def test_a_log_is_followed_from_where_a_resuming_client_left_off_until_it_ends():
    reply_log = ReplyLog("r", VISITOR)
    reply_log.add("progress", status="Starting the engine…")
    for index, text in enumerate(["Hel", "lo", "!"]):
        reply_log.add("delta", text=text, index=index)
    position = reply_log.position_after(0)  # the client got "Hel"
    assert reply_log.position_after(-1) == 0  # got no text: everything again, the progress too

    async def follow() -> list[dict]:
        return [event async for event in reply_log.follow(position)]

    following = asyncio.create_task(follow())
    await asyncio.sleep(0)  # it has read what there was and waits for more
    assert not following.done()
    reply_log.add("done", finish="stop")
    reply_log.end()
    got = await asyncio.wait_for(following, 5)
    assert [e.get("text", e["type"]) for e in got] == ["lo", "!", "done"]
    assert all(e["id"] == "r" for e in got)


@pytest.mark.unit
def test_live_text_writes_only_the_new_text_and_gradio_redraws_only_when_due():
    logs = ReplyStore()
    live = LiveText(logs, VISITOR, redraw_s=3600)
    assert logs.get(VISITOR, live.log.id) is live.log and live.log.id.startswith("live-")
    live.write("Hel", "Writing… 0:00")
    live.write("Hel", "Writing… 0:00")  # nothing new: nothing written
    live.write("Hello", None)
    deltas = [e for e in live.log.events if e["type"] == "delta"]
    assert [(e["text"], e["index"]) for e in deltas] == [("Hel", 0), ("lo", 1)]
    assert deltas[0]["line"] == "Writing… 0:00" and "line" not in deltas[1]
    assert live.redraw_due() and not live.redraw_due()  # the first text at once, then every redraw_s
    live.end()
    live.end()  # once only
    assert [e["type"] for e in live.log.events][-1:] == ["done"] and not live.log.running
    assert sum(e["type"] == "done" for e in live.log.events) == 1


@pytest.mark.unit
def test_a_turn_takes_over_only_a_reply_begun_for_exactly_its_inputs():
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"}]
    asked = ReplyRequest("And now?", history, preset="p", system_prompt="Be brief.", sampling={"temperature": 0.7},
                         stop_key="early:x", submitted_at=1.0)
    same = ReplyRequest("And now?", [dict(m) for m in history], preset="p", system_prompt="Be brief.",
                        sampling={"temperature": 0.7}, stop_key="chat:y", submitted_at=2.0)
    assert same_turn(asked, same)
    for other in (ReplyRequest("And then?", history, preset="p", system_prompt="Be brief.", sampling={"temperature": 0.7}),
                  ReplyRequest("And now?", history[:1], preset="p", system_prompt="Be brief.", sampling={"temperature": 0.7}),
                  ReplyRequest("And now?", history, preset="q", system_prompt="Be brief.", sampling={"temperature": 0.7}),
                  ReplyRequest("And now?", history, preset="p", system_prompt="", sampling={"temperature": 0.7}),
                  ReplyRequest("And now?", history, preset="p", system_prompt="Be brief.", sampling={"temperature": 0.8})):
        assert not same_turn(asked, other), other


@pytest.mark.unit
def test_a_turn_that_comes_before_its_begun_reply_takes_the_id_so_the_reply_is_never_left_to_run():
    """The socket and Gradio's request are two connections: the turn may be run first. Then the id
    is taken (the socket's `begin` is refused as a duplicate: chat/api.py) and the turn writes its own."""
    logs = ReplyStore()
    log_id = new_id()
    assert claim(logs, VISITOR, log_id, ReplyRequest("Hi")) is None
    taken = logs.get(VISITOR, log_id)
    assert taken is not None and not taken.running and taken.early is None
    assert claim(logs, VISITOR, "live-not-a-page-id", ReplyRequest("Hi")) is None
    assert logs.get(VISITOR, "live-not-a-page-id") is None  # ids a page never picks take nothing


@pytest.mark.unit
def test_each_visitor_finds_only_their_own_replies_and_a_turn_only_its_own_page_s():
    """The store's key is the visitor and the id: the same id of two visitors is two replies, and a
    turn of one visitor neither takes nor spoils a reply another visitor's page began."""
    logs = ReplyStore()
    mine, theirs = ReplyLog("r1", VISITOR), ReplyLog("r1", STRANGER)
    logs.add(mine)
    logs.add(theirs)
    assert logs.get(VISITOR, "r1") is mine and logs.get(STRANGER, "r1") is theirs
    assert logs.get("address:192.0.2.9", "r1") is None
    begun = ReplyLog(log_id := new_id(), VISITOR)
    begun.early = early = SimpleNamespace()  # stands for the EarlyReply the page's `begin` made
    logs.add(begun)
    assert claim(logs, STRANGER, log_id, ReplyRequest("Hi")) is None
    assert begun.early is early and logs.get(VISITOR, log_id) is begun  # still there for its own turn
    for reply_log in (mine, theirs, begun):
        reply_log.end()


@pytest.mark.unit
def test_a_visitor_who_ends_many_replies_at_once_drops_their_own_finished_ones_not_others():
    logs = ReplyStore(keep_s=60, keep_max=4)
    kept = ReplyLog("mine", VISITOR)
    logs.add(kept)
    kept.end()
    for i in range(10):
        logs.add(flood := ReplyLog(f"f{i}", STRANGER))
        flood.end()
    assert logs.get(VISITOR, "mine") is kept
    assert [i for i in range(10) if logs.get(STRANGER, f"f{i}")] == [7, 8, 9]  # the latest, to make room


@pytest.mark.engine
async def test_a_turn_s_stop_reaches_the_begun_reply_it_took_over_and_no_other(service, engine):
    """The turn's Stop (its stop key) stops the reply the page began once the turn has claimed it;
    before, and for another turn's key, it does not (the socket that began it may still close it)."""
    logs = ReplyStore()
    ask = ReplyRequest("Tell me a very long story about dragons.", sampling={"max_tokens": 400, "temperature": 0.7},
                       stop_key="chat:turn")
    log_id = new_id()
    reply_log = live.begin(service, logs, VISITOR, log_id, ask, owner=object())
    live.stop(service, logs, "chat:turn")  # not claimed yet: the Stop of a turn before this one
    early = claim(logs, VISITOR, log_id, ask)
    assert early is not None and reply_log.running
    events = []
    async for event in early.events():
        events.append(event)
        if isinstance(event, Writing) and event.reply.progress.tokens >= 3:
            live.stop(service, logs, "chat:another")
            live.stop(service, logs, "chat:turn")
    finished = events[-1]
    assert isinstance(finished, Finished) and finished.reply.stats.finish is Finish.STOPPED_BY_USER
    assert 3 <= finished.reply.stats.generated_tokens < 400
    assert await eventually(lambda: not reply_log.running) and not logs.claimed_by("chat:turn")
    assert await engine_idle(engine)


def begin(log_id: str, message: str, max_tokens: int = 400) -> str:
    return json.dumps({"type": "begin", "id": log_id, "message": message, "history": [], "preset": None,
                       "system_prompt": None, "sampling": {"temperature": 0.0, "max_tokens": max_tokens}})


@pytest.mark.app
async def test_a_begun_reply_streams_to_its_socket_and_ends_when_the_socket_closes(app_server):
    log_id = new_id()
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        await ws.send(begin(log_id, "Write a very long story about a dragon."))
        got = 0
        async with asyncio.timeout(60):
            while got < 3:
                event = json.loads(await ws.recv())
                assert event["id"] == log_id and event["type"] == "delta", event
                got += 1
        await ws.send(begin(log_id, "Again."))
        async with asyncio.timeout(10):  # the story's text goes on arriving until the refusal does
            while (event := json.loads(await ws.recv()))["type"] == "delta":
                assert event["id"] == log_id
        assert event["type"] == "error" and event["code"] == "duplicate_id", event
    assert await idle(app_server) == IDLE  # nobody took it over: its socket's closing ended it


@pytest.mark.app
async def test_only_a_page_s_kind_of_id_can_be_begun(app_server):
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        for log_id in ("api-1", "live-../../x", new_id().upper()):
            await ws.send(begin(log_id, "Hi"))
            assert (await next_error(ws))["code"] == "bad_request"
        await ws.send(begin(log_id := new_id(), "Say hi.", max_tokens=4))
        assert (await events_of(ws, log_id))[-1]["type"] == "done"


@pytest.mark.app
async def test_junk_in_a_begun_turn_gets_a_sentence_and_the_socket_keeps_serving(app_server):
    junk_history = [{"role": 5, "content": {"type": "text", "text": 7}}, {"role": "user", "content": [1, None, {"x": []}]},
                    {"role": "assistant", "content": "ok", "metadata": 5}, {}]
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        for fields in ({"message": ""}, {"message": "Hi", "history": "no"}, {"message": "Hi", "history": [1, 2]},
                       {"message": "Hi", "preset": "No such preset"}, {"message": "Hi", "sampling": {"temperature": "hot"}},
                       {"message": "Hi", "extra": 1}, {"message": 5}):
            body = {"type": "begin", "id": (log_id := new_id()), **fields}
            await ws.send(json.dumps(body))
            event = json.loads(await asyncio.wait_for(ws.recv(), 30))
            assert event["type"] == "error" and event["message"] and "Traceback" not in event["message"], (fields, event)
        await ws.send(json.dumps({"type": "begin", "id": (log_id := new_id()), "message": "Say hi.", "history": junk_history,
                                  "sampling": {"max_tokens": 4}}))
        assert (await events_of(ws, log_id))[-1]["type"] == "done"


def ready_page(page) -> None:
    page.wait_for_function("window.chatLive?.connected()")  # after a reload, the head's script may come later


@pytest.mark.browser
def test_a_typed_message_starts_its_reply_before_gradio_runs_the_turn(page, app_server):
    before = {outcome: early_replies(app_server, outcome) for outcome in ("claimed", "missing", "other_inputs")}
    ready_page(page)
    send(page, "Say hi.", max_tokens=24)
    watch_reply(page, REPLIED)
    send(page, "And again.")  # with the first turn in the chat, as the page holds it
    watch_second_reply(page)
    after = {outcome: early_replies(app_server, outcome) for outcome in before}
    assert after == {**before, "claimed": before["claimed"] + 2}
    app_server.wait_idle()


@pytest.mark.browser
def test_a_reply_begun_for_other_inputs_is_dropped_and_the_turn_writes_its_own(page, app_server):
    """Whatever the socket carried, the reply shown is the one Gradio's turn asked for."""
    page.add_init_script("""(() => {
      const send = WebSocket.prototype.send;
      WebSocket.prototype.send = function (data) {
        return send.call(this, String(data).replace('"message":"Say hi."', '"message":"Count to 50."'));
      };
    })()""")
    page.reload()
    wait_drawn(page)
    ready_page(page)
    other_inputs = early_replies(app_server, "other_inputs")
    send(page, "Say hi.", max_tokens=24)
    watch_reply(page, REPLIED)
    assert early_replies(app_server, "other_inputs") == other_inputs + 1
    body = app_server.wait_idle()
    assert all(e["running"] == 0 and e["unfinished"] == 0 for e in body["engines"])


