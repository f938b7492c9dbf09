"""A streaming chat API over a WebSocket at /chat, beside the UI and on the same shared engines.

The client sends JSON messages (chat/api_schema.py); every event the server sends carries the request's "id":

    -> {"type": "chat", "id": "r1", "preset": "...", "messages": [...], "sampling": {...}}
    <- {"type": "progress", "status": "Starting the engine…"}      while an engine starts
    <- {"type": "delta", "text": "Hel", "index": 0}                 then 1, 2, … (coalesced)
    <- {"type": "stats", "stats": {...}}                            ReplyStats.as_dict()
    <- {"type": "done", "finish": "max_tokens"}                     or one {"type": "error", ...}
    -> {"type": "cancel", "id": "r1"}                               ends it as stopped_by_user
    -> {"type": "resume", "id": "r1", "after": 41}                  after a dropped connection
    -> {"type": "watch", "id": "live-…", "after": 3}                follow a reply without owning it
    -> {"type": "begin", "id": "live-…", "message": "…", …}         the page's Chat tab: start the reply
                                                                    its Gradio turn follows (chat/live.py)

Each reply goes through the one reply pipeline (`ChatService.reply`) in a server-side task that
writes its events into a `ReplyLog` (`chat.live.start`); sockets only follow logs. A reply started
here belongs to this socket (`begin`'s too); one that a page's Gradio turn started (its `begin` came
late) belongs to the turn, and the socket only follows it. So a connection
that drops (no close frame) leaves its replies running for `grace_s`, and a client that reconnects
resumes from the last delta it got without generating twice. Closing the socket cleanly, or nobody
resuming in time, aborts the engine request.

Request ids are the visitor's own (`chat.voters.visitor_of`: the signed voter cookie the socket
carries, else its address, IPv6 by its /64): resuming, watching and cancelling find only the replies
that visitor started, on any of their sockets, and another visitor's id is unknown (an id in use by
someone else is free to reuse: it starts a reply of one's own). The page's socket carries the page's
cookie, so it follows what the page's Gradio events write.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from pydantic import ValidationError
from starlette.requests import HTTPConnection
from starlette.routing import BaseRoute, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketState

from chat import live
from chat.api_schema import (
    GRACE_S,
    REQUEST,
    ApiError,
    BeginRequest,
    CancelRequest,
    ChatRequest,
    ResumeRequest,
    WatchRequest,
    error_code,
    plain_validation_error,
)
from chat.errors import UNEXPECTED_ERROR, ChatError
from chat.history import clean_text
from chat.live import ReplyLog, ReplyStore
from chat.service import ChatService, ReplyRequest
from chat.voters import visitor_of

log = logging.getLogger(__name__)

MAX_RUNNING_PER_SOCKET = 8
MAX_WATCHING_PER_SOCKET = 32  # a page follows its chat's reply and Compare's columns over one socket


def reply_request(request: ChatRequest) -> ReplyRequest:
    """The pipeline's request for a chat request whose shape is valid.

    The last message is the new one (it must be the user's); system messages become the system
    prompt (without any, the preset's own is used).
    """
    *history, new = request.messages
    if new.role != "user":
        raise ApiError("bad_request", 'The last message must be the user\'s new message (role "user").')
    system = [m.content for m in history if m.role == "system"]
    return ReplyRequest(
        new.content,
        [{"role": m.role, "content": m.content} for m in history if m.role != "system"],
        preset=request.preset,
        system_prompt="\n\n".join(system) if system else None,
        sampling=request.sampling,
    )


class Connection:
    """One WebSocket: reads requests, starts replies, and forwards the events it follows."""

    def __init__(self, websocket: WebSocket, service: ChatService, store: ReplyStore, grace_s: float) -> None:
        self.websocket = websocket
        self.visitor = visitor_of(websocket)  # whose replies this socket starts and finds
        self.service = service
        self.store = store
        self.grace_s = grace_s
        self._send_lock = asyncio.Lock()
        self._forwarders: set[asyncio.Task[None]] = set()  # replies this socket started or resumed
        self._watchers: set[asyncio.Task[None]] = set()  # replies it only follows

    async def serve(self) -> None:
        dropped = True
        try:
            while True:
                message = await self.websocket.receive()
                if message["type"] == "websocket.disconnect":
                    # No close frame from the client: 1006, or 1005 without a reason (uvicorn).
                    code = message.get("code", 1006)
                    dropped = code == 1006 or (code == 1005 and message.get("reason") is None)
                    return
                await self.handle(message.get("text") or message.get("bytes") or "")
        finally:
            await self.close(dropped)

    async def handle(self, raw: str | bytes) -> None:
        request_id = None
        try:
            try:
                data = json.loads(raw)
            except (ValueError, RecursionError):  # RecursionError: nested deeper than the parser goes
                raise ApiError("bad_json", "That message is not valid JSON; send one JSON object per message.") from None
            if isinstance(data, dict) and isinstance(data.get("id"), str):
                request_id = clean_text(data["id"][:128])  # a lone surrogate could not be sent back
            try:
                request = REQUEST.validate_python(data)
            except ValidationError as exc:
                raise ApiError("bad_request", plain_validation_error(exc)) from None
            if isinstance(request, ChatRequest):
                self.start(request)
            elif isinstance(request, CancelRequest):
                self.service.stop(self.running_log(request.id).stop_key)  # refuses ids that are not running
            elif isinstance(request, WatchRequest):
                self.watch(request)
            elif isinstance(request, BeginRequest):
                self.begin(request)
            else:
                self.resume(request)
        except ChatError as exc:
            await self.send({"type": "error", "id": request_id, "code": error_code(exc), "message": exc.message})
        except Exception:
            log.exception("Unexpected error handling an API message")
            await self.send({"type": "error", "id": request_id, "code": "internal", "message": UNEXPECTED_ERROR})

    def start(self, request: ChatRequest) -> None:
        request_id = request.id or f"api-{uuid.uuid4().hex}"
        earlier = self.store.get(self.visitor, request_id)
        if earlier is not None and earlier.running:
            raise ApiError("duplicate_id", f"A reply with id {request_id!r} is still running; use a new id or cancel it first.")
        self.check_room()
        reply_log = live.start(self.service, self.store, self.visitor, request_id,
                               dataclasses.replace(reply_request(request), visitor=self.visitor), owner=self, started_by="api")
        self.follow(reply_log, 0)

    def check_room(self) -> None:
        if sum(1 for t in self._forwarders if not t.done()) >= MAX_RUNNING_PER_SOCKET:
            raise ApiError("busy", f"At most {MAX_RUNNING_PER_SOCKET} replies can run at once on one connection; wait for one to finish.")

    def begin(self, request: BeginRequest) -> None:
        """The page's Chat tab: its reply, started here, or followed where its turn came first and started it."""
        if (earlier := self.store.get(self.visitor, request.id)) is not None:
            if earlier.started_by != "turn":
                raise ApiError("duplicate_id", f"There is already a reply with id {request.id!r}; use a new id.")
            self.follow(earlier, 0, tasks=self._watchers)
            return
        self.check_room()
        asked = ReplyRequest(request.message, request.history, preset=request.preset,
                             system_prompt=request.system_prompt, sampling=request.sampling, visitor=self.visitor)
        self.follow(live.start(self.service, self.store, self.visitor, request.id, asked, owner=self,
                               started_by="page", lines=True), 0)

    def resume(self, request: ResumeRequest) -> None:
        reply_log = self.store.get(self.visitor, request.id)
        if reply_log is None:
            raise ApiError("unknown_id", f"There is no running or recent reply with id {request.id!r}; send the chat request again.")
        if reply_log.started_by == "turn":  # a Gradio turn's: it stays the turn's
            self.follow(reply_log, reply_log.position_after(request.after), tasks=self._watchers)
            return
        reply_log.owner = self
        if reply_log.abandon is not None:
            reply_log.abandon.cancel()
            reply_log.abandon = None
        self.follow(reply_log, reply_log.position_after(request.after))

    def watch(self, request: WatchRequest) -> None:
        reply_log = self.store.get(self.visitor, request.id)
        if reply_log is None:
            raise ApiError("unknown_id", f"There is no running or recent reply with id {request.id!r}.")
        if sum(1 for t in self._watchers if not t.done()) >= MAX_WATCHING_PER_SOCKET:
            raise ApiError("busy", f"At most {MAX_WATCHING_PER_SOCKET} replies can be followed on one connection.")
        self.follow(reply_log, reply_log.position_after(request.after), tasks=self._watchers)

    def running_log(self, request_id: str) -> ReplyLog:
        reply_log = self.store.get(self.visitor, request_id)
        if reply_log is None or not reply_log.running:
            raise ApiError("unknown_id", f"No reply with id {request_id!r} is running.")
        return reply_log

    def follow(self, reply_log: ReplyLog, position: int, tasks: set[asyncio.Task[None]] | None = None) -> None:
        async def forward() -> None:
            async for event in reply_log.follow(position):
                await self.send(event)

        task = asyncio.get_running_loop().create_task(forward(), name=f"api forward {reply_log.id}")
        tasks = self._forwarders if tasks is None else tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    async def send(self, event: dict[str, Any]) -> None:
        async with self._send_lock:
            if self.websocket.application_state is not WebSocketState.CONNECTED:
                return
            try:
                await self.websocket.send_text(json.dumps(event, ensure_ascii=False))
            except Exception as exc:  # the client went away; serve() sees the disconnect
                log.debug("Could not send to an API client: %r", exc)

    async def close(self, dropped: bool) -> None:
        """Stop forwarding; abort this socket's replies now, or after `grace_s` if it dropped."""
        following = [*self._forwarders, *self._watchers]
        for task in following:
            task.cancel()
        await asyncio.gather(*following, return_exceptions=True)
        for reply_log in self.store.owned_by(self):
            reply_log.owner = None
            if not dropped:
                reply_log.abort()
            else:
                reply_log.abandon = asyncio.get_running_loop().call_later(self.grace_s, _abandon, reply_log)


def _abandon(reply_log: ReplyLog) -> None:
    reply_log.abandon = None
    if reply_log.owner is None and reply_log.running:
        log.info("Nobody resumed API request %s within the grace period; aborting it", reply_log.id)
        reply_log.abort()


def same_origin(websocket: WebSocket) -> bool:
    """Browsers always send Origin: refuse other sites' pages (cross-site WebSocket hijacking)."""
    origin = websocket.headers.get("origin")
    return origin is None or urlsplit(origin).netloc == websocket.headers.get("host")


def routes(
    service: ChatService, store: ReplyStore, *, allows: Callable[[HTTPConnection], Awaitable[bool]] | None = None,
    grace_s: float = GRACE_S,
) -> list[BaseRoute]:
    """The /chat WebSocket, its replies' logs in `store` (which the pages' tabs write into too).
    `allows` (e.g. a login check) refuses connections it returns False for."""

    async def chat_socket(websocket: WebSocket) -> None:
        if not same_origin(websocket) or (allows is not None and not await allows(websocket)):
            await websocket.close(code=1008)  # the handshake is refused with 403
            return
        await websocket.accept()
        await Connection(websocket, service, store, grace_s).serve()

    return [WebSocketRoute("/chat", chat_socket)]
