"""Strangers at the front door: two UI workers behind Caddy, reached from this machine's non-loopback
address as a visitor on another machine (conftest's `front_door_app`, on the stand-in engine).

Vote stuffing through the page and the API, held to the limits counted for the whole app; a
smuggled connection that would pass as this machine; pipelined, oversized and slow requests and a
thousand idle connections; Gradio's documented two-step call with curl, twenty at once. The
hostile-input sweeps against the same app are tests/test_hostile.py's; the several-worker tests
on the real engine (shared cores, unloading, killed workers and cores) are tests/test_workers.py's.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest

from chat.admin import NOT_ADMIN
from chat.shedding import front_door_warning
from chat.stats import REPLIED
from chat.voters import COOKIE as VOTER_COOKIE
from chat.votes import TOO_MANY_FROM_ADDRESS, TOO_MANY_FROM_VOTER, VOTES_PER_ADDRESS, VOTES_PER_VOTER
from tests.conftest import PROBLEM_LINE, api_client, public_address, stranger_url
from tests.test_stop import quiet
from tests.test_workers import chat

CREATIVE, DETERMINISTIC = "SmolLM2 135M (CPU)", "SmolLM2 135M (CPU, deterministic)"


# --- one visitor, one share of the engine (first: an async test fails after the module's browser test) --


async def test_one_address_s_sockets_on_both_workers_get_one_visitor_s_share(front_door_app):
    """A stranger's sockets on both workers (each pinned by its worker cookie, no voter cookie) ask for
    more long replies than one visitor's share (--replies-per-visitor, 16): the share counts across
    the workers, each reply beyond it gets one sentence, another visitor is served meanwhile, and the
    stranger's replies end within seconds once their sockets have gone (nobody follows them)."""
    import asyncio

    import websockets

    from chat.client import websocket_url
    from chat.front_door import COOKIE, worker_cookie
    from tests.test_api import chat as chat_message
    from tests.test_reply_owners import first_delta
    from tests.test_workers import front_door

    share, asked = 16, 20
    secret, ports = front_door(front_door_app)
    url = websocket_url(front_door_app.url)
    sockets = [await websockets.connect(url, local_addr=("127.0.0.2", 0),
                                        additional_headers={"Cookie": f"{COOKIE}={worker_cookie(secret, ports[i % 2])}"})
               for i in range(4)]
    try:
        for n in range(asked):
            await sockets[n % 4].send(chat_message(f"s{n}", "Write a long story.", sampling={"max_tokens": 1000}))

        async def outcome(ws, ids: set[str]) -> list[str]:
            """Each id's first event other than progress: 'delta' or the error's code."""
            seen: dict[str, str] = {}
            async with asyncio.timeout(60):
                while len(seen) < len(ids):
                    event = json.loads(await ws.recv())
                    if event.get("id") in ids and event["id"] not in seen and event["type"] in ("delta", "error"):
                        seen[event["id"]] = event["type"] if event["type"] == "delta" else event["code"]
            return list(seen.values())

        found = await asyncio.gather(*(outcome(ws, {f"s{n}" for n in range(i, asked, 4)}) for i, ws in enumerate(sockets)))
        flat = [o for some in found for o in some]
        assert flat.count("delta") == share and flat.count("too_many_replies") == asked - share, found
        async with websockets.connect(url, local_addr=("127.0.0.3", 0)) as other:
            await other.send(chat_message("other", "Say a single word."))
            assert (await first_delta(other, "other"))[-1]["type"] == "delta"
    finally:
        for ws in sockets:
            await ws.close()
    # Their replies run on, to be resumed, for the app's --resume-grace-s (5 s here), then end.
    status = await asyncio.to_thread(front_door_app.wait_idle, 30)
    assert all(not (e["running"] or e["waiting"] or e["unfinished"] or e["streams"]) for e in status["engines"]), status


# --- votes: one visitor, one voice (the page's test first: the next one spends the address's hour) --


