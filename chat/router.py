"""The one public port in front of several UI workers: every browser sticks to one worker.

Gradio keeps a session's queue in the process that served its page (the join, the event stream and
the `/chat` watch must reach the same process), so requests are routed by a cookie that each worker
sets to its own number (`StickyCookie`); a request without one goes to the next worker in turn. The router reads only the request's head, then copies bytes both ways:
it never parses a response or a WebSocket frame. Each forwarded request asks the worker to close the
connection after answering (WebSocket upgrades excepted), so every request's head is read and routed
here, and the client address a worker sees (`X-Forwarded-For`, honoured by uvicorn from loopback)
is always the router's peer, never a header a browser wrote.

`/healthz` and `/metrics` are answered here from every worker's own: health lists each worker and its
engines, metrics carry a `ui_worker` label.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

COOKIE = "chat_worker"
MAX_HEAD_BYTES = 64 * 1024
CHUNK_BYTES = 64 * 1024
LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
UNAVAILABLE = "The demo is restarting part of itself; reload the page in a moment."


@dataclass
class Backend:
    """One worker as the router sees it: where it listens and how busy it is."""

    index: int
    port: int | None = None  # None while the worker starts or after it stopped
    pid: int | None = None
    state: str = "starting"  # starting, serving, restarting
    connections: int = 0


@dataclass
class Head:
    """A request's first line and headers, as read from the client."""

    method: str
    target: str
    version: str
    headers: list[tuple[str, str]] = field(default_factory=list)

    @classmethod
    def parse(cls, raw: bytes) -> Head:
        lines = raw.decode("latin-1").split("\r\n")
        method, target, version = lines[0].split(" ", 2)
        headers = []
        for line in lines[1:]:
            if line:
                name, _, value = line.partition(":")
                headers.append((name.strip(), value.strip()))
        return cls(method, target, version, headers)

    def get(self, name: str) -> str | None:
        return next((v for k, v in self.headers if k.lower() == name.lower()), None)

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0]

    @property
    def upgrade(self) -> bool:
        return "upgrade" in (self.get("connection") or "").lower() and self.get("upgrade") is not None

    def cookie(self, name: str) -> str | None:
        for header in (v for k, v in self.headers if k.lower() == "cookie"):
            for part in header.split(";"):
                key, _, value = part.strip().partition("=")
                if key == name:
                    return value
        return None

    def forwarded(self, peer: str | None) -> bytes:
        """The head to send on: the connection closes after one answer, unless upgraded; the
        client address is the peer's (kept as sent only when the peer is a proxy on loopback)."""
        drop = {"x-forwarded-for"} if peer not in LOOPBACK else set()
        if not self.upgrade:
            drop |= {"connection", "keep-alive"}
        headers = [(k, v) for k, v in self.headers if k.lower() not in drop]
        if not self.upgrade:
            headers.append(("Connection", "close"))
        if peer and peer not in LOOPBACK:
            headers.append(("X-Forwarded-For", peer))
        lines = [f"{self.method} {self.target} {self.version}", *(f"{k}: {v}" for k, v in headers)]
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
             extra: Mapping[str, str] | None = None) -> bytes:
    reason = {200: "OK", 401: "Unauthorized", 403: "Forbidden", 502: "Bad Gateway",
              503: "Service Unavailable"}.get(status, "Status")
    headers = {"Content-Type": content_type, "Content-Length": str(len(body)), "Connection": "close",
               "Cache-Control": "no-store", **(extra or {})}
    head = f"HTTP/1.1 {status} {reason}\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return head.encode("latin-1") + b"\r\n" + body


