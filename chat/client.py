"""Stream one reply from the chat API, surviving dropped connections.

    stream = ReplyStream("Write a haiku.", url="http://127.0.0.1:7860", sampling={"max_tokens": 64})
    async for text in stream:
        print(text, end="", flush=True)
    print(stream.summary)          # the stats line, as the UI shows it beneath the reply

It streams over the WebSocket at /chat. When the connection drops it reconnects with exponential
backoff and jitter and resumes the same request by id from the last delta it got, so nothing is
generated twice; after `retries` failed attempts in a row it asks once, without streaming,
through the Gradio API (/chat), which sends only the new message and the system prompt.

    python -m chat.client "Hello" --url http://127.0.0.1:7860 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import random
import sys
import uuid
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

DEFAULT_URL = "http://127.0.0.1:7860"
STATS_MARK = "📊 "
PROBLEM_MARK = "⚠️ "


class ChatApiError(Exception):
    """The server refused or failed the request; `message` is its plain sentence."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{message} ({code})")
        self.code = code
        self.message = message


def websocket_url(url: str) -> str:
    """ws(s)://host/chat for the app at http(s)://host/."""
    parts = urlsplit(url)
    scheme = {"https": "wss", "wss": "wss"}.get(parts.scheme, "ws")
    return urlunsplit((scheme, parts.netloc, parts.path.rstrip("/") + "/chat", "", ""))


def backoff_s(attempt: int, base_s: float = 0.5, cap_s: float = 8.0) -> float:
    """Wait before reconnect `attempt` (1, 2, …): doubling, capped, with jitter so clients spread out."""
    delay = min(cap_s, base_s * 2 ** (attempt - 1))
    return delay / 2 + random.uniform(0, delay / 2)


def stats_summary(stats: dict[str, Any]) -> str:
    """The UI's one-line stats from the API's stats dict."""
    from chat.stats import ReplyStats

    return ReplyStats.from_dict(stats).summary()


class ReplyStream:
    """One reply: iterate for the text as it arrives; then `stats`, `finish` and `summary` are set."""

    def __init__(
        self,
        message: str,
        *,
        url: str = DEFAULT_URL,
        ws_url: str | None = None,
        preset: str | None = None,
        system_prompt: str | None = None,
        history: Sequence[dict[str, str]] = (),
        sampling: dict[str, float | int] | None = None,
        request_id: str | None = None,
        auth: tuple[str, str] | None = None,
        retries: int = 5,
        open_timeout_s: float = 10.0,
    ) -> None:
        self.message = message
        self.url = url
        self.ws_url = ws_url or websocket_url(url)
        self.preset = preset
        self.system_prompt = system_prompt
        self.history = list(history)
        self.sampling = dict(sampling or {})
        self.id = request_id or f"client-{uuid.uuid4().hex}"
        self.auth = auth  # user and password, when the app was started with --auth
        self.retries = retries
        self.open_timeout_s = open_timeout_s
        self.text = ""
        self.status: str | None = None  # the latest progress line while an engine starts
        self.stats: dict[str, Any] | None = None  # ReplyStats.as_dict(); None after the fallback
        self.finish: str | None = None
        self.summary: str | None = None
        self.notice: str | None = None  # a plain sentence that came with the reply (e.g. why it timed out)
        self.via: str | None = None  # "websocket" or "gradio"
        self.reconnects = 0
        self.restarted = False  # the fallback began again after some text had been yielded
        self._last_index = -1
        self._sent = False
        self._events = 0  # events received, over all connections

    def request(self) -> dict[str, Any]:
        messages = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        messages += [*self.history, {"role": "user", "content": self.message}]
        body: dict[str, Any] = {"type": "chat", "id": self.id, "messages": messages, "sampling": self.sampling}
        if self.preset:
            body["preset"] = self.preset
        return body

    async def __aiter__(self) -> AsyncIterator[str]:
        import websockets

        failures = 0
        while True:
            events_before = self._events
            try:
                async for text in self._stream_once(websockets):
                    yield text
                if self.finish is not None:
                    self.via = "websocket"
                    return
            except (OSError, TimeoutError, websockets.ConnectionClosed, websockets.InvalidHandshake):
                pass
            failures = 1 if self._events > events_before else failures + 1  # count failures in a row
            if failures > self.retries:
                break
            self.reconnects += 1
            await asyncio.sleep(backoff_s(failures))
        text = await asyncio.to_thread(self._predict)
        self.restarted = bool(self.text)
        self.text = text
        self.via = "gradio"
        yield text

    async def _stream_once(self, websockets: Any) -> AsyncIterator[str]:
        """One connection: send (or resume) the request and yield new text until done or dropped."""
        headers = {}
        if self.auth:
            headers["Authorization"] = "Basic " + base64.b64encode(":".join(self.auth).encode()).decode()
        async with websockets.connect(
            self.ws_url, additional_headers=headers, open_timeout=self.open_timeout_s, max_size=2**24
        ) as ws:
            if self._sent:
                await ws.send(json.dumps({"type": "resume", "id": self.id, "after": self._last_index}))
            else:
                await ws.send(json.dumps(self.request()))
                self._sent = True
            async for raw in ws:
                event = json.loads(raw)
                if event.get("id") != self.id:
                    continue
                self._events += 1
                kind = event.get("type")
                if kind == "delta":
                    if event["index"] != self._last_index + 1:
                        continue  # already seen (a resume replays from where we said)
                    self._last_index = event["index"]
                    self.text += event["text"]
                    yield event["text"]
                elif kind == "progress":
                    self.status = event["status"]
                elif kind == "stats":
                    self.stats = event["stats"]
                    self.summary = stats_summary(event["stats"])
                elif kind == "done":
                    self.finish = event["finish"]
                    self.notice = event.get("notice")
                    return
                elif kind == "error":
                    if event["code"] == "unknown_id" and self._last_index < 0:
                        # the request never reached the server before the drop: send it again
                        await ws.send(json.dumps(self.request()))
                        continue
                    raise ChatApiError(event["code"], event["message"])

    def _predict(self) -> str:
        """One non-streaming request through the Gradio API; blocking."""
        from gradio_client import Client
        from gradio_client.exceptions import AppError

        values: dict[str, Any] = dict(self.sampling)
        if self.preset:
            values["preset_name"] = self.preset
        if self.system_prompt is not None:
            values["system_prompt"] = self.system_prompt
        try:
            messages = Client(self.url, auth=self.auth, verbose=False).predict(self.message, **values, api_name="/chat")
        except AppError as exc:  # Gradio refused a value, e.g. a preset that is not in its list
            raise ChatApiError("refused", str(exc)) from exc
        except Exception as exc:
            raise ConnectionError(f"The chat server at {self.url} cannot be reached ({exc}).") from exc
        text, self.summary, self.finish, self.notice = read_reply(messages)
        return text


