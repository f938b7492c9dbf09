"""How a reply is run and read (chat/live.py): a reply's log and the store of them, its text, the
reply a page starts over its socket before Gradio runs the turn, which only follows it, a turn that
comes first and starts it, the Chat tab's Stop, and the service's admission. (Resuming, watching and
the grace period through a real socket: tests/test_api.py; the page's rendering: tests/test_browser_live.py.)"""

from __future__ import annotations

import asyncio
import json
import secrets
import time

import pytest
import websockets

from chat import live
from chat.client import websocket_url
from chat.live import LiveText, ReplyLog, ReplyStore
from chat.service import Finished, ReplyRequest, Waiting, Writing
from chat.stats import REPLIED, Finish
from tests.conftest import eventually, replies_started
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
async def test_a_reply_that_ends_while_its_reader_holds_an_event_is_drawn_to_its_last_event():
    """A Gradio turn holds each event it is given while it sends the redraw: a one-word reply ended
    in that time, and the turn ended on its first "Writing…" line (its chat saved so), once in five
    pages after a Retry (2026-12-08)."""
    reply_log = ReplyLog("r", VISITOR)
    first, last = object(), object()  # `drawn` hands on whatever the pipeline's latest event is
    reply_log.latest = first  # type: ignore[assignment]
    drawn = reply_log.drawn()
    assert await anext(drawn) is first
    reply_log.latest = last  # type: ignore[assignment]  # meanwhile the reply writes its last word and ends
    reply_log.add("done", finish="finished")
    reply_log.end()
    assert [event async for event in drawn] == [last]


@pytest.mark.unit
async def test_an_ended_reply_kept_for_resuming_lets_its_owner_go():
    """A finished reply stays KEEP_S (for a client that resumes it), its socket need not (issue 48:
    each held the connection's objects, which every full garbage collection walked)."""
    reply_log = ReplyLog("r", VISITOR)
    reply_log.owner = object()  # the socket that began it
    reply_log.add("done", finish="stop")
    reply_log.end()
    assert reply_log.owner is None
    assert [e["type"] async for e in reply_log.follow()] == ["done"], "still there for a client that resumes it"


@pytest.mark.unit
def test_live_text_writes_only_the_new_text_with_the_line_at_most_ten_times_a_second():
    live = LiveText(ReplyLog(new_id(), VISITOR))
    live.write("Hel", "Writing… 0:00")
    live.write("Hel", "Writing… 0:00")  # nothing new: nothing written
    live.write("Hello", "Writing… 0:01")  # at once after the first: its line waits
    deltas = [e for e in live.log.events if e["type"] == "delta"]
    assert [(e["text"], e["index"]) for e in deltas] == [("Hel", 0), ("lo", 1)]
    assert deltas[0]["line"] == "Writing… 0:00" and "line" not in deltas[1]
    live.end()
    live.end()  # once only
    assert [e["type"] for e in live.log.events][-1:] == ["done"] and not live.log.running
    assert sum(e["type"] == "done" for e in live.log.events) == 1


@pytest.mark.unit
async def test_a_reader_who_falls_behind_draws_the_latest_event_and_always_the_last():
    reply_log = ReplyLog(new_id(), VISITOR)
    drawn: list[object] = []

    async def draw() -> None:
        async for event in reply_log.drawn():
            drawn.append(event)

    drawing = asyncio.create_task(draw())
    first, skipped, latest, last = (Waiting(f"step {i}") for i in range(4))
    reply_log.latest = first
    reply_log.add("progress")
    assert await eventually(lambda: drawn == [first])
    reply_log.latest = skipped
    reply_log.latest = latest  # before the reader looked again
    reply_log.add("progress")
    assert await eventually(lambda: drawn == [first, latest])
    reply_log.latest = last
    reply_log.end()
    await asyncio.wait_for(drawing, 5)
    assert drawn == [first, latest, last]


@pytest.mark.unit
def test_a_turn_names_its_reply_only_by_an_id_a_page_would_pick():
    from chat.ui.live_script import page_id

    assert page_id(log_id := new_id()) == log_id and page_id(live.new_page_id())
    for junk in ("", "r1", "live-../../x", log_id.upper(), log_id + "0", None, 5, ["live-"]):
        assert page_id(junk) is None, junk


