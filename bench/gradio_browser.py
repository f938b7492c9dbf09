"""A Gradio page's events replayed the way its browser front end fires them, without a browser.

Sending a message from a Gradio ChatInterface is not one request: the textbox's submit starts a
chain of events (`.then`, `.success`), some through the queue and some as plain `/run` calls, and
the values they return fire `change` events of their own. ChatInterface's public `/chat` API
endpoint skips most of that (and the Chatbot's postprocessing), so a benchmark that only calls it
measures less work than a browser causes. A `Tab` reads the page's `/config` and follows the same
rules as the front end for one session: it sends the values the page holds for each input (state
stays on the server), applies the returned values and diffs, fires `change` for what changed, and
runs every event chained after each one. It keeps one event stream per session, as the browser
does. Front-end-only (JavaScript) events are skipped; the page itself is bench/gradio_page.py's.
Used by bench/frontend.py.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.gradio_page import Event, Page, patch, reply_text
from chat.front_door import COOKIE as STICKY_COOKIE  # the app runs several UI workers (--ui-workers)
from chat.sampling import KNOB_NAMES
from chat.ui.messages import PLACEHOLDER as LIVE_PLACEHOLDER
from chat.voters import COOKIE as VOTER_COOKIE  # who a visitor is: whose replies, votes and share


@dataclass
class Watch:
    """What one tab saw of the streaming event that writes into `component`."""

    component: int
    started: float = 0.0  # monotonic: the user pressed Enter
    joined: float | None = None  # the event was sent to Gradio's queue
    process_started: float | None = None  # the queue began running the event
    updates: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, reply length) per update
    text: str = ""  # the reply at its last update
    live: str = ""  # the reply as the page's live.js holds it (every delta over the WebSocket)
    begun: str | None = None  # the id of the reply the page began over its socket (chat/live.py)
    box_at: float | None = None  # when Gradio drew that reply's box: the page shows its text from then
    first_delta: float | None = None  # the begun reply's first text arrived on the page's socket
    ended: float | None = None
    error: str | None = None


@dataclass
class Trace:
    """Counts of what one user action cost in requests."""

    queued: int = 0
    direct: int = 0
    errors: list[str] = field(default_factory=list)


class Tab:
    """One browser tab: its session, the values its components hold, and its event stream."""

    def __init__(self, http: httpx.AsyncClient, base_url: str, page: Page, program: bool = False) -> None:
        self.http = http
        self.root = base_url.rstrip("/")
        self.base = self.root + "/gradio_api"
        self.headers = {"x-gradio-user": "api"} if program else {}  # as gradio_client marks itself
        self._live: dict[str, asyncio.Task[None]] = {}  # live reply id -> its follower (chat/ui/live.js)
        self._sent: dict[int, Any] = {}  # component -> the value its stream sent last (diffs apply to it)
        self.page = page
        self.session = secrets.token_hex(8)
        self.values = dict(page.initial)
        self.trace = Trace()
        self.watch: Watch | None = None
        self._stream: asyncio.Task | None = None
        self._inboxes: dict[str, asyncio.Queue[dict[str, Any]]] = {}
        self._pinned = not page.sticky
        self._early: dict[str, list[dict[str, Any]]] = defaultdict(list)  # messages before their join returned
        self._socket: Any = None  # the page's own WebSocket (/chat), which live.js opens as the page loads
        self._socket_reader: asyncio.Task[None] | None = None
        self._heartbeat: asyncio.Task[None] | None = None  # Gradio's session heartbeat (`mount`)

    async def pin(self) -> None:
        """Take the UI worker the front door gives a newcomer, and the visitor's cookie the app gives
        it, and keep both, as a browser's own cookies do, on its requests and its sockets alike (the
        benchmark's tabs share one HTTP client, so one cookie jar: the header wins)."""
        if self._pinned:
            return
        await self.load_page()

    async def load_page(self) -> None:
        """A new visitor's page load: the page (Gradio builds it, config and all, for each load) and
        the cookies the app sets with it, kept as in `pin`."""
        self._pinned = True
        response = await self.http.get(self.root + "/", headers={"Cookie": ""})  # a page load, as a browser
        response.raise_for_status()
        cookies = [f"{STICKY_COOKIE}={response.cookies.get(STICKY_COOKIE, '')}"]
        if voter := response.cookies.get(VOTER_COOKIE):
            cookies.append(f"{VOTER_COOKIE}={voter}")
        self.headers["Cookie"] = "; ".join(cookies)

    async def connect(self) -> None:
        """Open the page's socket, as live.js does when the page loads (a typed message's reply is
        begun over it, and followed)."""
        import websockets

        self._socket = await websockets.connect(self._socket_url(), max_size=None, ping_interval=None,
                                                additional_headers=self._cookie())
        self._socket_reader = asyncio.get_running_loop().create_task(self._read_socket())

    async def mount(self) -> None:
        """What the page does once loaded, before its visitor types: Gradio's client opens the
        session's heartbeat stream and runs the page's `load` events, and live.js opens the socket."""
        self._heartbeat = asyncio.get_running_loop().create_task(self._beat())
        loads = [e for (_, name), events in self.page.listeners.items() if name == "load" for e in events]
        await asyncio.gather(self.connect(), *(self.run(e) for e in loads))

    async def _beat(self) -> None:
        """Gradio's heartbeat stream for this session (open while the page is; its end closes the session)."""
        url = f"{self.base}/heartbeat/{self.session}"
        async with self.http.stream("GET", url, headers=self.headers) as response:
            async for _ in response.aiter_lines():
                pass

    async def close(self) -> None:
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        if self._socket is not None:
            await self._socket.close()
        if self._socket_reader is not None:
            await asyncio.gather(self._socket_reader, return_exceptions=True)

    async def _read_socket(self) -> None:
        async for raw in self._socket:
            event = json.loads(raw)
            watch = self.watch
            if watch is not None and event.get("type") == "delta" and event.get("id") == watch.begun:
                watch.first_delta = watch.first_delta or time.monotonic()
                watch.live += event["text"]
                watch.updates.append((time.monotonic(), self._length()))

    async def _begin(self, event: Event, data: list[Any]) -> None:
        """What live.js does as a typed message is sent: begin its reply over the socket, its id the
        turn's input `began` (when the page has that input and its socket is open)."""
        if self._socket is None or event.began is None:
            return
        message, history, preset, system_prompt, *knobs = data[:event.began]
        data[event.began] = log_id = f"live-{secrets.token_hex(16)}"
        if self.watch is not None and self.watch.component in event.outputs:
            self.watch.begun = log_id
        await self._socket.send(json.dumps({
            "type": "begin", "id": log_id, "message": message, "history": history or [], "preset": preset,
            "system_prompt": system_prompt, "sampling": dict(zip(KNOB_NAMES, knobs, strict=True)),
        }))

    def _length(self) -> int:
        """The reply's length as the page shows it: a begun reply's live text counts once its box is drawn."""
        watch = self.watch
        assert watch is not None
        shown_live = watch.begun is None or watch.box_at is not None
        return max(len(watch.text), len(watch.live) if shown_live else 0)

    def _socket_url(self) -> str:
        return self.root.replace("http://", "ws://").replace("https://", "wss://") + "/chat"

    def _cookie(self) -> dict[str, str] | None:
        """The cookies a browser sends on the page's sockets: the tab's own (`pin`), else those its
        HTTP requests carry (the client's jar: a page that pins nobody still gets the visitor's cookie,
        and its socket must be the same visitor as its turns, or a turn cannot find the reply its page began)."""
        if "Cookie" in self.headers:
            return {"Cookie": self.headers["Cookie"]}
        jar = "; ".join(f"{name}={value}" for name, value in self.http.cookies.items())
        return {"Cookie": jar} if jar else None

    def set(self, elem_id: str, value: Any) -> None:
        self.values[self.page.component(elem_id)] = value

    def get(self, elem_id: str) -> Any:
        return self.values.get(self.page.component(elem_id))

    async def trigger(self, component: int, name: str) -> None:
        """Fire a component's event, then everything it sets off; returns when all have ended."""
        await asyncio.gather(*(self.run(event, component) for event in self.page.listeners[(component, name)]))

    async def run(self, event: Event, trigger_id: int | None = None, data: list[Any] | None = None,
                  follow: bool = True) -> bool:
        """Run one event and (with `follow`) those it sets off; True when it succeeded."""
        if not event.backend:
            return True  # front-end only
        before = {c: self.values.get(c) for c in event.outputs}
        if data is None:
            data = [None if self.page.stateful(c) else self.values.get(c) for c in event.inputs]
        await self._begin(event, data)
        body = {"data": data, "fn_index": event.id, "session_hash": self.session, "event_data": None,
                "trigger_id": trigger_id}
        try:
            output = await (self._queued(event, body) if event.queue else self._direct(body))
            ok = output is not None
        except (httpx.HTTPError, ValueError) as exc:
            self.trace.errors.append(f"event {event.id}: {exc!r}")
            output, ok = None, False
        changes = []
        if ok and follow:
            changes = [c for c in event.outputs if not self.page.stateful(c) and self.values.get(c) != before[c]]
            changes += list(output.get("changed_state_ids") or [])
        then = [self.trigger(c, "change") for c in changes]
        if follow:
            then += [self.run(f, trigger_id) for f in self.page.followers[event.id]
                     if not (f.only_on_success and not ok) and not (f.only_on_failure and ok)]
        await asyncio.gather(*then)
        return ok

    # --- the two ways an event reaches the server ----------------------------------------------

    async def _direct(self, body: dict[str, Any]) -> dict[str, Any] | None:
        self.trace.direct += 1
        response = await self._post(f"{self.base}/run/predict", body)
        output = response.json()
        if response.status_code != 200 or "error" in output:
            self.trace.errors.append(f"event {body['fn_index']}: {str(output)[:300]}")
            return None
        self._apply(self.page.events[body["fn_index"]], output.get("data") or [], full=True)
        return output

    async def _queued(self, event: Event, body: dict[str, Any]) -> dict[str, Any] | None:
        self.trace.queued += 1
        watched = self.watch is not None and self.watch.component in event.outputs and event.generator
        if watched:
            self.watch.joined = time.monotonic()
        joined = await self._post(f"{self.base}/queue/join", body)
        joined.raise_for_status()
        event_id = joined.json()["event_id"]
        inbox = self._inboxes[event_id] = asyncio.Queue()
        for message in self._early.pop(event_id, []):
            inbox.put_nowait(message)
        if self._stream is None or self._stream.done():
            self._stream = asyncio.get_running_loop().create_task(self._read())
        first = True
        while True:
            message = await inbox.get()
            kind = message.get("msg")
            now = time.monotonic()
            if kind == "process_starts" and watched:
                self.watch.process_started = now
            elif kind in ("process_generating", "process_completed"):
                output = message.get("output") or {}
                if kind == "process_completed" and not message.get("success", True):
                    self.trace.errors.append(f"event {event.id}: {str(output.get('error') or output)[:300]}")
                    if watched:
                        self.watch.error, self.watch.ended = str(output.get("error") or output), now
                    return None
                # The first update of a stream and the final one carry whole values, the rest diffs.
                self._apply(event, output.get("data") or [], full=first or kind == "process_completed")
                first = False
                if watched:
                    self._shown(reply_text(self.values.get(self.watch.component)), now)
                if kind == "process_completed":
                    if watched:
                        self.watch.ended = now
                        for task in self._live.values():
                            task.cancel()
                    return output
            elif kind == "unexpected_error":
                self.trace.errors.append(f"event {event.id}: {message.get('message')}")
                return None

    def _shown(self, text: str, now: float) -> None:
        """Gradio drew the reply: its text, and a live placeholder the page's script then fills."""
        assert self.watch is not None
        found = LIVE_PLACEHOLDER.search(text)
        if found and found.group(1) == self.watch.begun:
            self.watch.box_at = self.watch.box_at or now  # followed since it was begun
        elif found and found.group(1) not in self._live:
            self._live[found.group(1)] = asyncio.get_running_loop().create_task(self._follow_live(found.group(1)))
        self.watch.text = LIVE_PLACEHOLDER.sub("", text)
        self.watch.updates.append((now, self._length()))

    async def _follow_live(self, reply_id: str) -> None:
        """What chat/ui/live.js does: follow the reply over the page's WebSocket ("watch")."""
        import websockets

        assert self.watch is not None
        url = self.root.replace("http://", "ws://").replace("https://", "wss://") + "/chat"
        async with websockets.connect(url, max_size=None, ping_interval=None, additional_headers=self._cookie()) as socket:
            await socket.send(json.dumps({"type": "watch", "id": reply_id, "after": -1}))
            async for raw in socket:
                event = json.loads(raw)
                if event.get("type") == "delta":
                    self.watch.live += event["text"]
                    self.watch.updates.append((time.monotonic(), self._length()))
                elif event.get("type") in ("done", "error"):
                    return

    async def _post(self, url: str, body: dict[str, Any]) -> httpx.Response:
        try:
            return await self.http.post(url, json=body, headers=self.headers)
        except (httpx.ReadError, httpx.RemoteProtocolError):
            # A kept-alive connection the server closed just as it was reused: a browser sends the
            # request again on a new one, and so does this tab (once).
            return await self.http.post(url, json=body, headers=self.headers)

    async def _read(self) -> None:
        """The session's event stream: every queued event's messages, handed to its inbox."""
        try:
            await self._follow()
        except Exception as exc:  # every event still waiting fails with it, rather than waiting forever
            for inbox in self._inboxes.values():
                inbox.put_nowait({"msg": "unexpected_error", "message": f"event stream: {exc!r}"})
            self._inboxes.clear()

    async def _follow(self) -> None:
        retried = False
        while self._inboxes:
            got = False
            try:
                async with self.http.stream("GET", f"{self.base}/queue/data", params={"session_hash": self.session},
                                            headers=self.headers) as r:
                    async for line in r.aiter_lines():
                        got = True
                        if line.startswith("data:") and not self._deliver(json.loads(line[5:])):
                            break
            except (httpx.ReadError, httpx.RemoteProtocolError):
                if got or retried:
                    raise
                retried = True  # a stale kept-alive connection, as in _post: open the stream again

    def _deliver(self, message: dict[str, Any]) -> bool:
        """Hand one message to its event's inbox; False when the server closes the stream."""
        if message.get("msg") == "close_stream":
            return False
        event_id = message.get("event_id")
        if event_id in self._inboxes:
            self._inboxes[event_id].put_nowait(message)
            if message.get("msg") == "process_completed":
                del self._inboxes[event_id]
        elif event_id:
            self._early[event_id].append(message)
        return True

    def _apply(self, event: Event, values: list[Any], full: bool) -> None:
        """Take an event's outputs: whole values, or diffs against what the stream sent last (which
        may be an update, e.g. a message box cleared and disabled, then enabled again)."""
        for component, value in zip(event.outputs, values, strict=False):
            if self.page.stateful(component):
                continue
            sent = value if full else patch(self._sent.get(component), value)
            self._sent[component] = sent
            if isinstance(sent, dict) and sent.get("__type__") == "update":
                if "value" in sent:
                    self.values[component] = sent["value"]
            else:
                self.values[component] = sent
