"""A reply belongs to who started it (chat/live.py, chat/api.py, chat/voters.py): on /chat, another
visitor (another voter cookie, or without one another address) cannot watch, resume or cancel a
reply by its id, and reusing the id starts a reply of their own; the owner's resume and the page's
own path (a reply begun over its socket, followed by its Gradio turn, followed by its socket) work."""

from __future__ import annotations

import asyncio
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import SimpleNamespace
from typing import Any

import httpx
import pytest
import websockets
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route, WebSocketRoute
from starlette.testclient import TestClient

from chat.client import websocket_url
from chat.voters import COOKIE, VISITOR, VoterCookie, VoterKeys, address_group, visitor_of
from tests.conftest import replies_started
from tests.test_api import IDLE, chat, deltas, events_of, idle, next_error
from tests.test_hostile import config, join_body, read_events

LONG = "Write a long story about a lighthouse."  # the stand-in writes it to Max tokens


# --- who a visitor is -------------------------------------------------------------------------


@pytest.mark.unit
def test_an_address_names_a_visitor_ipv6_by_its_64():
    assert address_group("203.0.113.5") == "203.0.113.5"
    assert address_group("2001:db8:1:2:aaaa::1") == address_group("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert address_group("2001:db8:1:3::1") != address_group("2001:db8:1:2::1")
    assert address_group("::ffff:203.0.113.5") == "203.0.113.5"  # IPv4 written as IPv6
    assert address_group("fe80::1%eth0") == "fe80::/64"
    assert address_group("") == "" and address_group("not an address") == "not an address"


@pytest.mark.unit
def test_the_cookie_middleware_names_each_request_s_visitor_http_and_websocket(tmp_path):
    keys = VoterKeys.beside(tmp_path / "votes.sqlite3")

    async def who(request: Any) -> PlainTextResponse:
        return PlainTextResponse(visitor_of(request))

    async def who_socket(websocket: Any) -> None:
        await websocket.accept()
        await websocket.send_text(visitor_of(websocket))
        await websocket.close()

    app = Starlette(routes=[Route("/who", who), WebSocketRoute("/ws", who_socket)],
                    middleware=[Middleware(VoterCookie, keys=keys)])
    value = keys.issue()
    with TestClient(app, client=("203.0.113.5", 5000)) as client:
        first = client.get("/who")
        assert first.text == "address:203.0.113.5" and first.cookies.get(COOKIE)  # given a cookie, still its address
        assert client.get("/who").text == f"voter:{keys.voter(first.cookies[COOKIE])}"  # the next request sends it
        client.cookies.clear()
        assert client.get("/who", headers={"Cookie": f"{COOKIE}={value}"}).text == f"voter:{keys.voter(value)}"
        voter, _, signature = value.rpartition(".")
        forged = f"{voter}.{'0' * len(signature)}"  # someone's voter id, a signature the server never made
        assert client.get("/who", headers={"Cookie": f"{COOKIE}={forged}"}).text == "address:203.0.113.5"
        client.cookies.clear()
        with client.websocket_connect("/ws", headers={"Cookie": f"{COOKIE}={value}"}) as ws:
            assert ws.receive_text() == f"voter:{keys.voter(value)}"
        with client.websocket_connect("/ws") as ws:
            assert ws.receive_text() == "address:203.0.113.5"
    # Without the middleware (a request made in a test): its address.
    assert visitor_of(SimpleNamespace(client=SimpleNamespace(host="2001:db8::7"))) == "address:2001:db8::/64"



@pytest.mark.unit
def test_the_chat_tabs_stop_key_is_its_visitors_and_not_the_session_hash_alone():
    """The session hash is the client's to choose: a stranger who sends a victim's with a Stop stops
    only a reply of their own (the Stop by key itself: tests/test_service.py)."""
    from chat.ui.chat_tab import stop_key

    def request(visitor: str) -> SimpleNamespace:
        return SimpleNamespace(session_hash="s3ss10n", state=SimpleNamespace(**{VISITOR: visitor}))

    assert stop_key(request("voter:a")) == stop_key(request("voter:a"))
    assert stop_key(request("voter:a")) != stop_key(request("voter:b")) != stop_key(request("address:192.0.2.7"))


# --- on the app -------------------------------------------------------------------------------


async def voter_cookie(app) -> str:
    """A new voter's cookie header, as a browser gets it with the page."""
    async with httpx.AsyncClient(timeout=30) as http:
        response = await http.get(app.url + "healthz")
    return f"{COOKIE}={response.cookies[COOKIE]}"


@asynccontextmanager
async def socket(app, cookie: str | None = None, address: str = "127.0.0.1") -> AsyncIterator[Any]:
    """/chat as a visitor: with `cookie` (a Cookie header's value), from `address` (on the loopback network)."""
    headers = {"Cookie": cookie} if cookie else None
    async with websockets.connect(websocket_url(app.url), additional_headers=headers, local_addr=(address, 0)) as ws:
        yield ws


async def first_delta(ws, request_id: str) -> list[dict]:
    """The request's events up to its first delta."""
    events = []
    async with asyncio.timeout(60):
        while not ((event := json.loads(await ws.recv()))["type"] == "delta" and event["id"] == request_id):
            assert event["type"] != "error", event
            events += [event] if event.get("id") == request_id else []
    return [*events, event]


async def refused(ws, message: dict[str, Any]) -> str:
    await ws.send(json.dumps(message))
    error = await next_error(ws)
    assert error["id"] == message["id"], error
    return error["code"]


async def strangers_get_unknown_id(stranger, request_id: str) -> None:
    for message in ({"type": "watch", "id": request_id, "after": -1}, {"type": "resume", "id": request_id, "after": -1},
                    {"type": "cancel", "id": request_id}):
        assert await refused(stranger, message) == "unknown_id", message


def with_cookie(cookie: str | None, more: str | None) -> str | None:
    return "; ".join(c for c in (cookie, more) if c) or None


@pytest.mark.app  # its apps are asked for by name (getfixturevalue), so conftest cannot tell its tier
@pytest.mark.parametrize("who", ["another voter cookie", "another address, no cookie"])
@pytest.mark.parametrize("workers", ["one worker", "two workers behind Caddy"])
async def test_another_visitor_cannot_watch_resume_cancel_or_take_over_a_reply(request, who, workers):
    """With two UI workers, the stranger also sends the owner's worker cookie, so that the front door
    takes both to the worker that holds the reply."""
    app_server = request.getfixturevalue("app_server" if workers == "one worker" else "front_door_app")
    request_id = f"r-{uuid.uuid4().hex[:8]}"
    if who == "another voter cookie":
        owner_cookie, stranger_cookie, stranger_address = await voter_cookie(app_server), await voter_cookie(app_server), "127.0.0.1"
    else:
        owner_cookie, stranger_cookie, stranger_address = None, None, "127.0.0.2"
    if workers != "one worker":
        from chat.front_door import COOKIE as WORKER_COOKIE
        from chat.front_door import worker_cookie
        from tests.test_workers import front_door

        secret, ports = front_door(app_server)
        pin = f"{WORKER_COOKIE}={worker_cookie(secret, ports[1])}"
        owner_cookie, stranger_cookie = with_cookie(owner_cookie, pin), with_cookie(stranger_cookie, pin)
    async with socket(app_server, owner_cookie) as owner:
        await owner.send(chat(request_id, LONG, sampling={"max_tokens": 120}))
        mine = await first_delta(owner, request_id)
        async with socket(app_server, stranger_cookie, stranger_address) as stranger:
            await strangers_get_unknown_id(stranger, request_id)
            # The same id is free for the stranger: a reply of their own, which they may cancel,
            # and neither touches the owner's.
            await stranger.send(chat(request_id, LONG, sampling={"max_tokens": 1000}))  # cancelled long before its end
            await first_delta(stranger, request_id)
            await stranger.send(json.dumps({"type": "cancel", "id": request_id}))
            theirs = await events_of(stranger, request_id)
            assert theirs[-1] == {"type": "done", "id": request_id, "finish": "stopped_by_user"}, theirs[-1]
        mine += await events_of(owner, request_id)
    assert mine[-1]["finish"] == "max_tokens" and mine[-2]["stats"]["generated_tokens"] == 120, mine[-2:]
    # The owner's resume reads the owner's reply, whole, from any socket of theirs.
    async with socket(app_server, owner_cookie) as again:
        await again.send(json.dumps({"type": "resume", "id": request_id, "after": -1}))
        resumed = await events_of(again, request_id)
    assert "".join(e["text"] for e in deltas(resumed)) == "".join(e["text"] for e in deltas(mine))
    assert resumed[-1]["finish"] == "max_tokens"
    async with socket(app_server, stranger_cookie, stranger_address) as stranger:  # theirs, as they left it
        await stranger.send(json.dumps({"type": "resume", "id": request_id, "after": -1}))
        assert (await events_of(stranger, request_id))[-1]["finish"] == "stopped_by_user"
    assert await idle(app_server) == IDLE


async def test_the_voter_cookie_makes_the_visitor_from_any_address_and_a_forged_one_does_not(app_server):
    """A client that keeps its voter cookie resumes from another address; a cookie with the owner's
    voter id and a signature the server never made is no one's: the stranger is their address."""
    cookie = await voter_cookie(app_server)
    request_id = f"r-{uuid.uuid4().hex[:8]}"
    async with socket(app_server, cookie) as owner:
        await owner.send(chat(request_id, LONG, sampling={"max_tokens": 60}))
        await first_delta(owner, request_id)
        value = cookie.split("=", 1)[1]
        voter, _, signature = value.rpartition(".")
        for forged in ("0" * len(signature), "é" * len(signature)):  # not ASCII: no traceback either
            async with socket(app_server, f"{COOKIE}={voter}.{forged}", "127.0.0.3") as forger:
                await strangers_get_unknown_id(forger, request_id)
        async with socket(app_server, cookie, "127.0.0.3") as elsewhere:
            await elsewhere.send(json.dumps({"type": "watch", "id": request_id, "after": -1}))
            watched = await events_of(elsewhere, request_id)
        mine = await events_of(owner, request_id)
    assert watched[-1] == mine[-1] and watched[-1]["finish"] == "max_tokens"
    assert await idle(app_server) == IDLE


# --- the page's own path ----------------------------------------------------------------------


async def page_turn(app) -> tuple[dict, dict[str, int], list[Any]]:
    """The Chat tab's typed turn: its event, its inputs' positions by elem_id, and their values as
    the page first shows them."""
    page = await config(app.url)
    turn = next(d for d in page["dependencies"] if "chatLive.begin" in (d.get("js") or ""))
    props = {c["id"]: c["props"] for c in page["components"]}
    by_name = {props[i].get("elem_id"): n for n, i in enumerate(turn["inputs"])}
    return turn, by_name, [props[i].get("value") for i in turn["inputs"]]


async def run_turn(app, cookie: str, turn: dict, data: list[Any]) -> dict:
    """Run the turn through Gradio's queue as a page with `cookie` does; the message that ended it."""
    session = uuid.uuid4().hex
    async with httpx.AsyncClient(timeout=90, headers={"Cookie": cookie}) as http:
        joined = await http.post(app.url + "gradio_api/queue/join", content=join_body(turn, session, json.dumps(data)),
                                 headers={"Content-Type": "application/json"})
        assert joined.status_code == 200, joined.text
        event_id = joined.json()["event_id"]
        return (await read_events(http, app.url, session, {event_id}))[event_id]


async def test_a_page_s_begun_reply_is_followed_by_its_own_turn_and_only_by_its_visitor(app_server):
    """What the page does for a typed message (chat/ui/live.js `begin`, chat/live.py `turn_reply`), with
    its cookie on both connections: its turn follows the reply the socket started, starting none. A
    stranger's turn that names the same id writes a reply of its own and leaves the page's alone, and
    no stranger can watch it."""
    page, stranger = await voter_cookie(app_server), await voter_cookie(app_server)
    turn, by_name, data = await page_turn(app_server)
    log_id = f"live-{secrets.token_hex(16)}"
    data[by_name["message"]], data[by_name["chatbot"]], data[by_name["began"]] = "Write a long story about a dragon.", [], log_id
    data[by_name["knob-max_tokens"]], data[by_name["knob-temperature"]] = 60, 0.0
    knobs = {name.removeprefix("knob-"): data[n] for name, n in by_name.items() if name and name.startswith("knob-")}
    started = {by: replies_started(app_server, by) for by in ("page", "turn")}
    async with socket(app_server, page) as ws:
        await ws.send(json.dumps({"type": "begin", "id": log_id, "message": data[by_name["message"]], "history": [],
                                  "preset": data[by_name["preset"]], "system_prompt": data[by_name["system-prompt"]],
                                  "sampling": knobs}))
        await first_delta(ws, log_id)
        ended = await run_turn(app_server, stranger, turn, data)  # a stranger's turn, naming the page's id
        assert ended.get("success"), ended
        assert {by: replies_started(app_server, by) for by in started} == {"page": started["page"] + 1, "turn": started["turn"] + 1}
        async with socket(app_server, None, "127.0.0.2") as other:  # (the stranger's turn took the id in their own name)
            assert await refused(other, {"type": "watch", "id": log_id, "after": -1}) == "unknown_id"
        ended = await run_turn(app_server, page, turn, data)  # the page's own
        assert ended.get("success"), ended
        assert replies_started(app_server, "turn") == started["turn"] + 1, "the page's turn followed its reply, starting none"
        followed = await events_of(ws, log_id)
    assert followed[-1]["type"] == "done" and deltas(followed)
    assert await idle(app_server) == IDLE