@pytest.mark.unit
def test_each_visitor_finds_only_their_own_replies():
    """The store's key is the visitor and the id: the same id of two visitors is two replies."""
    logs = ReplyStore()
    mine, theirs = ReplyLog("r1", VISITOR), ReplyLog("r1", STRANGER)
    logs.add(mine)
    logs.add(theirs)
    assert logs.get(VISITOR, "r1") is mine and logs.get(STRANGER, "r1") is theirs
    assert logs.get("address:192.0.2.9", "r1") is None
    for reply_log in (mine, theirs):
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


LONG = ReplyRequest("Tell me a long story.", sampling={"max_tokens": 400, "temperature": 0.7})


async def drawn_by_turn(service, logs, page_id, request=LONG, browser=True, stop_after=None) -> list:
    """What the Chat tab's turn draws (`live.turn_reply`), each event with its log's id; `stop_after`,
    called with each event, may stop the reply."""
    events = []
    async for event, log_id in live.turn_reply(service, logs, request, VISITOR, page_id, browser):
        events.append((event, log_id))
        if stop_after is not None:
            stop_after(event)
    return events


@pytest.mark.engine
async def test_a_turn_follows_the_reply_its_page_started_and_starts_none(service, engine):
    """The page's socket started the reply (`begin`); the turn sent with its id draws it: the first
    text at once, a redraw at most every REDRAW_S, the end with its stats, and nothing of its own."""
    logs = ReplyStore()
    started = live.start(service, logs, VISITOR, page_id := new_id(), LONG, owner=object(), started_by="page", lines=True)
    events = await drawn_by_turn(service, logs, page_id)
    assert {log_id for _, log_id in events} == {page_id} and logs.get(VISITOR, page_id) is started
    assert isinstance(events[-1][0], Finished) and events[-1][0].reply.stats.finish is Finish.MAX_TOKENS
    writings = [event for event, _ in events if isinstance(event, Writing)]
    assert writings and len(writings) < len([e for e in started.events if e["type"] == "delta"])  # redraws, not every delta
    assert [e["type"] for e in started.events][-2:] == ["stats", "done"]
    assert any("line" in e for e in started.events if e["type"] == "delta")  # the page's box has its line
    assert await engine_idle(engine)


@pytest.mark.engine
async def test_a_turn_before_its_page_s_start_starts_the_reply_under_that_id_and_owns_it(service, engine):
    """The socket and Gradio's request are two connections; the turn may come first. It then starts
    the reply under the page's id (a `begin` arriving later follows it: tests below), and closing
    the turn before the end aborts it; a program's turn (no page) gets an id of its own."""
    logs = ReplyStore()
    turn = live.turn_reply(service, logs, LONG, VISITOR, page_id := new_id(), True)
    event, log_id = await anext(turn)
    started = logs.get(VISITOR, page_id)
    assert log_id == page_id and started is not None and started.started_by == "turn" and started.running
    await turn.aclose()
    assert await eventually(lambda: not started.running) and started.events[-1] == {
        "type": "done", "id": page_id, "finish": "disconnected"}
    assert await engine_idle(engine)
    events = await drawn_by_turn(service, logs, None, ReplyRequest("Say hi.", sampling={"max_tokens": 8}), browser=False)
    assert {log_id for _, log_id in events} == {None} and isinstance(events[-1][0], Finished)


@pytest.mark.engine
async def test_the_chat_tab_s_stop_reaches_the_reply_its_page_started_by_its_id_and_no_other(service, engine):
    logs = ReplyStore()
    started = live.start(service, logs, VISITOR, page_id := new_id(), LONG, owner=object(), started_by="page")

    def stop(event) -> None:
        if isinstance(event, Writing) and event.reply.progress.tokens >= 3:
            live.stop(service, logs, VISITOR, "chat:turn", None)  # its turn's key alone: not this reply's
            live.stop(service, logs, STRANGER, "chat:turn", page_id)  # another visitor naming its id
            live.stop(service, logs, VISITOR, "chat:turn", page_id)

    finished = (await drawn_by_turn(service, logs, page_id, stop_after=stop))[-1][0]
    assert isinstance(finished, Finished) and finished.reply.stats.finish is Finish.STOPPED_BY_USER
    assert 3 <= finished.reply.stats.generated_tokens < 400 and not started.running
    assert await engine_idle(engine)