async def fetch(port: int, path: str, headers: Mapping[str, str]) -> tuple[int, dict[str, str], bytes]:
    """GET a worker's page over HTTP/1.0 (no keep-alive, no chunking): status, headers, body."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        lines = [f"GET {path} HTTP/1.0", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
        await writer.drain()
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parsed = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        parsed[name.strip().lower()] = value.strip()
    return int(status_line.split(" ")[1]), parsed, body


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})?(\s.*)$")


def merge_metrics(texts: Mapping[int, str]) -> str:
    """Prometheus text from several workers as one exposition: each sample gains `ui_worker`,
    and the samples of one metric family stay together under its HELP and TYPE lines."""
    families: dict[str, dict[str, list[str]]] = {}
    for index, text in texts.items():
        family = ""
        for line in text.splitlines():
            if line.startswith(("# HELP ", "# TYPE ")):
                family = line.split(" ", 3)[2]
                described = families.setdefault(family, {"# HELP": [], "# TYPE": [], "samples": []})[line[:6]]
                if not described:
                    described.append(line)
                continue
            match = _SAMPLE.match(line)
            if match is None:
                continue
            name, labels, rest = match.groups()
            inner = "," + labels[1:-1] if labels and labels != "{}" else ""
            samples = families.setdefault(family or name, {"# HELP": [], "# TYPE": [], "samples": []})["samples"]
            samples.append(f'{name}{{ui_worker="{index}"{inner}}}{rest}')
    return "".join(line + "\n" for parts in families.values() for lines in parts.values() for line in lines)


class Router:
    """Accepts the public connections and hands each to a worker, sticky by cookie."""

    def __init__(self, backends: Callable[[], list[Backend]]) -> None:
        self.backends = backends
        self.newcomers = 0
        self._handling: set[asyncio.Task[None]] = set()  # asyncio keeps only weak references to them

    def choose(self, head: Head) -> Backend | None:
        """The worker named by the request's cookie while it serves; else the next in turn (a crowd
        arriving at once would all find the same worker least busy: their first requests are short)."""
        live = [b for b in self.backends() if b.port is not None and b.state == "serving"]
        wanted = head.cookie(COOKIE)
        for backend in live:
            if wanted == str(backend.index):
                return backend
        if not live:
            return None
        self.newcomers += 1
        return live[self.newcomers % len(live)]

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handling.add(task)
            task.add_done_callback(self._handling.discard)
        peer = writer.get_extra_info("peername")
        try:
            raw = await reader.readuntil(b"\r\n\r\n")
            head = Head.parse(raw)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError, ConnectionError):
            writer.close()
            return
        try:
            if head.method == "GET" and head.path == "/healthz":
                writer.write(await self.health())
            elif head.method == "GET" and head.path == "/metrics":
                writer.write(await self.metrics(head))
            else:
                await self.forward(head, reader, writer, peer[0] if peer else None)
                return
            await writer.drain()
        except ConnectionError:
            pass
        finally:
            writer.close()

    async def forward(self, head: Head, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                      peer: str | None) -> None:
        backend = self.choose(head)
        if backend is None or backend.port is None:
            writer.write(response(503, UNAVAILABLE.encode(), extra={"Retry-After": "5"}))
            await writer.drain()
            writer.close()
            return
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", backend.port)
        except OSError:
            writer.write(response(502, UNAVAILABLE.encode(), extra={"Retry-After": "5"}))
            await writer.drain()
            writer.close()
            return
        backend.connections += 1
        upstream_writer.write(head.forwarded(peer))
        upload = asyncio.create_task(_copy(reader, upstream_writer))
        try:
            # The exchange lasts as long as the worker's answer; a client that goes away ends the
            # upload, which the worker sees as a disconnect, and it closes its side.
            await _copy(upstream_reader, writer)
        finally:
            upload.cancel()
            backend.connections -= 1
            upstream_writer.close()
            writer.close()

    async def _each(self, path: str, headers: Mapping[str, str]) -> dict[int, tuple[int, bytes] | None]:
        backends = [b for b in self.backends() if b.port is not None]

        async def one(backend: Backend) -> tuple[int, bytes] | None:
            assert backend.port is not None
            try:
                status, _, body = await asyncio.wait_for(fetch(backend.port, path, headers), timeout=5)
            except (OSError, TimeoutError, ValueError, IndexError):
                return None
            return status, body

        answers = await asyncio.gather(*(one(b) for b in backends))
        return {b.index: a for b, a in zip(backends, answers, strict=True)}

    async def health(self) -> bytes:
        status, body = await self.health_report()
        return response(status, json.dumps(body).encode(), "application/json")

    async def health_report(self) -> tuple[int, dict[str, object]]:
        """200 while at least one worker serves a healthy engine ("degraded" when another does not),
        503 with the reasons otherwise; each worker and its engines are listed."""
        answers = await self._each("/healthz", {})
        workers: list[dict[str, object]] = []
        engines: list[dict[str, object]] = []
        reasons: list[str] = []
        healthy = 0
        for backend in self.backends():
            answer = answers.get(backend.index)
            body = _json(answer[1]) if answer else {}
            if answer and answer[0] == 200:
                healthy += 1
            else:
                reasons.append(f"UI worker {backend.index} ({backend.state}): {body.get('reason') or 'not answering'}")
            workers.append({"index": backend.index, "pid": backend.pid, "state": backend.state, "connections": backend.connections,
                            "status": body.get("status", "unavailable")})
            listed = body.get("engines")
            for engine in listed if isinstance(listed, list) else []:
                engines.append({**engine, "ui_worker": backend.index})
        status = "ok" if healthy and not reasons else "degraded" if healthy else "unavailable"
        result: dict[str, object] = {"status": status, "workers": workers, "engines": engines}
        if reasons:
            result["reason"] = "; ".join(reasons)
        return 200 if healthy else 503, result

    async def metrics(self, head: Head) -> bytes:
        passed = {k: v for k, v in head.headers if k.lower() in ("authorization", "cookie")}
        answers = await self._each("/metrics", passed)
        texts = {}
        for index, answer in sorted(answers.items()):
            if answer is None:
                continue
            status, body = answer
            if status != 200:  # a login is missing: say so as the worker did
                return response(status, body, extra={"WWW-Authenticate": 'Basic realm="chat"'} if status == 401 else None)
            texts[index] = body.decode()
        if not texts:
            return response(503, UNAVAILABLE.encode())
        return response(200, merge_metrics(texts).encode(), "text/plain; version=0.0.4; charset=utf-8")


def _json(body: bytes) -> dict[str, object]:
    try:
        value = json.loads(body)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


async def _copy(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Bytes from one side to the other until it ends; then half-close the other side."""
    try:
        while chunk := await reader.read(CHUNK_BYTES):
            writer.write(chunk)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.close()


class StickyCookie:
    """ASGI middleware of a worker: answers that lack the router's cookie for this worker set it."""

    def __init__(self, app: Callable[..., Any], value: str) -> None:
        self.app, self.value = app, value
        self.header = f"{COOKIE}={value}; Path=/; HttpOnly; SameSite=Lax".encode("latin-1")

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any], send: Callable[..., Any]) -> None:
        if scope["type"] != "http" or self._sent_by_browser(scope):
            await self.app(scope, receive, send)
            return

        async def send_with_cookie(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", self.header)]}
            await send(message)

        await self.app(scope, receive, send_with_cookie)

    def _sent_by_browser(self, scope: dict[str, Any]) -> bool:
        wanted = f"{COOKIE}={self.value}"
        return any(name == b"cookie" and wanted in (p.strip() for p in value.decode("latin-1").split(";"))
                   for name, value in scope.get("headers", []))