def fresh_voter_cookie(url: str) -> str:
    """A new voter cookie, as a client that drops its cookies gets with its next answer."""
    with urllib.request.urlopen(url + "livez", timeout=10) as response:
        cookies = response.headers.get_all("Set-Cookie") or []
    return next(c.split(";")[0].split("=", 1)[1] for c in cookies if c.startswith(f"{VOTER_COOKIE}="))


@pytest.mark.browser
def test_a_visitor_in_a_page_gets_twenty_votes_an_hour(browser, front_door_app):
    from tests.test_browser_compare import set_number, watch_columns

    context = browser.new_context(viewport={"width": 1280, "height": 900})
    try:  # closed however it ends: its page would hold connections from the stranger's address (the flood test counts them)
        page = context.new_page()
        page.set_default_timeout(60_000)
        page.goto(stranger_url(front_door_app))
        # A worker's page ends the loop of Gradio's page-loading indicator as one app's does (chat/ui/status_timers.js).
        assert page.evaluate("window.requestAnimationFrame.name") == "askForFrame"
        page.get_by_role("tab", name="Compare").click()
        page.locator("#compare-prompt textarea").wait_for()
        page.locator("#compare-heading-1").wait_for(state="visible")  # both presets picked, as the tab starts
        page.locator("#compare-blind input").check()
        page.locator("#compare-settings").get_by_text("Settings per preset").click()
        set_number(page, "#compare-knob-0-max_tokens input[type=number]", "2")
        # All but the last of the hour's votes as the same visitor (the page's voter cookie) through the
        # API, which is quicker than the page; the page then casts the last one and is refused the next.
        # Four at once, each its own session with the page's cookie, as four tabs of one visitor.
        voter = next(c["value"] for c in context.cookies() if c["name"] == VOTER_COOKIE)
        settings = {"max_tokens": 2, "temperature": 0.0}

        def votes(first: int) -> list[bool]:
            api = api_client(stranger_url(front_door_app), cookies={VOTER_COOKIE: voter})
            cast = []
            for i in range(first, VOTES_PER_VOTER - 1, 4):
                api.predict([CREATIVE, DETERMINISTIC], True, f"Say the letter {i}.", [settings, settings], api_name="/compare")
                cast.append(api.predict("A", None, api_name="/vote")["ok"])
            return cast

        with ThreadPoolExecutor(4) as pool:
            cast = [ok for some in pool.map(votes, range(4)) for ok in some]
        assert len(cast) == VOTES_PER_VOTER - 1 and all(cast), cast
        said = []
        for i in range(2):
            if i:
                page.locator("#compare-new").click()
                page.wait_for_function("document.querySelector('#compare-chat-0 .bot-row') === null")
            page.locator("#compare-prompt textarea").fill(f"Say the number {i}.")
            page.locator("#compare-prompt textarea").press("Enter")
            watch_columns(page, done="Stats are shown after you vote")
            page.locator("#compare-vote-0").click()
            page.wait_for_function("/You voted|votes in the last hour|from your network/.test("
                                   "document.querySelector('#compare-status')?.innerText)")
            said.append(page.locator("#compare-status").inner_text())
    finally:
        context.close()
    assert "You voted" in said[0], said
    assert TOO_MANY_FROM_VOTER in said[1], said


