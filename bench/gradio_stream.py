"""A small asyncio client for Gradio's streaming queue protocol, the one the browser speaks.

One `GradioChat` per server; each `chat()` call is its own browser-like session: it joins the
queue, reads the server-sent events of that session, and records when each update arrived.
It can also leave early the way a reader does: by cancelling (the Stop of Gradio's own API) or
by dropping the connection (a closed tab). Used by the load test and the benchmark.
"""

from __future__ import annotations

import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from gradio_client.utils import apply_diff

Leave = Literal["cancel", "disconnect"]

# What gradio_client says of itself: the app streams text through Gradio to programs (chat/ui/live_script.py).
PROGRAM = {"x-gradio-user": "api"}
# Gradio's server (uvicorn) closes a connection idle for 5 s unless told otherwise, and httpx keeps one
# for 5 s: a request sent on it just then is reset unanswered (httpx.ReadError; failed CI once, in
# test_load). A browser sends such a request again; httpx does not, so these clients drop an idle
# connection first, whichever Gradio app they measure (this one keeps one 20 s: chat/ui/gradio_internals.py).
IDLE_CONNECTION_S = 2.0


def http_client(concurrency: int, timeout_s: float = 900.0) -> httpx.AsyncClient:
    """An httpx client for `concurrency` readers at once: each holds a stream and may send one more
    request beside it (a cancel, a page's next event)."""
    limits = httpx.Limits(max_connections=4 * concurrency + 8, max_keepalive_connections=2 * concurrency + 4,
                          keepalive_expiry=IDLE_CONNECTION_S)
    return httpx.AsyncClient(timeout=httpx.Timeout(timeout_s), limits=limits)


@dataclass
class ChatResult:
    started: float  # monotonic, when the request was sent
    updates: list[tuple[float, int]] = field(default_factory=list)  # (monotonic, reply length)
    messages: list[dict[str, Any]] = field(default_factory=list)  # the last value seen
    completed: bool = False
    error: str | None = None
    process_started: float | None = None  # monotonic, when the server began running the handler

    @property
    def text(self) -> str:
        return "".join(m["content"] for m in self.messages if not (m.get("metadata") or {}).get("title"))

    @property
    def title(self) -> str:
        return (self.messages[-1].get("metadata") or {}).get("title", "") if self.messages else ""

    @property
    def first_text_at(self) -> float | None:
        return next((t for t, length in self.updates if length), None)


class GradioChat:
    def __init__(self, http: httpx.AsyncClient, base_url: str, api_name: str = "chat") -> None:
        self.http = http
        self.base = base_url.rstrip("/") + "/gradio_api"
        self.api_name = api_name
        self._fn_index: int | None = None

    async def fn_index(self) -> int:
        if self._fn_index is None:
            config = (await self.http.get(self.base.removesuffix("/gradio_api") + "/config")).json()
            matches = [d["id"] for d in config["dependencies"] if d.get("api_name") == self.api_name]
            if not matches:
                raise LookupError(f"no endpoint named {self.api_name!r}")
            self._fn_index = matches[0]
        return self._fn_index

    async def chat(self, data: list[Any], *, leave: Leave | None = None, leave_after: int = 2) -> ChatResult:
        """Send one message (`data` in the endpoint's order) and follow its stream to the end,
        or leave after `leave_after` updates with text."""
        fn_index = await self.fn_index()
        session = secrets.token_hex(8)
        result = ChatResult(started=time.monotonic())
        joined = await self.http.post(
            f"{self.base}/queue/join",
            json={"data": data, "fn_index": fn_index, "session_hash": session, "event_data": None, "trigger_id": None},
            headers=PROGRAM,
        )
        joined.raise_for_status()
        event_id = joined.json()["event_id"]
        outputs: list[Any] | None = None  # the endpoint's output values, rebuilt from Gradio's diffs
        async with self.http.stream("GET", f"{self.base}/queue/data", params={"session_hash": session}) as response:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                message = json.loads(line[5:])
                kind = message.get("msg")
                if kind == "process_starts":
                    result.process_started = time.monotonic()
                elif kind in ("process_generating", "process_completed"):
                    output = message.get("output") or {}
                    if kind == "process_completed" and not message.get("success", True):
                        result.error = str(output.get("error") or output)
                        return result
                    values = output.get("data") or []
                    if kind == "process_completed" or outputs is None:
                        outputs = values
                    else:  # later updates carry a list of edits per output
                        outputs = [apply_diff(old, edits) for old, edits in zip(outputs, values, strict=True)]
                    reply = outputs[0] if outputs else None
                    if isinstance(reply, list):
                        result.messages = reply
                    elif isinstance(reply, str):  # a ChatInterface whose function yields plain text
                        result.messages = [{"role": "assistant", "content": reply}]
                    result.updates.append((time.monotonic(), len(result.text)))
                    if kind == "process_completed":
                        result.completed = True
                        return result
                    if leave and sum(1 for _, length in result.updates if length) >= leave_after:
                        if leave == "cancel":
                            await self.http.post(
                                f"{self.base}/cancel",
                                json={"session_hash": session, "fn_index": fn_index, "event_id": event_id},
                            )
                        return result  # leaving the `async with` drops the connection
                elif kind == "close_stream":
                    return result
        return result
