"""Stream one reply from the chat API, surviving dropped connections.

    stream = ReplyStream("Write a haiku.", url="http://127.0.0.1:7860", sampling={"max_tokens": 64})
    async for text in stream:
        print(text, end="", flush=True)
    print(stream.summary)          # the stats line, as the UI shows it beneath the reply

It streams over the WebSocket at /chat. When the connection drops it reconnects with exponential
backoff and jitter and resumes the same request by id from the last delta it got, so nothing is
generated twice; after `retries` failed attempts in a row it asks once, without streaming,
through the Gradio API (/reply), which answers with the same text, stats and finish.

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

from chat.sampling import KNOBS

DEFAULT_URL = "http://127.0.0.1:7860"


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
    return float(delay / 2 + random.uniform(0, delay / 2))


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
        self.stats: dict[str, Any] | None = None  # ReplyStats.as_dict()
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
        """One non-streaming request through the Gradio API's /reply; blocking."""
        from gradio_client import Client
        from gradio_client.exceptions import AppError

        try:
            result = Client(self.url, auth=self.auth, verbose=False).predict(
                self.message, self.preset, self.system_prompt, self.sampling, self.history, api_name="/reply"
            )
        except AppError as exc:  # Gradio refused a value before our code saw it
            raise ChatApiError("refused", str(exc)) from exc
        except Exception as exc:
            raise ConnectionError(f"The chat server at {self.url} cannot be reached ({exc}).") from exc
        return self.take(result)

    def take(self, result: dict[str, Any]) -> str:
        """Read /reply's answer into this stream's fields; raise ChatApiError for a refusal."""
        if result.get("error"):
            raise ChatApiError(result["error"]["code"], result["error"]["message"])
        self.stats, self.finish, self.notice = result.get("stats"), result.get("finish"), result.get("notice")
        self.summary = stats_summary(self.stats) if self.stats else None
        return str(result.get("text") or "")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m chat.client", description="Stream one reply from the chat demo's API.")
    p.add_argument("message", help="your message")
    p.add_argument("--url", default=DEFAULT_URL, help=f"the app's address (default {DEFAULT_URL})")
    p.add_argument("--ws-url", help="the WebSocket address, if not the app's address + /chat")
    p.add_argument("--preset", help="preset name, as the UI lists it (default: the app's default)")
    p.add_argument("--system-prompt", help="instructions before the conversation (default: the preset's)")
    for knob in KNOBS:
        p.add_argument(knob.flag, type=knob.kind, help=f"{knob.help} ({knob.format(knob.minimum)} to {knob.format(knob.maximum)})")
    p.add_argument("--retries", type=int, default=5, help="reconnect attempts before the non-streaming fallback")
    p.add_argument("--auth", metavar="USER:PASSWORD", help="login, when the app was started with --auth")
    return p


async def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    sampling = {knob.name: getattr(args, knob.name) for knob in KNOBS if getattr(args, knob.name) is not None}
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