def test_a_stranger_replaying_votes_through_the_api_is_held_to_the_limits(front_door_app):
    """Each vote with a cookie the client dropped and a new session: a new voter every time, but
    one address; the Leaderboard moves by at most what one address may cast in an hour."""
    url = stranger_url(front_door_app)
    board = api_client(front_door_app.url)  # from this machine: reading the leaderboard
    before = board.predict(True, api_name="/leaderboard")["votes_stored"]
    settings = {"max_tokens": 2, "temperature": 0.0}
    attackers = 6  # at once, as an attacker would (and the limit is counted where votes are stored)
    tries = VOTES_PER_ADDRESS + attackers  # past the address's hour whatever this address cast before

    def replay(first: int) -> list[dict]:
        client = api_client(url)
        outcomes = []
        for i in range(first, tries, attackers):
            client.cookies[VOTER_COOKIE] = fresh_voter_cookie(url)
            client.reset_session()
            client.predict([CREATIVE, DETERMINISTIC], True, f"Say the number {i}.", [settings, settings], api_name="/compare")
            outcomes.append(client.predict("A", None, api_name="/vote"))
        return outcomes

    with ThreadPoolExecutor(attackers) as pool:
        outcomes = [o for some in pool.map(replay, range(attackers)) for o in some]
    accepted = [o for o in outcomes if o["ok"]]
    after = board.predict(True, api_name="/leaderboard")
    assert len(outcomes) == tries and after["votes_stored"] - before == len(accepted) <= VOTES_PER_ADDRESS
    assert {o["error"] for o in outcomes if not o["ok"]} == {TOO_MANY_FROM_ADDRESS}
    assert after["voters"] >= len(accepted), "each dropped cookie was a new voter, and the board counts them"


# --- requests at the front door ----------------------------------------------------------------


def raw(host: str, port: int, data: bytes, read_s: float = 10, one_answer: bool = False) -> bytes:
    """What the server sent back on one connection until it closed it or sent nothing for `read_s`;
    with `one_answer`, until one whole answer with a Content-Length came (a kept-alive connection
    otherwise idles until `read_s`)."""
    with socket.create_connection((host, port), timeout=read_s) as s:
        s.sendall(data)
        received = b""
        try:
            while chunk := s.recv(65536):
                received += chunk
                if one_answer and answer_complete(received):
                    break
        except (TimeoutError, ConnectionResetError):
            pass
        return received


def answer_complete(received: bytes) -> bool:
    head, separator, body = received.partition(b"\r\n\r\n")
    length = re.search(rb"(?im)^content-length:\s*(\d+)\s*$", head)
    return bool(separator and length and len(body) >= int(length[1]))


