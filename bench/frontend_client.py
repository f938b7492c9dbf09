"""Readers of the app for the front-end benchmark: many chat turns at once, through one of three doors.

  browser  the Chat tab's own events, as a browser fires them on Enter (bench/gradio_browser.py),
           and the reply's live text over the WebSocket, as the page's script follows it;
  api      ChatInterface's public /chat endpoint through Gradio's queue (what bench/run.py and
           bench/gpu.py call "app": the same handler, without the Chatbot's per-update work);
  ws       the app's own WebSocket API at /chat (bench/http_client.py).

Each turn is a new session (a new tab) that may first be given earlier turns: the page's chat is
loaded with them and the server's copy synchronised, as after turns taken in that tab (a reader's
first tab gets them before the burst starts: its person has the conversation open already). Closed
loop: `concurrency` readers, each starting its next turn when the last has ended, optionally split
over client processes. Every turn comes back as a `Turn`, with the moments its reply grew.
"""

from __future__ import annotations

import asyncio
import copy
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing import get_context
from typing import Any

import httpx

from bench.gradio_browser import Tab, Watch
from bench.gradio_page import Page, load_page, message_text
from bench.gradio_stream import http_client
from bench.start_line import START_S, start_line, wait_at
from chat.shedding import use_descriptor_limit

TURN_TIMEOUT_S = 900.0  # a turn that takes longer counts as an error (and cannot hang a run)


@dataclass
class Turn:
    """What one reader saw of one chat turn (monotonic seconds, the machine's clock)."""

    index: int
    started: float  # Enter pressed / request sent
    updates: list[tuple[float, int]] = field(default_factory=list)  # (when, reply length) per update received
    text: str = ""
    joined: float | None = None  # the reply's event was sent to Gradio's queue
    process_started: float | None = None  # ... and Gradio began running it
    ended: float | None = None  # the reply's stream ended
    done: float | None = None  # every event of the turn ended
    requests: int = 0  # HTTP requests the turn made (stream connections not counted)
    error: str | None = None
    # A page's moments by name (monotonic): a new visitor's arrival, page load and mount (the
    # "visitor" door), the begun reply's first text on the socket and the drawing of its box.
    marks: dict[str, float] = field(default_factory=dict)
    begun: str | None = None  # the id of the reply the page began over its socket


@dataclass
class Request:
    """One turn to take: the message, the earlier turns, and the page's settings."""

    message: str
    max_tokens: int
    history: list[dict[str, Any]] = field(default_factory=list)  # the chat as the page holds it
    settings: dict[str, Any] = field(default_factory=dict)  # elem_id -> value (sliders, preset, ...)


