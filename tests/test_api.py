"""The WebSocket API on the real app and real sockets, with a proxy that cuts them: on the stand-in
engine (tests/stand_in.py), but for the resume after a dropped connection, on the real one."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import pytest
import websockets

from chat.client import ChatApiError, ReplyStream, websocket_url
from tests.conftest import RESUME_GRACE_S, ROOT, free_port

PRESET = "SmolLM2 135M (CPU)"
LONG = "Write a very long story about a dragon, at least 2000 words."  # runs to max_tokens (the stand-in's "long")


def chat(request_id: str, content: str, **fields) -> str:
    sampling = {"temperature": 0.0, "seed": 1, **fields.pop("sampling", {})}
    return json.dumps({"type": "chat", "id": request_id, "messages": [{"role": "user", "content": content}],
                       "sampling": sampling, **fields})


async def events_of(ws, request_id: str) -> list[dict]:
    """Events for one request until its done or error (others are skipped)."""
    events = []
    async with asyncio.timeout(120):
        while True:
            event = json.loads(await ws.recv())
            assert "Traceback" not in json.dumps(event)
            if event.get("id") != request_id:
                continue
            events.append(event)
            if event["type"] in ("done", "error"):
                return events


async def next_error(ws) -> dict:
    async with asyncio.timeout(10):
        event = json.loads(await ws.recv())
    assert event["type"] == "error", event
    return event


def deltas(events: list[dict]) -> list[dict]:
    return [e for e in events if e["type"] == "delta"]


async def resumed(app, request_id: str, after: int = -1) -> list[dict]:
    """Everything the server kept for a request, read on a fresh socket."""
    async with websockets.connect(websocket_url(app.url)) as ws:
        await ws.send(json.dumps({"type": "resume", "id": request_id, "after": after}))
        return await events_of(ws, request_id)


async def engine_load(app) -> dict:
    _, body = await asyncio.to_thread(app.health)
    (engine,) = body["engines"]
    return {key: engine[key] for key in ("running", "waiting", "unfinished", "streams")}


async def idle(app, within_s: float = 15) -> dict:
    body = await asyncio.to_thread(app.wait_idle, within_s)
    (engine,) = body["engines"]
    return {key: engine[key] for key in ("running", "waiting", "unfinished", "streams")}


IDLE = {"running": 0, "waiting": 0, "unfinished": 0, "streams": 0}


async def test_a_reply_streams_as_deltas_then_stats_then_done(app_server):
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        await ws.send(chat("full", "Write two sentences about autumn.", sampling={"max_tokens": 80}))
        events = await events_of(ws, "full")
    kinds = [e["type"] for e in events]
    assert kinds[-2:] == ["stats", "done"] and set(kinds[:-2]) <= {"progress", "delta"}
    parts = deltas(events)
    assert len(parts) >= 5, "the reply should arrive in several deltas"
    assert [e["index"] for e in parts] == list(range(len(parts)))
    text = "".join(e["text"] for e in parts)
    assert text.strip() and all(e["id"] == "full" for e in events)
    stats = events[-2]["stats"]
    assert stats["generated_tokens"] == 80 and stats["finish"] == "max_tokens" and stats["preset"] == PRESET
    assert stats["sampling"]["temperature"] == 0.0 and stats["sampling"]["max_tokens"] == 80
    assert 0 < stats["first_token_s"] <= stats["total_s"] and stats["tokens_per_s"] > 0
    assert events[-1] == {"type": "done", "id": "full", "finish": "max_tokens"}
    # The events are kept a while: a client can resume from any delta, even after the end.
    again = await resumed(app_server, "full", after=2)
    assert again == [e for e in events if e["type"] != "progress"][3:]
    assert await idle(app_server) == IDLE


async def test_several_requests_run_at_once_on_one_socket(app_server):
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        await ws.send(chat("a", LONG, sampling={"max_tokens": 24}))
        await ws.send(chat("b", LONG.replace("dragon", "whale"), sampling={"max_tokens": 24}))
        order, done = [], set()
        async with asyncio.timeout(120):
            while done != {"a", "b"}:
                event = json.loads(await ws.recv())
                order.append((event["id"], event["type"]))
                if event["type"] in ("done", "error"):
                    assert event["type"] == "done" and event["finish"] == "max_tokens", event
                    done.add(event["id"])
    a_deltas = [i for i, (rid, kind) in enumerate(order) if rid == "a" and kind == "delta"]
    b_deltas = [i for i, (rid, kind) in enumerate(order) if rid == "b" and kind == "delta"]
    assert a_deltas[0] < b_deltas[-1] and b_deltas[0] < a_deltas[-1], "both should be written together"


async def test_closing_the_socket_aborts_its_replies(app_server):
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        for request_id in ("close-1", "close-2"):
            await ws.send(chat(request_id, LONG, sampling={"max_tokens": 1000}))
        got = 0
        async with asyncio.timeout(60):
            while got < 6:
                got += json.loads(await ws.recv())["type"] == "delta"
            # Both written at once (the second may still be rendering its prompt after the first's deltas).
            while (await engine_load(app_server))["running"] != 2:
                await ws.recv()  # reading on, as a client does
    assert await idle(app_server) == IDLE
    for request_id in ("close-1", "close-2"):
        events = await resumed(app_server, request_id)
        assert events[-1]["finish"] == "disconnected" and len(deltas(events)) < 200


async def test_cancel_stops_one_reply_with_its_stats(app_server):
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        await ws.send(chat("stop-me", LONG, sampling={"max_tokens": 1000}))
        async with asyncio.timeout(60):
            while json.loads(await ws.recv())["type"] != "delta":
                pass
        await ws.send(json.dumps({"type": "cancel", "id": "stop-me"}))
        events = await events_of(ws, "stop-me")
        assert events[-1] == {"type": "done", "id": "stop-me", "finish": "stopped_by_user"}
        stats = events[-2]["stats"]
        assert stats["finish"] == "stopped_by_user" and 0 < stats["generated_tokens"] < 200
        assert await idle(app_server) == IDLE
        await ws.send(json.dumps({"type": "cancel", "id": "stop-me"}))
        assert (await next_error(ws))["code"] == "unknown_id"
        await ws.send(chat("after-stop", "Hi", sampling={"max_tokens": 4}))
        assert (await events_of(ws, "after-stop"))[-1]["type"] == "done"


async def test_mistakes_get_their_sentence_and_the_socket_keeps_serving(app_server):
    hi = [{"role": "user", "content": "Hi"}]
    mistakes = [
        ("{not json", "bad_json", "That message is not valid JSON; send one JSON object per message."),
        (chat("m1", "x" * 100_001), "input_too_long",
         "Your message is 100,001 characters; the limit is 100,000. Shorten it and send it again."),
        (chat("m2", "Hi", sampling={"temperature": 9}), "invalid_settings",
         "Temperature must be a number from 0 to 2; it was 9."),
        (chat("m3", "Hi", sampling={"max_tokens": 5000}), "invalid_settings",
         "Max new tokens must be a whole number from 1 to 1024; it was 5000."),
        (chat("m4", "Hi", sampling={"model": "gpt"}), "invalid_settings",
         "Unknown setting 'model'; the settings are temperature, top_p, top_k, max_tokens, repetition_penalty, seed."),
        (chat("m5", "   "), "empty_message", "Type a message first."),
        (json.dumps({"type": "chat", "id": "m6", "messages": hi, "model": "/etc/passwd"}), "bad_request",
         '"model" is not part of this request; remove it.'),
        (json.dumps({"type": "chat", "id": "m7", "messages": [{"role": "bot", "content": "Hi"}]}), "bad_request",
         "\"messages.0.role\": Input should be 'user', 'assistant' or 'system'."),
        (json.dumps({"type": "chat", "id": "m8", "messages": [*hi, {"role": "assistant", "content": "Hello"}]}),
         "bad_request", 'The last message must be the user\'s new message (role "user").'),
        (json.dumps({"type": "hello"}), "bad_request", "Unknown request type 'hello'; the types are chat, cancel, resume and watch."),
        (json.dumps({"type": "resume", "id": "never-sent"}), "unknown_id",
         "There is no running or recent reply with id 'never-sent'; send the chat request again."),
    ]
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        for sent, code, message in mistakes:
            await ws.send(sent)
            error = await next_error(ws)
            assert (error["code"], error["message"]) == (code, message)
            if '"id": "m' in sent:
                assert error["id"] == json.loads(sent)["id"]
        await ws.send(chat("m9", "Hi", preset="../../etc/passwd"))
        error = await next_error(ws)
        assert error["code"] == "unknown_preset"
        assert error["message"].startswith("There is no preset named '../../etc/passwd'; the presets are: ")
        assert PRESET in error["message"]
        await ws.send(chat("still-works", "Hi", preset=PRESET, sampling={"max_tokens": 6}))
        events = await events_of(ws, "still-works")
    assert events[-1]["type"] == "done" and events[-2]["stats"]["generated_tokens"] <= 6


async def test_an_id_still_running_is_refused_and_free_again_once_done(app_server):
    async with websockets.connect(websocket_url(app_server.url)) as ws:
        await ws.send(chat("dup", "Count to twenty.", sampling={"max_tokens": 16}))
        await ws.send(chat("dup", "Something else"))
        events = []
        while not events or events[-1]["type"] != "done":
            events += await events_of(ws, "dup")
        errors = [e for e in events if e["type"] == "error"]
        assert errors == [{
            "type": "error", "id": "dup", "code": "duplicate_id",
            "message": "A reply with id 'dup' is still running; use a new id or cancel it first.",
        }]
        assert events[-1]["finish"] == "max_tokens" and events[-2]["stats"]["generated_tokens"] == 16
        await ws.send(chat("dup", "Hi", sampling={"max_tokens": 3}))
        assert (await events_of(ws, "dup"))[-1]["type"] == "done"


async def test_a_page_from_another_site_cannot_open_the_socket(app_server):
    with pytest.raises(websockets.InvalidStatus) as refused:
        async with websockets.connect(websocket_url(app_server.url), origin="http://evil.example"):
            pass
    assert refused.value.response.status_code == 403


class DroppingProxy:
    """A loopback TCP proxy to the app that cuts its first connection, without a close frame,
    once `drop_after` bytes have come back from the server."""

    def __init__(self, target_port: int, drop_after: int) -> None:
        self.target_port = target_port
        self.drop_after = drop_after
        self.connections = 0
        self.dropped = False

    async def __aenter__(self) -> DroppingProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self.server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()

    async def _handle(self, client_reader, client_writer) -> None:
        self.connections += 1
        limit = self.drop_after if self.connections == 1 else None
        server_reader, server_writer = await asyncio.open_connection("127.0.0.1", self.target_port)

        async def pipe(reader, writer, limit):
            passed = 0
            while data := await reader.read(4096):
                if limit is not None and passed + len(data) >= limit:
                    writer.write(data[: limit - passed])  # a frame cut in half, then nothing
                    self.dropped = True
                    return
                writer.write(data)
                await writer.drain()
                passed += len(data)

        pipes = [asyncio.ensure_future(pipe(client_reader, server_writer, None)),
                 asyncio.ensure_future(pipe(server_reader, client_writer, limit))]
        await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        for task in pipes:
            task.cancel()
        client_writer.transport.abort()
        server_writer.transport.abort()


async def test_the_client_resumes_after_a_dropped_connection_without_repeats(real_app):
    port = int(real_app.url.rstrip("/").rsplit(":", 1)[1])
    async with DroppingProxy(port, drop_after=1200) as proxy:
        stream = ReplyStream(LONG, url=real_app.url, ws_url=f"ws://127.0.0.1:{proxy.port}/chat",
                             sampling={"max_tokens": 80, "temperature": 0.0}, retries=3)
        parts = [text async for text in stream]
    assert proxy.dropped and proxy.connections == 2 and stream.reconnects == 1
    assert stream.via == "websocket" and stream.finish == "max_tokens"
    assert stream.stats["generated_tokens"] == 80 and "reached the Max tokens limit" in stream.summary
    # Exactly once: what the client printed is what the server generated, delta for delta.
    server = deltas(await resumed(real_app, stream.id))
    assert "".join(parts) == stream.text == "".join(e["text"] for e in server)
    assert len(parts) == len(server) and [e["index"] for e in server] == list(range(len(server)))
    assert await idle(real_app) == IDLE


async def test_a_dropped_reply_nobody_resumes_is_aborted_after_the_grace_period(app_server):
    ws = await websockets.connect(websocket_url(app_server.url))
    await ws.send(chat("orphan", LONG, sampling={"max_tokens": 1000}))
    async with asyncio.timeout(60):
        while json.loads(await ws.recv())["type"] != "delta":
            pass
    ws.transport.abort()  # the network goes away: no close frame
    dropped_at = time.monotonic()
    assert (await engine_load(app_server))["running"] == 1, "a dropped connection's reply keeps running"
    assert await idle(app_server, within_s=RESUME_GRACE_S + 15) == IDLE
    assert time.monotonic() - dropped_at > RESUME_GRACE_S - 1, "it waits the grace period for a resume"
    events = await resumed(app_server, "orphan")
    assert events[-1]["finish"] == "disconnected" and len(deltas(events)) < 900


async def test_the_client_falls_back_to_the_gradio_api_when_the_socket_is_refused(app_server):
    settings = {"max_tokens": 12, "temperature": 0.0, "seed": 1}
    streamed = ReplyStream("Name three rivers.", url=app_server.url, sampling=settings)
    streamed_text = "".join([text async for text in streamed])
    for ws_url in (f"ws://127.0.0.1:{free_port()}/chat", websocket_url(app_server.url) + "-nowhere"):
        fallback = ReplyStream("Name three rivers.", url=app_server.url, ws_url=ws_url, sampling=settings, retries=2)
        parts = [text async for text in fallback]
        assert fallback.via == "gradio" and fallback.reconnects == 2
        assert fallback.stats["generated_tokens"] == 12 and fallback.stats["finish"] == "max_tokens"
        assert parts == [fallback.text] and fallback.finish == "max_tokens"
        assert " · 12 tokens at " in fallback.summary and fallback.summary.endswith(" · reached the Max tokens limit")
        # The API and the UI render the same conversation with the same settings (the stand-in engine
        # writes the same words for any prompt with the same cue, so the prompt is compared too).
        assert fallback.text == streamed_text == streamed.text
        same = ("preset", "sampling", "prompt_tokens", "context_limit")
        assert {k: fallback.stats[k] for k in same} == {k: streamed.stats[k] for k in same}, (fallback.stats, streamed.stats)


def test_the_command_line_client_prints_the_reply_then_the_stats(app_server):
    out = subprocess.run(
        [sys.executable, "-m", "chat.client", "Write a haiku about snow.", "--url", app_server.url,
         "--max-tokens", "10", "--temperature", "0"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip()
    assert "10 tokens" in out.stderr and "reached the Max tokens limit" in out.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "chat.client", "Hi", "--url", app_server.url, "--temperature", "9"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert refused.returncode == 1 and "Temperature must be a number from 0 to 2; it was 9." in refused.stderr


def test_the_fallback_reads_a_timed_out_reply_and_raises_a_refusal():
    """/reply's answers as chat/ui/reply_api.py writes them (unit test of the reading)."""
    stream = ReplyStream("Hi")
    stats = {"preset": "P", "sampling": {"temperature": 0.7, "top_p": 0.9, "top_k": 0, "max_tokens": 64,
             "repetition_penalty": 1.0, "seed": -1}, "prompt_tokens": 20, "cached_prompt_tokens": 0,
             "generated_tokens": 40, "first_token_s": 0.09, "total_s": 60.2, "queue_s": 0.0, "prefill_s": 0.05,
             "decode_s": 4.8, "finish": "timed_out", "context_limit": 2048, "engine_wait_s": 0.0}
    timed_out = {"text": "Once upon a time", "stats": stats, "finish": "timed_out",
                 "notice": "The model produced nothing for 60 s.", "error": None}
    assert stream.take(timed_out) == "Once upon a time"
    assert (stream.finish, stream.notice) == ("timed_out", "The model produced nothing for 60 s.")
    assert stream.summary.endswith("40 tokens at 8.1 a second · 60.2 s in all · timed out")
    refused = {"text": "", "stats": None, "finish": "error", "notice": None,
               "error": {"code": "empty_message", "message": "Type a message first."}}
    with pytest.raises(ChatApiError) as caught:
        stream.take(refused)
    assert caught.value.message == "Type a message first."