def test_a_stranger_cannot_pass_as_this_machine_through_a_smuggled_connection(front_door_app):
    port = int(front_door_app.url.rsplit(":", 1)[1].strip("/"))
    stranger = public_address()
    assert not stranger.startswith("127."), "the machine needs an address other than loopback for this test"
    call = b'{"data": []}'

    def stop_capacity(host: str, hostile: bool) -> str:
        extra = b"Connection: keep-alive, noupgrade\r\nUpgrade: x\r\nX-Forwarded-For: 127.0.0.1\r\n" if hostile else b""
        head = (b"POST /gradio_api/call/capacity_stop HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + extra + b"Content-Length: %d\r\n\r\n" % len(call) + call)
        answer = raw(host, port, head, read_s=30, one_answer=True)
        event = re.search(rb'"event_id":\s*"(\w+)"', answer)[1].decode()
        follow = (b"GET /gradio_api/call/capacity_stop/%s HTTP/1.1\r\nHost: x\r\n" % event.encode() + extra
                  + b"Connection: close\r\n\r\n")
        return raw(host, port, follow, read_s=15).decode(errors="replace")

    assert "No capacity test is running" in stop_capacity("127.0.0.1", hostile=False)
    assert NOT_ADMIN in stop_capacity(stranger, hostile=True)
    assert NOT_ADMIN in stop_capacity(stranger, hostile=False)


def test_pipelined_and_oversized_requests_get_answers(front_door_app):
    port = int(front_door_app.url.rsplit(":", 1)[1].strip("/"))
    pipelined = raw("127.0.0.1", port, b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\nGET /livez HTTP/1.1\r\nHost: x\r\n"
                                       b"Connection: close\r\n\r\n")
    assert pipelined.count(b"HTTP/1.1 200") == 2, pipelined
    # Above the front door's limit (32 KB, and Go reads 4 KB more before it refuses).
    huge = raw("127.0.0.1", port, b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40_000 + b"\r\n\r\n")
    assert huge.startswith(b"HTTP/1.1 431"), huge[:200]


def test_a_slow_head_and_a_stalled_body_are_cut_off_and_idle_connections_do_not_take_the_service_down(front_door_app):
    import resource

    from chat.front_door import IDLE_TIMEOUT_S, REQUEST_READ_S

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096 <= hard or soft < hard < 4096:  # room for this test's own 1,100 sockets
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    port = int(front_door_app.url.rsplit(":", 1)[1].strip("/"))
    began = time.monotonic()
    stalled = socket.create_connection(("127.0.0.1", port), timeout=REQUEST_READ_S + IDLE_TIMEOUT_S + 10)
    stalled.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
                    b"Content-Length: 500000\r\n\r\n--b\r\n")
    slow = socket.create_connection(("127.0.0.1", port))
    slow.sendall(b"GET / HTTP/1.1\r\n")
    closed = threading.Event()

    def trickle() -> None:
        try:
            while not closed.is_set():
                slow.sendall(b"X")
                time.sleep(1)
        except OSError:
            closed.set()

    threading.Thread(target=trickle, daemon=True).start()
    idle = [socket.create_connection(("127.0.0.1", port)) for _ in range(1100)]
    try:
        status, _ = front_door_app.health()
        assert status == 200
        assert chat(api_client(front_door_app.url), "Say hi.", CREATIVE)
        assert closed.wait(60), "a header sent one byte a second was never cut off"
        # The worker's 408 at its 10 s, passed on at once, and the connection closed (Go's server held
        # it until Caddy's read limit, 20 s, then kept the connection 30 s more).
        answer = b""
        while chunk := stalled.recv(4096):
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 408 ") and time.monotonic() - began < REQUEST_READ_S + 5, answer[:200]
    finally:
        for s in idle:
            s.close()
        slow.close()
        stalled.close()
    assert "Too many open files" not in front_door_app.log_path.read_text(errors="replace")


def test_a_stranger_going_away_mid_upload_moves_no_visitor_to_another_worker(front_door_app):
    """Caddy's passive check took a worker out of the rotation for 5 s at one failed round trip, and
    it could count a client that went away mid-upload as one: the worker answers the abandoned request
    (400, `body_not_received` in chat/ui/gradio_errors.py), but Caddy's round trip may end on the
    client's missing body first: by Caddy 2.11.7's admin API (`/reverse_proxy/upstreams`) in front of
    two workers on the stand-in engine, in 6 of 10 uploads closed as soon as their head was sent, 1-2
    of 10 closed 0.01-1 s later. Every visitor on that worker, by cookie or by address, then went to
    the other, where their sessions do not exist: the passive check is off (chat/front_door.py). A visitor's worker is the `chat_worker` cookie Caddy sets (an HMAC of the
    worker's address) where a request came without a valid one."""
    from chat.front_door import COOKIE

    port = int(front_door_app.url.rsplit(":", 1)[1].strip("/"))
    stranger = public_address()

    def cookie_set(host: str, cookie: str = "") -> str:
        """The worker cookie Caddy set on the answer to one request to a route routed by address, "" if none."""
        sent = f"Cookie: {COOKIE}={cookie}\r\n" if cookie else ""
        answer = raw(host, port, f"GET /gradio_api/upload HTTP/1.1\r\nHost: x\r\n{sent}Connection: close\r\n\r\n".encode())
        assert answer.startswith(b"HTTP/1.1 "), answer[:200]
        found = re.search(rf"(?im)^set-cookie:\s*{COOKIE}=(\w+)".encode(), answer)
        return found[1].decode() if found else ""

    strangers_worker = cookie_set(stranger)
    assert strangers_worker and cookie_set(stranger) == strangers_worker, "one address, one worker"
    for _ in range(10):  # each closed as soon as its head is sent: Caddy counted 6 of 10 such as a failure
        with socket.create_connection((stranger, port), source_address=(stranger, 0)) as upload:
            upload.sendall(b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; "
                           b"boundary=b\r\nContent-Length: 500000\r\n\r\n--b\r\n")
    for _ in range(10):  # for a second after: the stranger's address and a visitor's cookie keep their worker
        assert cookie_set(stranger) == strangers_worker, "the stranger's worker was taken out of the rotation"
        assert cookie_set("127.0.0.1", strangers_worker) == "", "a visitor on that worker was sent to another"
        time.sleep(0.1)
    quiet(front_door_app, for_s=2.0)  # the uploads' INFO lines are in the log before the next test counts its own