def plain_history(history: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The chat as a model reads it (role and text), without the app's annotations."""
    return [{"role": m["role"], "content": message_text(m)} for m in history
            if m.get("role") in ("user", "assistant") and not (m.get("metadata") or {}).get("title")]


def page_history(plain: list[dict[str, str]], turn: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The inverse of `plain_history`: earlier turns (user, assistant, ...) as the page holds them,
    each shaped like `turn`, one turn as a page holds it (`capture_chat`: the message, the reply,
    the app's annotations beneath it, in Gradio's form), with the turn's texts put in."""
    out: list[dict[str, Any]] = []
    for question, answer in zip(plain[::2], plain[1::2], strict=True):
        texts = {"user": question["content"], "assistant": answer["content"]}
        for message in copy.deepcopy(turn):
            role = message.get("role")
            if role in texts and not (message.get("metadata") or {}).get("title"):
                content = message.get("content")
                parts = [p for p in content if isinstance(p, dict) and p.get("type") == "text"] if isinstance(content, list) else []
                message["content"] = [{**parts[0], "text": texts.pop(role)}] if parts else texts.pop(role)
            out.append(message)
        if texts:
            raise ValueError(f"the captured turn has no {' or '.join(texts)} message to shape the earlier turns by")
    return out


async def _seed(tab: Tab, history: list[dict[str, Any]]) -> None:
    """Give the tab earlier turns: the chat shows them and the server's session holds them."""
    chatbot = tab.page.component("chatbot")
    tab.values[chatbot] = copy.deepcopy(history)  # the tab patches its values in place
    for component, kind in tab.page.types.items():
        if kind == "browserstate":  # save_history: the browser's saved conversations include this one
            tab.values[component] = [copy.deepcopy(history)]
    sync = next(e for e in tab.page.events.values()
                if e.backend and not e.queue and e.inputs == (chatbot,) and all(tab.page.stateful(c) for c in e.outputs))
    if not await tab.run(sync, follow=False):  # what it sets off ran after those earlier turns
        raise RuntimeError(f"seeding the history failed: {tab.trace.errors}")


async def open_tab(http: httpx.AsyncClient, url: str, page: Page, protocol: str,
                   history: list[dict[str, Any]] | None = None) -> Tab:
    """A tab with its page loaded (and so its UI worker's cookie), before its turn's clock starts;
    with `history`, its chat holds those earlier turns."""
    tab = Tab(http, url, page, program=protocol == "api")
    await tab.pin()
    if protocol == "browser":  # "browser-late": a page whose socket is not open yet (its turn starts the reply)
        await tab.connect()
    if history:
        await _seed(tab, history)
    return tab


async def browser_turn(http: httpx.AsyncClient, url: str, page: Page, index: int, request: Request,
                       tab: Tab | None = None, protocol: str = "browser", holds_history: bool = False) -> Turn:
    """`holds_history`: `tab` holds the request's earlier turns already (`open_tab`)."""
    tab = tab or await open_tab(http, url, page, protocol)
    for elem_id, value in request.settings.items():
        tab.set(elem_id, value)
    if request.history and not holds_history:
        await _seed(tab, request.history)
    seeded = tab.trace.direct + tab.trace.queued
    tab.set("message", request.message)
    watch = tab.watch = Watch(page.component("chatbot"), started=time.monotonic())
    try:
        await tab.trigger(page.component("message"), "submit")
    finally:
        await tab.close()  # the tab is done with: its page closes
    return _turn(index, tab, watch, seeded)


async def api_turn(http: httpx.AsyncClient, url: str, page: Page, index: int, request: Request,
                   tab: Tab | None = None, holds_history: bool = False) -> Turn:
    tab = tab or await open_tab(http, url, page, "api")
    if request.history and not holds_history:
        await _seed(tab, request.history)
    seeded = tab.trace.direct + tab.trace.queued
    event = page.api("chat")
    settings = {page.component(k): v for k, v in request.settings.items()}
    data = [request.message if i == 0 else None if page.stateful(c) else settings.get(c, page.initial.get(c))
            for i, c in enumerate(event.inputs)]
    watch = tab.watch = Watch(event.outputs[0], started=time.monotonic())
    await tab.run(event, data=data)
    return _turn(index, tab, watch, seeded)


async def visitor_turn(http: httpx.AsyncClient, url: str, page: Page, index: int, request: Request) -> Turn:
    """A new visitor: loads the page, which mounts (heartbeat, load events, socket), then sends the
    message as soon as the page is ready (open loop: bench/frontend_rates.py)."""
    arrived = time.monotonic()
    tab = Tab(http, url, page)
    try:
        await tab.load_page()
        page_loaded = time.monotonic()
        await tab.mount()
    except BaseException:
        await tab.close()
        raise
    turn = await browser_turn(http, url, page, index, request, tab)
    turn.marks.update(arrived=arrived, page_loaded=page_loaded)
    return turn


def _turn(index: int, tab: Tab, watch: Watch, seeded: int) -> Turn:
    turn = Turn(index, watch.started, joined=watch.joined, process_started=watch.process_started, ended=watch.ended,
                done=time.monotonic(), requests=tab.trace.direct + tab.trace.queued - seeded, begun=watch.begun)
    turn.marks.update({k: v for k, v in (("box", watch.box_at), ("first_delta", watch.first_delta)) if v is not None})
    turn.updates, turn.text = list(watch.updates), watch.text
    turn.error = watch.error or ("; ".join(tab.trace.errors) or None) or (None if watch.ended else "no reply")
    return turn


async def ws_turn(url: str, index: int, request: Request, preset: str, sampling: dict[str, Any]) -> Turn:
    from bench.http_client import _one_ws

    messages = [*plain_history(request.history), {"role": "user", "content": request.message}]
    body = {"type": "chat", "preset": preset, "sampling": {**sampling, "max_tokens": request.max_tokens},
            "messages": messages}
    reply = await _one_ws(url.replace("http://", "ws://").rstrip("/") + "/chat", index, body)
    return Turn(index, reply.started, list(reply.updates), reply.text, ended=reply.updates[-1][0] if reply.updates else None,
                done=time.monotonic(), requests=1, error=reply.error or (None if reply.completed else "not completed"))


def _take(http: httpx.AsyncClient, url: str, page: Page | None, protocol: str, index: int, request: Request,
          ws: dict[str, Any], tab: Tab | None = None) -> Any:
    """One turn through `protocol`'s door (a coroutine); `tab`: one already open for it, holding the
    request's earlier turns."""
    if protocol == "visitor":
        return visitor_turn(http, url, page, index, request)
    if protocol in ("browser", "browser-late"):
        return browser_turn(http, url, page, index, request, tab, protocol, holds_history=tab is not None)
    if protocol == "api":
        return api_turn(http, url, page, index, request, tab, holds_history=tab is not None)
    return ws_turn(url, index, request, ws["preset"], ws["sampling"])


async def _timed(one: Any, index: int) -> Turn:
    started = time.monotonic()
    try:
        return await asyncio.wait_for(one, TURN_TIMEOUT_S)
    except Exception as exc:  # noqa: BLE001 - counted as an error by the caller
        return Turn(index, started, error=repr(exc))


async def _closed(url: str, protocol: str, work: list[tuple[int, Request]], concurrency: int,
                  ws: dict[str, Any], line: Any = None) -> list[Turn]:
    """Each reader's first tab loads its page, with its first turn's earlier turns, before the burst
    starts (people who press Enter together already have the page, and their conversation, open);
    later turns open their tab in their reader's time."""
    if not work:
        return []
    async with http_client(concurrency) as http:
        page = await load_page(http, url) if protocol != "ws" else None
        readers = max(1, min(concurrency, len(work)))
        firsts, todo = list(work[:readers]), list(work[readers:])
        out: list[Turn] = []
        first_tabs: list[Tab | None] = [None] * readers
        if page is not None and protocol != "visitor":  # a new visitor loads the page in its own time
            first_tabs = list(await asyncio.gather(*(open_tab(http, url, page, protocol, request.history)
                                                     for _, request in firsts)))
        await wait_at(line)

        async def reader(first: tuple[int, Request], tab: Tab | None) -> None:
            index, request = first
            while True:
                out.append(await _timed(_take(http, url, page, protocol, index, request, ws, tab), index))
                if not todo:
                    return
                index, request = todo.pop(0)
                tab = None

        await asyncio.gather(*(reader(first, tab) for first, tab in zip(firsts, first_tabs, strict=True)))
        return out


async def _open(url: str, protocol: str, work: list[tuple[int, Request]], rate: float,
                ws: dict[str, Any], line: Any = None) -> list[Turn]:
    """Open loop: turn i starts at t0 + i / rate, whatever the server's state (arrivals, not readers).
    t0 is set once every client process is ready (its imports and the page's config loaded): one that
    started late would otherwise send all the turns it is behind on at once, a burst the raw engine's
    client never sends (it bunched a rate's first 11-37 arrivals into 20 ms on the H200, 2026-12-06)."""
    async with http_client(len(work)) as http:
        page = await load_page(http, url) if protocol != "ws" else None
        await wait_at(line)
        t0 = time.monotonic() + START_S

        async def arrive(index: int, request: Request) -> Turn:
            await asyncio.sleep(max(0.0, t0 + index / rate - time.monotonic()))
            turn = await _timed(_take(http, url, page, protocol, index, request, ws), index)
            turn.marks["due"] = t0 + index / rate
            return turn

        return list(await asyncio.gather(*(arrive(i, r) for i, r in work)))


def _shard(url: str, protocol: str, work: list[tuple[int, Request]], concurrency: int,
           ws: dict[str, Any], rate: float | None = None, line: Any = None) -> list[dict[str, Any]]:
    use_descriptor_limit()
    if rate:
        return [asdict(t) for t in asyncio.run(_open(url, protocol, work, rate, ws, line))]
    return [asdict(t) for t in asyncio.run(_closed(url, protocol, work, concurrency, ws, line))]


def take_turns(url: str, protocol: str, requests: list[Request], *, concurrency: int, procs: int = 1,
               ws: dict[str, Any] | None = None, rate: float | None = None) -> list[Turn]:
    """Every request taken once as a turn, `concurrency` at a time, or with `rate`, arriving at that
    many a second (open loop); turns in request order.
    `ws`: the preset name and sampling values the WebSocket requests carry."""
    work = list(enumerate(requests))
    procs = max(1, min(procs, len(work) if rate else concurrency, len(work)))
    if procs == 1:
        turns = _shard(url, protocol, work, concurrency, ws or {}, rate)
    else:
        readers = [len(range(i, concurrency, procs)) for i in range(procs)]
        with start_line(procs) as line, ProcessPoolExecutor(procs, mp_context=get_context("spawn")) as pool:
            futures = [pool.submit(_shard, url, protocol, work[i::procs], readers[i], ws or {}, rate, line)
                       for i in range(procs)]
            turns = [t for f in futures for t in f.result()]
    return sorted((Turn(**{**t, "updates": [tuple(u) for u in t["updates"]]}) for t in turns), key=lambda t: t.index)


def capture_chat(url: str, request: Request) -> list[dict[str, Any]]:
    """One turn in a tab (browser door); the chat as the page then holds it (messages and the
    app's annotations), to make earlier turns of."""

    async def go() -> list[dict[str, Any]]:
        async with http_client(1) as http:
            page = await load_page(http, url)
            tab = Tab(http, url, page)
            await tab.pin()
            for elem_id, value in request.settings.items():
                tab.set(elem_id, value)
            tab.set("message", request.message)
            await tab.trigger(page.component("message"), "submit")
            if tab.trace.errors:
                raise RuntimeError(f"the turn failed: {tab.trace.errors}")
            return tab.get("chatbot")

    return asyncio.run(go())
