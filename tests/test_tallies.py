"""The app-wide counts (chat/tallies.py) and what is counted with them: failed sign-ins by address and
user name (chat/auth.py), through the login form's middleware as Gradio's page sends it."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from typing import Any

import pytest
from starlette.requests import HTTPConnection

from chat.auth import MAX_FAILURES, TOO_MANY, TOO_MANY_FOR_USER, FailedLogins, Login, LoginLimit
from chat.tallies import InProcess, Tallies

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_held_things_stop_at_the_limit_and_a_gone_holder_gives_back_what_it_held():
    tallies = Tallies()
    assert [tallies.hold("v", 3, holder="w1") for _ in range(3)] == [0, 1, 2]
    assert tallies.hold("v", 3, holder="w2") is None and tallies.held("v") == 3  # refused, nothing counted
    tallies.release("v", holder="w1")
    assert tallies.hold("v", 3, holder="w2") == 2
    assert tallies.drop_holder("w1") == 2 and tallies.held("v") == 1  # w1's two, not w2's one
    tallies.release("v", holder="w1")  # nothing left of w1's: no count below zero
    assert tallies.held("v") == 1
    tallies.release("v", holder="w2")
    assert tallies.held("v") == 0 and not tallies._held  # nothing kept for a key with nothing held
    assert tallies.hold("x", 0) == 0 and tallies.hold("x", 0) == 1  # 0: no limit


def test_events_are_counted_within_their_window_only():
    clock = Clock()
    tallies = Tallies(clock)
    assert [tallies.add("a", 60) for _ in range(3)] == [1, 2, 3]
    clock.now += 30
    assert tallies.add("a", 60) == 4
    clock.now += 31  # the first three are over a minute old
    assert tallies.recent("a", 60) == 1
    clock.now += 60
    assert tallies.recent("a", 60) == 0 and "a" not in tallies._events


async def test_failed_sign_ins_count_an_ipv6_network_as_one_address_and_a_known_name_from_anywhere():
    failures = FailedLogins(InProcess(), users=frozenset({"demo"}), per_address=3, per_user=5)
    for host in ("2001:db8:1:2::1", "2001:db8:1:2::ffff", "2001:db8:1:2:aaaa::7"):  # one /64
        assert await failures.refusal(host, "demo") is None
        await failures.failed(host, "demo")
    assert await failures.refusal("2001:db8:1:2::99", "someone") == TOO_MANY
    assert await failures.refusal("2001:db8:1:3::1", "someone") is None  # the next /64 is another address
    for host in ("192.0.2.1", "192.0.2.2"):
        await failures.failed(host, "demo")
    # Five for "demo" from three addresses: that name is refused from a fresh address, others are not.
    assert await failures.refusal("198.51.100.7", "demo") == TOO_MANY_FOR_USER
    assert await failures.refusal("198.51.100.7", "other") is None
    for n in range(20):  # made-up names are not kept: they would pile up in memory
        await failures.failed(f"198.51.100.{n + 10}", f"made-up-{n}")
    assert not any(key.startswith("login-user:made-up") for key in failures.tallies.tallies._events)  # type: ignore[attr-defined]


def basic(user: str, password: str) -> HTTPConnection:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return HTTPConnection({"type": "http", "headers": [(b"authorization", f"Basic {token}".encode())],
                           "client": ("203.0.113.5", 1234), "path": "/metrics"})


async def test_http_basic_credentials_are_refused_after_too_many_failures_even_when_right():
    login = Login.parse("demo:s3cret,admin:other")
    assert login is not None
    assert await login.allows(basic("demo", "s3cret"))
    for _ in range(MAX_FAILURES):
        assert not await login.allows(basic("demo", "wrong"))
    assert not await login.allows(basic("demo", "s3cret"))  # this address is locked out for a while


async def post_login(limit: LoginLimit, body: bytes, host: str, chunks: int = 1) -> tuple[int, Any, bytes]:
    """POST /login through the middleware, the body in `chunks` parts; (status, body, what the app read)."""
    parts = [body[len(body) * i // chunks:len(body) * (i + 1) // chunks] for i in range(chunks)]
    incoming = [{"type": "http.request", "body": p, "more_body": i < chunks - 1} for i, p in enumerate(parts)]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/login", "client": (host, 5555), "headers": []}
    await limit(scope, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    payload = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return start["status"], json.loads(payload or b"null"), read_by_app[-1] if read_by_app else b""


read_by_app: list[bytes] = []


async def gradio_like_login(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Reads the form as Gradio's /login does (the whole body), and answers 400 for wrong credentials."""
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    read_by_app.append(body)
    status = 200 if body == b"username=demo&password=s3cret" else 400
    await send({"type": "http.response.start", "status": status, "headers": []})
    await send({"type": "http.response.body", "body": json.dumps({"ok": status == 200}).encode()})