def test_a_thousand_stalled_uploads_and_1100_idle_connections_from_a_stranger_leave_healthz_quick(front_door_app):
    """From the stranger's address, 1,000 uploads that stop after a few bytes of a body they declared
    (an allowed size) and 1,100 kept-alive connections that went quiet after one answer, held through
    Caddy to the workers (the app started under a soft limit of 1,024 open files: conftest), while
    /healthz is asked from another address; then the stranger goes, and each upload gone mid-body is
    one INFO line in the app's log. Left alone, the uploads get 408 at 10 s and the idle connections
    are closed at 30 s (docs/operating.md; the slow-head test above waits for one upload's)."""
    import resource
    import statistics

    from tests.test_shedding import log_since
    from tests.test_workers import descendants, front_door

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 4096, f"this test holds 2,100 sockets: a hard limit of {hard} open files is too low"
    # The app started with this hard limit: where one address could fill it, its log said so once.
    assert "1,024" in (front_door_warning(1024) or "") and front_door_warning(1 << 20) is None
    assert front_door_warning(resource.RLIM_INFINITY) is None
    warned = [line for line in front_door_app.log_path.read_text(errors="replace").splitlines()
              if "hard limit on open files" in line]
    expected = front_door_warning(hard)
    assert len(warned) == (expected is not None) and all(" WARNING " in line and line.endswith(expected) for line in warned), warned
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, hard))
    port = int(front_door_app.url.rsplit(":", 1)[1].strip("/"))
    stranger, (_, workers) = public_address(), front_door(front_door_app)
    caddy = next(p for p in descendants(front_door_app) if p.name() == "caddy")
    start = front_door_app.log_path.stat().st_size
    gone_mid_body = re.compile(r" INFO .*(went away before its request's body|whose body had not arrived).*/gradio_api/upload")
    upload = (b"POST /gradio_api/upload HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=b\r\n"
              b"Content-Length: 500000\r\n\r\n--b\r\n")  # under Gradio's 1 MB
    idle_ask = b"GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"

    def held() -> tuple[int, int]:
        """Caddy's open connections: the stranger's, and to the workers (Go listens on IPv6's `::` too)."""
        ends = [c for c in caddy.net_connections("tcp") if c.status == psutil.CONN_ESTABLISHED and c.raddr]
        return (sum(1 for c in ends if c.raddr.ip.removeprefix("::ffff:") == stranger and c.laddr.port == port),
                sum(1 for c in ends if c.raddr.port in workers))

    def until(condition, within_s: float, what) -> None:
        deadline = time.monotonic() + within_s
        while not condition():
            assert time.monotonic() < deadline, what()
            time.sleep(0.05)

    def asked_s(to_port: int, path: str) -> float:
        """How long another visitor (127.0.0.3) waited for the status line of a 200."""
        began = time.monotonic()
        with socket.create_connection(("127.0.0.1", to_port), timeout=5, source_address=("127.0.0.3", 0)) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            assert s.recv(64).startswith(b"HTTP/1.1 200 "), f"{path} on port {to_port}"
        return time.monotonic() - began

    stalled: list[socket.socket] = []
    idle: list[socket.socket] = []
    try:
        # The idle connections first, the uploads last: an upload is ended 10 s after its head, an idle
        # connection 30 s after its answer, and answering 1,100 asks took more than 10 s in full runs on
        # the 2-core EPYC (the uploads, opened first, had all been ended before the count below).
        for _ in range(1100):
            idle.append(socket.create_connection((stranger, port), timeout=30, source_address=(stranger, 0)))
            idle[-1].sendall(idle_ask)
        for s in idle:  # each answered once, then quiet and kept alive
            answer = b""
            while not answer_complete(answer):
                answer += (chunk := s.recv(4096))
                assert chunk, f"closed before its answer: {answer[:200]!r}"
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]
        for _ in range(1000):
            stalled.append(socket.create_connection((stranger, port), timeout=30, source_address=(stranger, 0)))
            stalled[-1].sendall(upload)
        until(lambda: (counts := held())[0] >= 2100 and counts[1] >= 1000, 30,
              lambda: f"Caddy never held the stranger's 2,100 connections and the uploads' 1,000 to the workers: {held()}")
        # Each answered (the flood once took it down for 45 s), most within 100 ms. Not each within 1 s:
        # Caddy sends /healthz to a worker that may be the one reading the uploads' 1,000 heads (below),
        # and one of twenty took 1.4 s in a full run on the 2-core EPYC (CI, 3a28744).
        asked = [asked_s(port, "/healthz") for _ in range(20)]
        assert max(asked) < 5 and statistics.median(asked) < 0.1, [round(a, 3) for a in asked]
        # Caddy sends nobody to a worker that stops answering, so ask each directly: neither ran out of
        # descriptors (the uploads all went to one, by the stranger's address). An answer, not a quick
        # one: that worker is still reading the uploads' 1,000 heads, just sent (over 1 s, 2 in 3 runs).
        assert all(asked_s(worker, "/livez") < 5 for worker in workers)
    finally:
        for s in stalled + idle:
            s.close()
    until(lambda: held()[0] == 0, 30, lambda: f"Caddy still holds the stranger's connections: {held()}")
    until(lambda: len(gone_mid_body.findall(log_since(front_door_app, start))) >= 1000, 30,
          lambda: "not every upload gone mid-body was logged: " + log_since(front_door_app, start)[-2000:])
    lines = log_since(front_door_app, start).splitlines()
    assert len([line for line in lines if gone_mid_body.search(line)]) == 1000
    assert not [line for line in lines if PROBLEM_LINE.search(line)], lines[:40]
    # The next tests share these workers: leave them as found. A full run's next test (twenty curl
    # calls, routed by address) once had a call's second step reach the other worker while this
    # flood's ends were still being logged (then Caddy's passive check was on: the test above).
    quiet(front_door_app, for_s=6.0)


def test_twenty_curl_two_step_calls_through_the_front_door_are_all_answered(front_door_app):
    def two_steps(i: int) -> str:
        # Gradio's documented call: every input of the Chat tab's event, in order (docs/api.md, "the Gradio API").
        body = json.dumps({"data": [f"Say the number {i}.", CREATIVE, "You are brief.", 0.0, 0.9, 0, 12, 1.1, -1]})
        posted = subprocess.run(["curl", "-sS", "-X", "POST", front_door_app.url + "gradio_api/call/chat",
                                 "-H", "Content-Type: application/json", "-d", body],
                                capture_output=True, text=True, timeout=60, check=True)
        event = json.loads(posted.stdout)["event_id"]
        got = subprocess.run(["curl", "-sS", "-N", front_door_app.url + f"gradio_api/call/chat/{event}"],
                             capture_output=True, text=True, timeout=120, check=True)
        return got.stdout

    with ThreadPoolExecutor(10) as pool:
        answers = list(pool.map(two_steps, range(20)))
    for answer in answers:
        assert "event: complete" in answer and REPLIED in answer, answer[-400:]
