"""Every hostile input gets one sentence and no traceback, on every endpoint the app exposes.

A sweep of malformed and hostile requests, sent over real HTTP and WebSocket connections to the
one-worker app and to two UI workers behind Caddy (both on the stand-in engine): every event of the page (found in its /config,
the lazily made tabs' events included, hidden ones too) through Gradio's queue and its direct
route, the named API routes, uploads, file paths, the /chat WebSocket, and the app's own routes.
What the door in front of the app decides (the queue's streams, uploads, odd requests, the
WebSocket) is swept on both apps, whose doors differ (Gradio's own server, or Caddy); the events' and
the named routes' inputs only on the two workers (`EVENTS`): a worker runs the same event code as the
one-worker app, behind the door that faces strangers (issue 47), and a sweep of several hundred
requests each was ~50 s of CPU more on the one worker to no end.
Each answer must be a clean 4xx with a short body, or a 200 whose errors are sentences; never a
500 or a traceback, and the app's log must stay free of tracebacks and ERROR lines.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import websockets

from bench.gradio_stream import IDLE_CONNECTION_S
from chat.client import websocket_url
from chat.history import text_of
from chat.stats import SUMMARY
from tests.conftest import (
    PROBLEM_LINE,
    USER,
    RunningApp,
    stranger_url,
)

pytestmark = pytest.mark.app

PRESET = "SmolLM2 135M (CPU)"
OK = re.compile(r"📊 " + SUMMARY.pattern)
STACK = re.compile(r'Traceback \(most recent call last\)|File "[^"]*", line \d+|Internal Server Error')
SENTENCE = re.compile(r"\S.{3,600}[.!?]", re.S)  # one or a few sentences, not a dump
SHORT = 2000  # characters in a 4xx body
AT_ONCE = 12  # requests in flight at once: enough to overlap, few enough for two cores
LIMITS = httpx.Limits(keepalive_expiry=IDLE_CONNECTION_S)  # idle connections dropped before the server drops them
JUNK = {"nested": [[{"deeper": [None, True, {"x": "y"}]}]], "n": -1}
HUGE = "h" * 300_000
# Raw JSON that encoders refuse to write: NaN, infinities, 1e400 (inf once parsed), lone surrogates.
RAW_VALUES = ["NaN", "Infinity", "-Infinity", "1e400", '"\\ud800 lone"', '"\\udfff"', "-0", "[]", "{}", "null"]


@dataclass
class Answer:
    what: str  # the request, for the failure message
    status: int
    text: str

    def problem(self) -> str | None:
        """Why this answer is not a plain one (None when it is)."""
        if self.status >= 500:
            return f"status {self.status}"
        if STACK.search(self.text):
            return "a traceback or a stack"
        if 400 <= self.status < 500 and len(self.text) > SHORT:
            return f"a {len(self.text):,}-character body for a {self.status}"
        return None


def problems(answers: list[Answer]) -> list[str]:
    return [f"{a.what}: {p} -> {a.status} {a.text[:300]!r}" for a in answers if (p := a.problem())]


def event_problem(message: dict[str, Any]) -> str | None:
    """A queue message that ends an event: its error, if any, must be a sentence."""
    text = json.dumps(message, ensure_ascii=False)
    if STACK.search(text):
        return "a traceback in the event's answer"
    if message.get("msg") == "unexpected_error":
        return f"an unexpected error: {message.get('message')!r}"
    if message.get("success") is False:
        error = (message.get("output") or {}).get("error")
        if not isinstance(error, str) or not SENTENCE.fullmatch(error.strip()):
            return f"an error that is not a sentence: {error!r}"
    return None


@pytest.fixture(params=["one worker", "two workers behind Caddy"])
def app(request, app_server) -> Iterator[RunningApp]:
    """The app under attack, on the stand-in engine: the shared app, or two UI workers behind Caddy
    (conftest's `front_door_app`) reached from this machine's non-loopback address, as a stranger on
    another machine.
    `app_server` is named so that conftest's `nothing_left_behind` checks its log after each test;
    for both apps the log is also checked here, and the app must still chat."""
    target = app_server if request.param == "one worker" else dataclasses.replace(
        request.getfixturevalue("front_door_app"), url=stranger_url(request.getfixturevalue("front_door_app")))
    start = target.log_path.stat().st_size
    yield target
    assert still_chats(target), "a normal /chat call failed after the sweep"
    assert not (problem := logged_problem(target, start)), "the app logged a problem:\n" + problem


# The event sweeps' app (the module's docstring says why only this one).
EVENTS = pytest.mark.parametrize("app", ["two workers behind Caddy"], indirect=True)


def logged_problem(app: RunningApp, start: int) -> str:
    """The app's log from byte `start` on, from its first traceback or ERROR line ("" if none)."""
    with open(app.log_path, errors="replace") as log:
        log.seek(start)
        lines = log.readlines()
    first = next((i for i, line in enumerate(lines) if PROBLEM_LINE.search(line)), None)
    return "" if first is None else "".join(lines[first:first + 40])


def still_chats(app: RunningApp) -> bool:
    body = {"data": ["Say OK.", PRESET, "", 0.0, 0.9, 0, 1, 1.0, 1]}
    event = httpx.post(app.url + "gradio_api/call/chat", json=body, timeout=30).json()["event_id"]
    with httpx.stream("GET", f"{app.url}gradio_api/call/chat/{event}", timeout=120) as response:
        lines = list(response.iter_lines())
    complete = [json.loads(b[5:]) for a, b in zip(lines, lines[1:], strict=False) if a == "event: complete"]
    return bool(complete) and bool(OK.fullmatch(complete[-1][0][-1]["metadata"]["title"]))


# --- sending ---------------------------------------------------------------------------------


async def send_all(url: str, requests: list[tuple[str, str, str, Any]], **options: Any) -> list[Answer]:
    """Send (label, method, path, body) concurrently; a body of bytes goes as it is, others as JSON."""
    gate = asyncio.Semaphore(AT_ONCE)

    async def one(http: httpx.AsyncClient, label: str, method: str, path: str, body: Any) -> Answer:
        headers = {"Content-Type": "application/json"} if body is not None and "files" not in options else {}
        content = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        async with gate:
            response = await http.request(method, url + path, content=content, headers=headers, timeout=60)
        return Answer(f"{label} ({method} /{path[:80]})", response.status_code, response.text)

    async with httpx.AsyncClient(limits=LIMITS, **options) as http:
        return list(await asyncio.gather(*(one(http, *r) for r in requests)))


async def read_events(http: httpx.AsyncClient, url: str, session: str, wanted: set[str]) -> dict[str, dict]:
    """The message that ended each of `wanted` events of a session, read from Gradio's event stream.
    A stream closed while they are still running (its close may be one left over from the session's
    last event) is opened again, as the page does; one the queue no longer holds ends the reading."""
    ended: dict[str, dict] = {}
    async with asyncio.timeout(90):
        while not wanted <= ended.keys():
            async with http.stream("GET", url + "gradio_api/queue/data", params={"session_hash": session}) as response:
                if response.status_code == 404:
                    break
                assert response.status_code == 200, await response.aread()
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    message = json.loads(line[5:])
                    if message.get("msg") in ("process_completed", "unexpected_error"):
                        ended[message.get("event_id") or "?"] = message
                    if message.get("msg") == "unexpected_error":
                        return ended
                    if wanted <= ended.keys() or message.get("msg") == "close_stream":
                        break
    return ended


async def run_events(url: str, session: str, bodies: list[tuple[str, bytes]], http: httpx.AsyncClient) -> list[str]:
    """Join the queue with each body in one session and read how its event ended; the problems.
    One event at a time, as a page's stream follows them: Gradio closes a session's stream once
    nothing of it is pending, and what ends after that, unread, is dropped with it."""
    found = []
    for label, body in bodies:
        response = await http.post(url + "gradio_api/queue/join", content=body, headers={"Content-Type": "application/json"})
        answer = Answer(f"{label} (join)", response.status_code, response.text)
        if (problem := answer.problem()) is not None:
            found.append(f"{answer.what}: {problem} -> {response.text[:300]!r}")
        elif response.status_code == 200:
            event_id = response.json()["event_id"]
            message = (await read_events(http, url, session, {event_id})).get(event_id)
            if problem := ("no answer" if message is None else event_problem(message)):
                found.append(f"{label}: {problem}")
    return found


def raw_list(items: list[str]) -> str:
    return "[" + ", ".join(items) + "]"


def payloads(dependency: dict) -> list[tuple[str, str]]:
    """(name, raw JSON list) of hostile inputs shaped for one event."""
    n = len(dependency.get("inputs", []))
    cycled = [RAW_VALUES[i % len(RAW_VALUES)] for i in range(max(n, 1))]
    return [
        ("no inputs", "[]"),
        ("too many inputs", json.dumps([None] * (n + 3))),
        ("nested junk", json.dumps([JUNK] * n)),
        ("NaN, infinities and surrogates", raw_list(cycled)),
        ("the same, shifted", raw_list(cycled[1:] + cycled[:1])),
        ("a huge value first", json.dumps([HUGE, *[None] * (n - 1)]) if n else json.dumps([HUGE])),
        ("strings everywhere", json.dumps(["\x00\u202e<script>x</script>"] * n)),
    ]


def join_body(dependency: dict, session: str, data: str, **fields: Any) -> bytes:
    targets = dependency.get("targets") or [[None]]
    extra = {"trigger_id": targets[0][0], "event_data": None, **fields}
    head = json.dumps({"fn_index": dependency["id"], "session_hash": session, **extra})
    return (head[:-1] + ', "data": ' + data + "}").encode()


async def config(url: str) -> dict:
    async with httpx.AsyncClient(limits=LIMITS) as http:
        response = await http.get(url + "config", timeout=30)
    response.raise_for_status()
    return response.json()


async def lazy_dependencies(url: str, dependencies: list[dict], http: httpx.AsyncClient) -> tuple[str, list[dict]]:
    """Open every lazily made tab in one session (its render event, called as the page calls it);
    the session and the events that only exist in it."""
    session = uuid.uuid4().hex
    renders = [d for d in dependencies if d.get("render_id") is not None]
    opened = {i for d in renders for i in d["inputs"]}  # each tab's "opened" state, set by selecting the tab
    openers = [d for d in dependencies if set(d.get("outputs", [])) & opened and d.get("render_id") is None]
    ended: dict[str, dict] = {}
    for step in (openers, renders):  # as the page: select the tabs, then make what they hold
        joined = []
        for d in step:
            body = join_body(d, session, "[]" if d in openers else "[true]")
            response = await http.post(url + "gradio_api/queue/join", content=body, headers={"Content-Type": "application/json"})
            joined.append(response.json()["event_id"])
        ended = await read_events(http, url, session, set(joined))
    made = [d for m in ended.values() for d in ((m.get("output") or {}).get("render_config") or {}).get("dependencies", [])]
    return session, made


# --- the sweeps ------------------------------------------------------------------------------


@EVENTS
async def test_every_event_of_the_page_answers_hostile_inputs_with_a_sentence(app):
    page = await config(app.url)
    dependencies = page["dependencies"]
    assert len(dependencies) >= 10, "the page's config lists its events"
    async with httpx.AsyncClient(limits=LIMITS, timeout=90) as http:
        lazy_session, lazy = await lazy_dependencies(app.url, dependencies, http)
        assert len(lazy) >= 5, "opening the lazily made tabs adds their events"
        gate = asyncio.Semaphore(AT_ONCE // 3)

        async def sweep(events: list[dict], session: str) -> list[str]:
            bodies = [(f"event {d['id']} {d.get('api_name') or ''}: {name}", join_body(d, session, data))
                      for d in events for name, data in payloads(d)]
            async with gate:
                return await run_events(app.url, session, bodies, http)

        found = await asyncio.gather(*(sweep([d], uuid.uuid4().hex) for d in dependencies),
                                     sweep(lazy, lazy_session))  # one reader per session
        # The direct route runs the events that skip the queue (and any other, as Gradio allows).
        direct = [(f"run/predict {d['id']}: {name}", "POST", "gradio_api/run/predict",
                   join_body(d, uuid.uuid4().hex, data)) for d in dependencies if not d.get("queue", True)
                  for name, data in payloads(d)]
        answers = await send_all(app.url, direct)
    sent = sum(len(payloads(d)) for d in [*dependencies, *lazy]) + len(direct)
    assert sent >= 60
    bad = [p for group in found for p in group] + problems(answers)
    assert not bad, f"{len(bad)} of {sent} answers were not plain:\n" + "\n".join(bad[:30])


# Values that pass one component's check and break what comes after it: an index where a list is
# read ("NaN"[-1] is a character, not a saved chat), a dict where a CheckboxGroup's list is sliced.
MIXED = ["-1", '"NaN"', "{}", "[[1]]", '{"index": -1}', "1e400", '[{"role": 1}]', "true"]


def mixed_payloads(dependency: dict) -> list[tuple[str, str]]:
    """(name, raw JSON list) of indices and text mixed, shaped for one event."""
    n = max(len(dependency.get("inputs", [])), 1)
    rotated = [("mixed, from " + MIXED[k], raw_list([MIXED[(k + i) % len(MIXED)] for i in range(n)])) for k in range(0, len(MIXED), 2)]
    return [("an index and text", '[-1, "NaN"]'), ("an index and a list", "[-1, [[1]]]"), *rotated]


@EVENTS
async def test_every_event_called_directly_answers_indices_and_text_mixed_with_a_sentence(app):
    """Gradio's direct route (`run/predict`) runs any event, queued or not, the lazily made tabs'
    too: the saved-chat loader given [-1, "NaN"] answered 500 and logged a traceback (Gradio's own
    check of the chat the loader made of the string), and Compare's preset picker given {} did."""
    from chat.ui.gradio_errors import BAD_INPUTS

    page = await config(app.url)
    async with httpx.AsyncClient(limits=LIMITS, timeout=90) as http:
        lazy_session, lazy = await lazy_dependencies(app.url, page["dependencies"], http)
        loader = next(d for d in page["dependencies"] if d.get("api_name") == "_load_conversation")
        response = await http.post(app.url + "gradio_api/run/predict", content=join_body(loader, uuid.uuid4().hex, '[-1, "NaN"]'),
                                   headers={"Content-Type": "application/json"})
    assert response.status_code == 422 and response.json()["error"] == BAD_INPUTS, response.text
    requests: list[tuple[str, str, str, Any]] = [
        (f"run/predict {d['id']} {d.get('api_name') or ''}: {name}", "POST", "gradio_api/run/predict", join_body(d, session, data))
        for events, session in ((page["dependencies"], uuid.uuid4().hex), (lazy, lazy_session))
        for d in events for name, data in mixed_payloads(d)]
    answers = await send_all(app.url, requests)
    assert len(answers) >= 300
    bad = problems(answers)
    assert not bad, f"{len(bad)} of {len(answers)} answers were not plain:\n" + "\n".join(bad[:30])


@EVENTS
async def test_a_typed_turn_saves_its_chat_over_saved_chats_that_are_junk(app):
    """A typed turn saves the chat in the update that ends it (chat/ui/chat_tab.py), into the saved
    chats the caller sent: anything but a list of chats is replaced by a list holding this chat,
    with no traceback (ChatInterface's own save would fail on a dict or a string)."""
    page = await config(app.url)
    turn = next(d for d in page["dependencies"] if "chatLive.begin" in (d.get("js") or ""))
    props = {c["id"]: c["props"] for c in page["components"]}
    by_name = {props[i].get("elem_id"): n for n, i in enumerate(turn["inputs"])}
    for junk in (JUNK, "not a list"):
        data: list[Any] = [props[i].get("value") for i in turn["inputs"]]
        data[by_name["message"]], data[by_name["chatbot"]], data[by_name["began"]] = "Say hi.", [], ""
        data[by_name["knob-max_tokens"]] = 2
        data[-1] = junk  # the saved chats, the turn's last input
        session = uuid.uuid4().hex
        async with httpx.AsyncClient(limits=LIMITS, timeout=90) as http:
            joined = await http.post(app.url + "gradio_api/queue/join", content=join_body(turn, session, json.dumps(data)),
                                     headers={"Content-Type": "application/json"})
            assert joined.status_code == 200, joined.text
            event_id = joined.json()["event_id"]
            ended = (await read_events(http, app.url, session, {event_id}))[event_id]
        assert ended.get("success") and not event_problem(ended), ended
        *_, saved, shown = ended["output"]["data"]
        assert isinstance(saved, list) and len(saved) == 1 and shown == {"index": 0}, (saved, shown)
        roles = [m["role"] for m in saved[0]]  # the reply, then its stats
        assert roles[0] == "user" and text_of(saved[0][0]["content"]) == "Say hi." and set(roles[1:]) == {"assistant"}, saved


async def test_the_queue_itself_refuses_forged_and_broken_requests_plainly(app):
    page = await config(app.url)
    chat = next(d for d in page["dependencies"] if d.get("api_name") == "chat")
    session = uuid.uuid4().hex
    good = json.loads(join_body(chat, session, json.dumps(["Hi", PRESET, "", 0, 0.9, 0, 1, 1.0, 1])))
    join, data, predict = "gradio_api/queue/join", "gradio_api/queue/data", "gradio_api/run/predict"
    requests: list[tuple[str, str, str, Any]] = [
        ("no session", "POST", join, {**good, "session_hash": None}),
        ("an unknown fn_index", "POST", join, {**good, "fn_index": 99999}),
        ("a negative fn_index", "POST", join, {**good, "fn_index": -1}),
        ("a huge fn_index", "POST", join, {**good, "fn_index": 10**30}),
        ("fn_index as text", "POST", join, {**good, "fn_index": "chat"}),
        ("a forged trigger_id", "POST", join, {**good, "trigger_id": 99999, "data": [None]}),
        ("trigger_id as a list", "POST", join, {**good, "trigger_id": [1]}),
        ("data as a string", "POST", join, {**good, "data": "Hi"}),
        ("data as an object", "POST", join, {**good, "data": {"message": "Hi"}}),
        ("data missing", "POST", join, {k: v for k, v in good.items() if k != "data"}),
        ("data a huge string", "POST", join, {**good, "data": HUGE}),
        ("session as a list", "POST", join, {**good, "session_hash": ["a"]}),
        ("batched junk", "POST", join, {**good, "batched": "yes", "data": [None]}),
        ("not JSON", "POST", join, b"{this is not json"),
        ("an empty body", "POST", join, b""),
        ("a JSON array", "POST", join, b"[1, 2, 3]"),
        ("NaN for fn_index", "POST", join, b'{"fn_index": NaN, "data": [], "session_hash": "x"}'),
        ("1e400 for fn_index", "POST", join, b'{"fn_index": 1e400, "data": [], "session_hash": "x"}'),
        ("bad UTF-8", "POST", join, b'{"fn_index": 0, "data": ["\xff\xfe"], "session_hash": "x"}'),
        ("deeply nested", "POST", join, b'{"data": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"),
        ("predict an unknown fn_index", "POST", predict, {**good, "fn_index": 99999}),
        ("predict an unknown api name", "POST", "gradio_api/run/no_such_api", {"data": []}),
        ("predict data as a string", "POST", predict, {**good, "data": "Hi"}),
        ("predict NaN", "POST", predict, b'{"fn_index": NaN, "data": [NaN]}'),
        ("events of an unknown session", "GET", f"{data}?session_hash=never-joined-{uuid.uuid4().hex}", None),
        ("events without a session", "GET", data, None),
        ("events of a huge session", "GET", f"{data}?session_hash={'s' * 5000}", None),
        ("cancel an unknown event", "POST", "gradio_api/cancel", {"session_hash": "x", "fn_index": 99999, "event_id": "nope"}),
        ("cancel junk", "POST", "gradio_api/cancel", {"session_hash": [1], "fn_index": "x"}),
        ("stream to an unknown event", "POST", "gradio_api/stream/nope", {"data": []}),
        ("close an unknown stream", "POST", "gradio_api/stream/nope/close", None),
        ("a component call with junk", "POST", "gradio_api/component_server", {"data": JUNK}),
        ("a component call for no component", "POST", "gradio_api/component_server",
         {"data": None, "component_id": 99999, "session_hash": "x", "fn_name": "__class__"}),
        ("reset junk", "POST", "gradio_api/reset", {"event_id": JUNK}),
    ]
    answers = await send_all(app.url, requests)
    assert not problems(answers), "\n".join(problems(answers))
    unknown = next(a for a in answers if a.what.startswith("an unknown fn_index"))
    assert 400 <= unknown.status < 500 and "99999" in unknown.text, unknown


@EVENTS
async def test_named_api_routes_answer_hostile_calls_with_a_sentence(app):
    page = await config(app.url)
    names = sorted({d["api_name"] for d in page["dependencies"] if d.get("api_name")})
    assert {"chat", "reply", "compare", "vote", "leaderboard"} <= set(names), names
    bodies = [
        ("no inputs", b'{"data": []}'),
        ("nested junk", json.dumps({"data": [JUNK] * 9}).encode()),
        ("NaN and infinities", b'{"data": [NaN, Infinity, -Infinity, 1e400, NaN, NaN, NaN, NaN, NaN]}'),
        ("lone surrogates", b'{"data": ["\\ud800", "\\udfff", "\\ud800", null, null, null, null, null, null]}'),
        ("a huge first value", json.dumps({"data": [HUGE]}).encode()),
        ("data as an object", b'{"data": {"message": "Hi"}}'),
    ]
    async with httpx.AsyncClient(limits=LIMITS, timeout=90) as http:
        async def call(name: str, label: str, body: bytes) -> Answer:
            post = await http.post(f"{app.url}gradio_api/call/{name}", content=body, headers={"Content-Type": "application/json"})
            what = f"/call/{name}: {label}"
            if post.status_code != 200:
                return Answer(what, post.status_code, post.text)
            event = post.json()["event_id"]
            async with http.stream("GET", f"{app.url}gradio_api/call/{name}/{event}") as response:
                lines = [line async for line in response.aiter_lines()]
            errors = [json.loads(b[5:]) for a, b in zip(lines, lines[1:], strict=False)
                      if a == "event: error" and b.startswith("data:")]
            text = "\n".join(lines)
            if any(not isinstance(e, str) and not (isinstance(e, dict) and SENTENCE.fullmatch(str(e.get("error")))) for e in errors):
                return Answer(what, 599, "an error that is not a sentence: " + text)
            return Answer(what, response.status_code, text)

        gate = asyncio.Semaphore(AT_ONCE)

        async def gated(*args: Any) -> Answer:
            async with gate:
                return await call(*args)

        answers = list(await asyncio.gather(*(gated(name, label, body) for name in names for label, body in bodies)))
    answers += await send_all(app.url, [
        ("an unknown api name", "POST", "gradio_api/call/no_such_api", {"data": []}),
        ("an unknown event id", "GET", f"gradio_api/call/chat/{uuid.uuid4().hex}", None),
        ("a huge event id", "GET", f"gradio_api/call/chat/{'e' * 5000}", None),
        ("v2 with junk", "POST", "gradio_api/call/v2/chat", {"nope": JUNK}),
        ("v2 for an unknown name", "POST", "gradio_api/call/v2/no_such_api", {}),
    ])
    assert len(answers) >= 40
    assert not problems(answers), "\n".join(problems(answers))


async def test_uploads_and_file_paths_cannot_break_or_leak(app):
    boundary = "hostileboundary"
    part = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"files\"; filename=\"{{name}}\"\r\n"
            "Content-Type: application/octet-stream\r\n\r\n{body}\r\n")
    multipart = {"Content-Type": f"multipart/form-data; boundary={boundary}"}

    def upload(name: str, body: str, end: str = f"--{boundary}--\r\n") -> bytes:
        return (part.replace("{name}", name).format(body=body) + end).encode()

    async with httpx.AsyncClient(limits=LIMITS, timeout=90) as http:
        async def post(label: str, content: bytes, headers: dict[str, str]) -> Answer:
            response = await http.post(app.url + "gradio_api/upload", content=content, headers=headers)
            return Answer(f"upload: {label}", response.status_code, response.text)

        uploads = await asyncio.gather(
            post("no content type", b"junk", {}),
            post("JSON, not multipart", b'{"files": []}', {"Content-Type": "application/json"}),
            post("no boundary", b"junk", {"Content-Type": "multipart/form-data"}),
            post("a body that never ends", upload("a.txt", "x", end=""), multipart),
            post("garbage after the boundary", f"--{boundary}\r\n\x00\x01junk".encode(), multipart),
            post("a traversing file name", upload("../../../../tmp/hostile.txt", "x"), multipart),
            post("oversized", upload("big.bin", "x" * 5_000_000), multipart),
        )
    oversized = uploads[-1]
    assert oversized.status == 413 and SENTENCE.fullmatch(oversized.text.strip()), oversized
    paths = ["../../../../etc/passwd", "/etc/passwd", "..%2f..%2f..%2fetc%2fpasswd", "%2e%2e/%2e%2e/etc/passwd",
             "/proc/self/environ", "app.py", str(app.log_path), "....//....//etc/passwd", "%00", "C:\\Windows\\win.ini",
             "http://127.0.0.1:1/", "file:///etc/passwd", "~/.ssh/id_rsa", "/gradio_api/file=/etc/passwd", "%ED%A0%80"]
    files = await send_all(app.url, [(f"file {p}", "GET", f"gradio_api/file={p}", None) for p in paths]
                           + [(f"file/ {p}", "GET", f"gradio_api/file/{p}", None) for p in paths[:6]])
    leaked = [a.what for a in files if a.status == 200 and ("root:" in a.text or "PATH=" in a.text or "import" in a.text)]
    assert not leaked, leaked
    assert all(a.status >= 400 for a in files), [(a.what, a.status) for a in files if a.status < 400]
    assert not problems([*uploads, *files]), "\n".join(problems([*uploads, *files]))


async def test_the_apps_own_routes_answer_odd_requests_plainly(app):
    odd = ["", "No such preset", "../../etc/passwd", "%00", "%ED%A0%80", "%FF%FE", "NaN", "1e400", "<script>x</script>",
           "x" * 8000, f"{PRESET}&preset=other", "%0d%0aSet-Cookie:%20x=1"]
    requests: list[tuple[str, str, str, Any]] = [(f"status {p[:20]!r}", "GET", f"status?preset={p}", None) for p in odd]
    requests += [
        ("status without a preset", "GET", "status", None),
        ("status posted", "POST", "status", b"{}"),
        ("healthz with junk", "GET", "healthz?x=%FF&engines=1", None),
        ("healthz posted", "POST", "healthz", b"NaN"),
        ("livez posted", "POST", "livez", b"x"),
        ("metrics with junk", "GET", "metrics?name[]=%FF&name=" + "m" * 3000, None),
        ("metrics posted", "DELETE", "metrics", None),
        ("a page that is not there", "GET", "no/such/page/%ED%A0%80", None),
        ("the config for no page", "GET", "config?page=%FF" + "p" * 3000, None),
        ("the API info", "GET", "gradio_api/info?all_endpoints=NaN", None),
        ("the chat socket over plain HTTP", "GET", "chat", None),
        ("a login without --auth", "POST", "login", b"username=a&password=b"),
    ]
    answers = await send_all(app.url, requests)
    assert not problems(answers), "\n".join(problems(answers))
    for answer in answers[:len(odd)]:  # the engine line, or why there is none
        line = json.loads(answer.text)["line"]
        assert answer.status == 200 and (line.startswith("Engine: ") or SENTENCE.fullmatch(line)), answer


async def test_the_websocket_api_answers_every_broken_message_with_a_code_and_a_sentence(app):
    chat = {"type": "chat", "messages": [{"role": "user", "content": "Hi"}]}

    def asking(**fields: Any) -> str:  # a new id each: a refused reply may still be ending when the next comes
        return json.dumps({**chat, "id": uuid.uuid4().hex, **fields})

    broken: list[tuple[str, str | bytes]] = [
        ("not JSON", "{nope"), ("an empty text", ""), ("a JSON array", "[1, 2]"), ("a number", "42"),
        ("NaN", "NaN"), ("no type", '{"id": "x"}'), ("an unknown type", '{"type": "explode", "id": "x"}'),
        ("type as a list", '{"type": ["chat"], "id": "x"}'),
        ("chat without messages", '{"type": "chat", "id": "m"}'),
        ("messages as a string", asking(**{"messages": "Hi"})),
        ("messages empty", asking(**{"messages": []})),
        ("a message of junk", asking(**{"messages": [JUNK]})),
        ("an unknown role", asking(**{"messages": [{"role": "root", "content": "Hi"}]})),
        ("content as a list", asking(**{"messages": [{"role": "user", "content": ["Hi"]}]})),
        ("content NaN", '{"type": "chat", "id": "n", "messages": [{"role": "user", "content": NaN}]}'),
        ("the last message not the user's", asking(**{"messages": [{"role": "assistant", "content": "Hi"}]})),
        ("an empty message", asking(**{"messages": [{"role": "user", "content": "  "}]})),
        ("a huge message", asking(**{"messages": [{"role": "user", "content": "w" * 1_000_000}]})),
        ("an unknown preset", asking(**{"preset": "../../etc/passwd"})),
        ("sampling as a list", asking(**{"sampling": [1, 2]})),
        ("temperature NaN", asking(**{"sampling": {"temperature": float("nan")}})),
        ("max tokens 1e400", '{"type": "chat", "id": "i", "messages": [{"role": "user", "content": "Hi"}], "sampling": {"max_tokens": 1e400}}'),
        ("an unknown knob", asking(**{"sampling": {"logits_processors": ["os.system"]}})),
        ("an extra field", asking(**{"model": "/etc/passwd"})),
        ("an id too long", asking(**{"id": "i" * 500})),
        ("an id as a number", asking(**{"id": 7})),
        ("a lone surrogate in the id", '{"type": "cancel", "id": "\\ud800"}'),
        ("a lone surrogate in the chat id", '{"type": "chat", "id": "\\udfff", "messages": []}'),
        ("cancel an unknown id", '{"type": "cancel", "id": "never-started"}'),
        ("resume an unknown id", '{"type": "resume", "id": "never-started", "after": 3}'),
        ("resume after junk", '{"type": "resume", "id": "x", "after": "three"}'),
        ("resume after -5", '{"type": "resume", "id": "x", "after": -5}'),
        ("resume after 1e400", '{"type": "resume", "id": "x", "after": 1e400}'),
        ("watch an unknown id", '{"type": "watch", "id": "never-started"}'),
        ("deeply nested", "[" * 100_000 + "]" * 100_000),
        ("deeply nested objects", '{"a":' * 50_000 + "1" + "}" * 50_000),
        ("bad UTF-8 in a binary frame", b'{"type": "chat", "id": "b\xff\xfe"}'),
        ("a megabyte of junk", "x" * 1_000_000),
    ]
    answers = []
    async with websockets.connect(websocket_url(app.url), max_size=2**25) as ws:
        for label, message in broken:
            await ws.send(message)
            async with asyncio.timeout(30):
                event = json.loads(await ws.recv())
            answers.append((label, event))
        # A frame over the server's limit closes this socket (1009), and nothing else.
        await ws.send("y" * 20_000_000)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            async with asyncio.timeout(60):
                await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009, closed.value
    wrong = [(label, event) for label, event in answers
             if event.get("type") != "error" or not event.get("code") or event["code"] == "internal"
             or not SENTENCE.fullmatch(event.get("message", "")) or STACK.search(json.dumps(event))]
    assert not wrong, "\n".join(f"{label}: {event}" for label, event in wrong)
    surrogate = dict(answers)["a lone surrogate in the id"]
    assert surrogate["code"] == "bad_request" and surrogate["id"] == "\ufffd", surrogate
    async with websockets.connect(websocket_url(app.url)) as ws:  # and the API still streams
        await ws.send(asking(sampling={"max_tokens": 2, "temperature": 0}))
        async with asyncio.timeout(120):
            while (event := json.loads(await ws.recv()))["type"] not in ("done", "error"):
                pass
    assert event["type"] == "done", event


async def test_the_login_refuses_hostile_sign_ins_plainly(protected_app):
    """On conftest's app behind a login, from an address of its own (127.0.0.2, on the loopback
    network): its failed sign-ins lock that address out for 5 minutes, and no one else."""
    import base64

    from chat.auth import TOO_MANY

    protected = protected_app
    start = protected.log_path.stat().st_size
    form = {"Content-Type": "application/x-www-form-urlencoded"}

    def basic(raw: bytes) -> dict[str, str]:
        return {"Authorization": "Basic " + base64.b64encode(raw).decode()}

    logins: list[tuple[str, bytes, dict[str, str]]] = [
        ("no password", b"username=demo", form),
        ("no fields", b"", form),
        ("JSON instead of a form", json.dumps({"username": "demo", "password": "x"}).encode(), {"Content-Type": "application/json"}),
        ("bad UTF-8", b"username=%ff%fe&password=%ed%a0%80", form),
        ("raw bad UTF-8", b"username=\xff\xfe&password=\x80", form),
        ("a huge password", b"username=demo&password=" + b"p" * 2_000_000, form),
        ("repeated fields", b"username=a&username=b&password=c&password=d", form),
        ("a NUL in the name", b"username=de%00mo&password=s3cret", form),
        ("multipart junk", b"--x\r\n\x00junk", {"Content-Type": "multipart/form-data; boundary=x"}),
        ("no content type", b"username=demo&password=x", {}),
    ]
    headers: list[tuple[str, dict[str, str]]] = [
        ("not base64", {"Authorization": "Basic !!!not base64!!!"}),
        ("no colon", basic(b"demo")),
        ("bad UTF-8", basic(b"\xff\xfe:\x80")),
        ("a huge header", basic(b"demo:" + b"x" * 6000)),
        ("another scheme", {"Authorization": "Bearer s3cret"}),
        ("an empty Basic", {"Authorization": "Basic"}),
    ]
    stranger = httpx.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx.AsyncClient(transport=stranger, timeout=60) as http:
        answers = []
        for label, body, head in logins:  # in turn: each failure counts toward the lock-out
            response = await http.post(protected.url + "login", content=body, headers=head)
            answers.append(Answer(f"login: {label}", response.status_code, response.text))
        for label, head in headers:
            for path in ("metrics", "status?preset=x", "healthz", "config"):
                response = await http.get(protected.url + path, headers=head)
                answers.append(Answer(f"{path} with {label}", response.status_code, response.text))
        right = await http.post(protected.url + "login", content=f"username={USER[0]}&password={USER[1]}".encode(), headers=form)
        health = await http.get(protected.url + "healthz")
    assert not problems(answers), "\n".join(problems(answers))
    assert right.status_code == 429 and right.json()["detail"] == TOO_MANY, right.text  # locked out, plainly
    assert health.status_code == 200 and health.json() == {"status": "ok"}  # and the app still serves
    assert not (problem := logged_problem(protected, start)), "the app logged a problem:\n" + problem