def test_the_server_upgrades_a_connection_to_a_websocket(app_server):
    """With no WebSocket library installed uvicorn answers the upgrade with 404: the API would be gone."""
    import base64
    import os
    import socket
    from urllib.parse import urlsplit

    host, port = urlsplit(app_server.url).hostname, urlsplit(app_server.url).port
    key = base64.b64encode(os.urandom(16)).decode()
    with socket.create_connection((host, port), timeout=10) as conn:
        conn.sendall((f"GET /chat HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                      f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
        status_line = conn.recv(4096).split(b"\r\n", 1)[0].decode()
    assert status_line.startswith("HTTP/1.1 101"), status_line


@pytest.mark.unit
def test_the_requirements_install_what_the_websocket_route_needs():
    for name in ("requirements.txt", "requirements-cpu.txt"):
        lines = (ROOT / name).read_text().splitlines()
        assert any(line.split(">")[0].split("=")[0].strip() in ("websockets", "wsproto") for line in lines), name


async def test_a_watcher_follows_a_reply_and_leaving_does_not_stop_it(app_server):
    """What the page's live.js does: follow a reply it does not own, from the delta it has."""
    async with websockets.connect(websocket_url(app_server.url)) as owner:
        await owner.send(chat("watched", "Count from one to thirty in words.", sampling={"max_tokens": 60}))
        async with asyncio.timeout(60):
            while json.loads(await owner.recv())["type"] != "delta":
                pass
        async with websockets.connect(websocket_url(app_server.url)) as watcher:
            await watcher.send(json.dumps({"type": "watch", "id": "watched", "after": 0}))
            first = json.loads(await watcher.recv())
            assert first["type"] == "delta" and first["index"] == 1, "it picks up after the delta it had"
        # The watcher left cleanly (a close frame): the reply, which it does not own, goes on.
        events = await events_of(owner, "watched")
        assert events[-1]["type"] == "done" and events[-1]["finish"] in ("max_tokens", "finished"), events[-1]
        async with websockets.connect(websocket_url(app_server.url)) as late:
            await late.send(json.dumps({"type": "watch", "id": "nobody"}))
            assert (await next_error(late))["code"] == "unknown_id"