def read_reply(messages: list[dict[str, Any]]) -> tuple[str, str, str, str | None]:
    """The text, stats line, finish and notice of a reply the Gradio API returned as messages.

    The last message's title is the stats line; "⚠️ sentence" alone is a refusal (raised), and
    "⚠️ sentence · stats line" a reply that ended early (a timeout) with what it wrote.
    """
    from chat.stats import Finish

    text = "".join(m["content"] for m in messages if not (m.get("metadata") or {}).get("title"))
    title = (messages[-1].get("metadata") or {}).get("title", "") if messages else ""
    notice = None
    if title.startswith(PROBLEM_MARK):
        notice, _, title = title.removeprefix(PROBLEM_MARK).partition(" · ")
        if not title:
            raise ChatApiError("error", notice)
    summary = title.removeprefix(STATS_MARK)
    finish = next((f.name.lower() for f in Finish if summary.endswith(f.value)), "unknown")
    return text, summary, finish, notice


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chat.client", description="Stream one reply from the chat demo's API.")
    p.add_argument("message", help="your message")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the app's address (default {DEFAULT_URL})")
    p.add_argument("--ws-url", help="the WebSocket address, if not the app's address + /chat")
    p.add_argument("--preset", help="preset name, as the UI lists it (default: the app's default)")
    p.add_argument("--system-prompt", help="instructions before the conversation (default: the preset's)")
    p.add_argument("--temperature", type=float)
    p.add_argument("--top-p", type=float)
    p.add_argument("--top-k", type=int)
    p.add_argument("--max-tokens", type=int)
    p.add_argument("--repetition-penalty", type=float)
    p.add_argument("--seed", type=int)
    p.add_argument("--retries", type=int, default=5, help="reconnect attempts before the non-streaming fallback")
    p.add_argument("--auth", metavar="USER:PASSWORD", help="login, when the app was started with --auth")
    return p


async def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    knobs = ("temperature", "top_p", "top_k", "max_tokens", "repetition_penalty", "seed")
    sampling = {name: getattr(args, name) for name in knobs if getattr(args, name) is not None}
    stream = ReplyStream(
        args.message, url=args.url, ws_url=args.ws_url, preset=args.preset,
        system_prompt=args.system_prompt, sampling=sampling, retries=args.retries,
        auth=tuple(args.auth.split(":", 1)) if args.auth else None,
    )
    try:
        async for text in stream:
            if stream.restarted:
                print("\n[the connection was lost; the complete reply follows]", file=sys.stderr)
            print(text, end="", flush=True)
    except ChatApiError as exc:
        print(f"\n{exc.message}", file=sys.stderr)
        return 1
    except ConnectionError as exc:
        print(f"\n{exc}", file=sys.stderr)
        return 2
    print()
    if stream.notice:
        print(stream.notice, file=sys.stderr)
    print(stream.summary or stream.finish, file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