async def test_the_login_form_is_read_whole_by_the_page_and_counted_by_its_user_name():
    failures = FailedLogins(InProcess(), users=frozenset({"demo"}), per_address=100, per_user=3)
    limit = LoginLimit(gradio_like_login, failures=failures)
    right = b"username=demo&password=s3cret"
    assert (await post_login(limit, right, "192.0.2.1", chunks=3))[::2] == (200, right)  # replayed in full
    for n in range(3):
        status, _, read = await post_login(limit, b"username=demo&password=guess" + str(n).encode(), f"192.0.2.{n + 2}")
        assert status == 400 and read.endswith(str(n).encode())
    status, detail, _ = await post_login(limit, right, "192.0.2.50")  # a fresh address, the right password
    assert status == 429 and detail == {"detail": TOO_MANY_FOR_USER}
    status, _, _ = await post_login(limit, b"username=other&password=x", "192.0.2.50")
    assert status == 400  # another name is still tried


async def test_the_tallies_of_one_process_answer_without_waiting():
    tallies = InProcess()
    assert await asyncio.wait_for(tallies.hold("k", 1), 0.5) == 0
    assert await tallies.hold("k", 1) is None
    tallies.release("k")
    assert await tallies.hold("k", 1) == 0


def test_keys_of_events_nobody_asks_about_again_are_forgotten():
    from chat.tallies import SWEEP_EVERY

    clock = Clock()
    tallies = Tallies(clock)
    for n in range(SWEEP_EVERY - 1):
        tallies.add(f"address:{n}", 60)
    clock.now += 61
    tallies.add("fresh", 60)  # the sweep's turn
    assert list(tallies._events) == ["fresh"]


def test_slots_wait_in_one_line_first_come_first_served():
    """`enter`: a slot now, or a place in line that a release hands the next slot to; a full line
    refuses; a place given up, or the slot handed to it meanwhile, goes to the next."""
    tallies, admitted = Tallies(), []
    assert tallies.enter("slots", 1, 2, "w1", "a", lambda: admitted.append("a")) == 0
    assert tallies.enter("slots", 1, 2, "w2", "b", lambda: admitted.append("b")) == 1
    assert tallies.enter("slots", 1, 2, "w1", "c", lambda: admitted.append("c")) == 2
    assert tallies.enter("slots", 1, 2, "w2", "d", lambda: admitted.append("d")) is None  # the line is full
    tallies.leave("slots", "w1", "a")
    assert admitted == ["b"] and tallies.held("slots") == 1
    tallies.leave("slots", "w1", "c")  # gives up its place
    tallies.leave("slots", "w2", "b")
    assert admitted == ["b"] and tallies.held("slots") == 0
    assert tallies.enter("slots", 1, 2, "w1", "e", lambda: admitted.append("e")) == 0  # nobody in line: at once
    assert tallies.enter("slots", 1, 2, "w2", "f", lambda: admitted.append("f")) == 1
    assert tallies.drop_holder("w1") == 1  # its worker went: its slot goes to the one in line
    assert admitted == ["b", "f"] and tallies.held("slots") == 1
    tallies.leave("slots", "w2", "unknown")  # a ticket it never had changes nothing
    assert tallies.held("slots") == 1


async def test_in_process_slots_wait_and_a_cancelled_wait_leaves_the_line():
    slots, told = InProcess(), []
    first = await slots.enter("slots", 1, 4, lambda: told.append(1))
    assert first is not None and not told
    waiting = asyncio.get_running_loop().create_task(slots.enter("slots", 1, 4, lambda: told.append(2)))
    gone = asyncio.get_running_loop().create_task(slots.enter("slots", 1, 4, lambda: told.append(3)))
    await asyncio.sleep(0)
    assert told == [2, 3] and not waiting.done()
    gone.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await gone
    slots.leave("slots", first)
    second = await asyncio.wait_for(waiting, 1)
    assert second is not None and slots.tallies.held("slots") == 1
    slots.leave("slots", second)
    assert slots.tallies.held("slots") == 0 and not slots.tallies._lines