@pytest.mark.engine
async def test_admission_lets_a_set_number_of_replies_write_at_once_and_the_rest_wait_in_line(service, engine):
    """--concurrency-limit: the service writes at most that many replies at once, whichever front end
    asked; the next waits, told so, and starts when one ends; Stop reaches one still in line; beyond
    --max-waiting in line a reply is refused at once."""
    from chat.service import Admission, Failed

    service.admission = Admission(limit=1, max_waiting=1, tallies=service.tallies)
    logs = ReplyStore()
    try:
        first = live.start(service, logs, VISITOR, new_id(), LONG, owner=object(), started_by="api")
        assert await eventually(lambda: any(e["type"] == "delta" for e in first.events))
        second = live.start(service, logs, VISITOR, new_id(), ReplyRequest("Say hi.", sampling={"max_tokens": 8}),
                            owner=object(), started_by="api")
        assert await eventually(lambda: [e["type"] for e in second.events] == ["progress"])
        assert "Waiting for a free slot" in second.events[0]["status"]
        third = live.start(service, logs, VISITOR, new_id(), LONG, owner=object(), started_by="api")
        assert await eventually(lambda: not third.running)
        assert third.events[-1]["type"] == "error" and third.events[-1]["code"] == "busy", third.events
        assert isinstance(third.latest, Failed)
        service.stop(first.stop_key)
        assert await eventually(lambda: not first.running and not second.running, within_s=30)
        assert second.events[-1]["finish"] == "max_tokens"  # it ran once the first had gone
        waiting_one = live.start(service, logs, VISITOR, new_id(), LONG, owner=object(), started_by="api")
        assert await eventually(lambda: any(e["type"] == "delta" for e in waiting_one.events))
        in_line = live.start(service, logs, VISITOR, new_id(), LONG, owner=object(), started_by="api")
        assert await eventually(lambda: in_line.events[:1] and in_line.events[0]["type"] == "progress")
        service.stop(in_line.stop_key)  # Stop while in line
        assert await eventually(lambda: not in_line.running)
        assert in_line.events[-1]["finish"] == "stopped_by_user" and not any(e["type"] == "delta" for e in in_line.events)
        waiting_one.abort()
        assert await eventually(lambda: not waiting_one.running)
        assert service.tallies.tallies.held(Admission.KEY) == 0
    finally:
        service.admission = None
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
    before = {by: replies_started(app_server, by) for by in ("page", "turn")}
    ready_page(page)
    send(page, "Say hi.", max_tokens=24)
    watch_reply(page, REPLIED)
    send(page, "And again.")  # with the first turn in the chat, as the page holds it
    watch_second_reply(page)
    after = {by: replies_started(app_server, by) for by in before}
    assert after == {"page": before["page"] + 2, "turn": before["turn"]}, "the turns followed the page's replies"
    app_server.wait_idle()


@pytest.mark.browser
def test_a_turn_that_overtakes_its_page_s_start_starts_the_reply_and_the_page_still_follows_it(page, app_server):
    """The page's `begin` held back until after its Gradio turn has run: the turn starts the reply
    under the page's id, and the late `begin` follows it, so the page's box fills as ever."""
    page.add_init_script("""(() => {
      const send = WebSocket.prototype.send;
      WebSocket.prototype.send = function (data) {
        if (!String(data).includes('"type":"begin"')) return send.call(this, data);
        setTimeout(() => send.call(this, data), 1500);
      };
    })()""")
    page.reload()
    wait_drawn(page)
    ready_page(page)
    before = {by: replies_started(app_server, by) for by in ("page", "turn")}
    send(page, "Write a long story about a dragon.", max_tokens=200)
    box = page.locator("#chatbot .live-reply").last
    box.locator("p").first.wait_for(timeout=60_000)  # drawn by the page's script from the socket's text
    watch_reply(page, REPLIED)
    assert {by: replies_started(app_server, by) for by in before} == {"page": before["page"], "turn": before["turn"] + 1}
    body = app_server.wait_idle()
    assert all(e["running"] == 0 and e["unfinished"] == 0 for e in body["engines"])


