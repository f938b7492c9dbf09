"""Floods shed where the app's own server faces clients (one UI worker: uvicorn, under Gradio).

A stranger's flood must not take the descriptors, the memory or the event loop that every other
visitor needs (issue 47). Behind the front door (several UI workers, chat/front_door.py) Caddy
faces clients and limits a request's time itself; a worker then counts no address (every
connection comes from Caddy) and refuses no size (Gradio's own upload limit stays), but keeps the
body's time limit.

- **Connections per address** (`AddressCap`): an address (IPv6 by its /64, as chat/voters.py counts
  visitors) holds at most a quarter of the process's descriptor limit (256 under `ulimit -n 1024`);
  a connection beyond that is answered `503` with one sentence and closed at once, before it is
  read. A browser needs about ten; a quarter leaves the rest of the descriptors to everybody else.
- **A request head within `HEAD_WITHIN_S`** of connecting (uvicorn has no such limit: a connection
  that sends nothing was kept for good); later heads on a kept connection are uvicorn's keep-alive
  limit's (chat/ui/gradio_internals.py, item 6).
- **A request body within `BODY_WITHIN_S`** of its head, and at most `MAX_BODY_BYTES` (uploads
  `MAX_UPLOAD_BYTES`): a body declared larger is answered `413` before it is read (and what comes
  of it is dropped for up to `LINGER_S`), one that stalls `408` when its time is up (`BodyLimits`);
  either way the connection is closed.
- A client that goes away before its body has arrived is one INFO line
  (chat/ui/gradio_errors.py `body_not_received`), not Starlette's ClientDisconnect traceback.
- **The descriptor limit raised at start** (`use_descriptor_limit`, app.py): a soft limit of 1,024
  (systemd's and Docker's default, kept for programs that use select()) no longer caps the app where
  the hard limit is higher; every process the app starts inherits it, and Caddy (a Go program)
  raises its own. A hard limit is the operator's to set (docs/operating.md, Limits); with several UI
  workers the app says so at start where one address could fill it (`front_door_warning`).

uvicorn's names used here (it is Gradio's server, set up in chat/ui/gradio_internals.py, item 6):
a protocol's `server_state.connections` (the open connections, HTTP and WebSocket) and each one's
`client` (its peer address) and `cycle` (its request; None before the first head). Tested in
tests/test_shedding.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import resource
import time
from collections.abc import Callable
from typing import Any

from chat.voters import address_group

log = logging.getLogger(__name__)

HEAD_WITHIN_S = 10.0  # as Caddy's read_header (chat/front_door.py)
BODY_WITHIN_S = 10.0  # a megabyte in 10 s is 100 KB/s: a slow phone's upload
MAX_BODY_BYTES = 16 * 1024 * 1024  # far above a turn's (a message is at most 100,000 characters) or saved chats' JSON
MAX_UPLOAD_BYTES = 2 * 1024 * 1024  # the page takes no uploads; Gradio refuses a file over 1 MB (chat/server.py MAX_UPLOAD)
UPLOAD_PATH = "/gradio_api/upload"
SHARE_OF_DESCRIPTORS = 4  # an address may hold a quarter of them
REPORT_EVERY_S = 60.0
# The soft limit the app raises itself to, where the hard limit allows: as vLLM's own API server does
# (vllm.utils.system_utils.set_ulimit, 65,535), far above what four UI workers' connections need.
DESCRIPTORS_WANTED = 65536
# The most connections one address can hold open to one port: one per source port.
ONE_ADDRESS_CONNECTIONS = 65535
LINGER_S = 2.0  # how long the rest of a body refused unread is read and dropped

TOO_MANY_CONNECTIONS = "Too many connections from your address at once; close some and try again in a few seconds."
BODY_TOO_LARGE = "This request's body is larger than the {} MB this app takes."
BODY_TOO_SLOW = "This request's body did not arrive within {:.0f} s; the connection is closed."
SCOPE_KEY = "chat.body"  # what BodyLimits noted about the request, for the ClientDisconnect handler


def use_descriptor_limit() -> int:
    """Raise this process's soft limit on open files towards its hard limit (at most
    DESCRIPTORS_WANTED), as every Go program does for itself at start; returns the soft limit now.
    Nothing the app runs waits with select() (asyncio, ZeroMQ and httpcore poll), the reason for 1,024."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = DESCRIPTORS_WANTED if hard == resource.RLIM_INFINITY else min(hard, DESCRIPTORS_WANTED)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):  # macOS refuses more than kern.maxfilesperproc
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def front_door_warning(hard_limit: int) -> str | None:
    """The sentence for the operator of several UI workers whose hard limit on open files one address
    can fill: Caddy cannot cap connections per address, and an address tells its connections to one
    port apart by their source ports, so it can hold at most ONE_ADDRESS_CONNECTIONS of them."""
    if hard_limit == resource.RLIM_INFINITY or hard_limit > ONE_ADDRESS_CONNECTIONS:
        return None
    return (f"The hard limit on open files is {hard_limit:,}: with several UI workers, one address that opens that "
            "many connections keeps everyone else out until they close (the front door cannot cap them per address). "
            f"Raise it above {ONE_ADDRESS_CONNECTIONS:,} (LimitNOFILE= in systemd, --ulimit nofile= in Docker; "
            "docs/operating.md, Limits), or serve with one UI worker, which caps them per address itself.")


def connections_per_address() -> int:
    """A quarter of this process's descriptor limit (256 under a hard limit of 1,024)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 20
    return max(16, soft // SHARE_OF_DESCRIPTORS)


def plain_answer(status: str, sentence: str, *extra: str) -> bytes:
    body = (sentence + "\n").encode()
    head = [f"HTTP/1.1 {status}", "Content-Type: text/plain; charset=utf-8", f"Content-Length: {len(body)}",
            "Connection: close", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


REFUSED = plain_answer("503 Service Unavailable", TOO_MANY_CONNECTIONS, "Retry-After: 5")


class AddressCap(asyncio.Protocol):
    """The protocol uvicorn starts for each accepted connection, in front of its own: refuses a
    connection beyond the address's share, and closes one that sends no request head in time;
    otherwise hands the connection to uvicorn's protocol (`transport.set_protocol`) and steps aside."""

    def __init__(self, inner: asyncio.Protocol, cap: int, reports: dict[str, tuple[int, float]]) -> None:
        self.inner = inner
        self.cap = cap
        self.reports = reports  # address -> (connections refused since its last line, when that line was)

    def connection_made(self, transport: Any) -> None:  # uvloop's transports are not asyncio.Transport's subclasses
        peer = transport.get_extra_info("peername")
        address = address_group(str(peer[0])) if isinstance(peer, tuple) and peer else ""
        connections = self.inner.server_state.connections  # type: ignore[attr-defined]
        if address and len(connections) >= self.cap and self._held_by(address, connections) >= self.cap:
            transport.write(REFUSED)
            transport.close()
            self._report(address)
            return
        transport.set_protocol(self.inner)
        self.inner.connection_made(transport)
        asyncio.get_running_loop().call_later(HEAD_WITHIN_S, self._head_overdue, transport)

    @staticmethod
    def _held_by(address: str, connections: set[Any]) -> int:
        return sum(1 for c in list(connections) if (client := getattr(c, "client", None)) and address_group(client[0]) == address)

    def _head_overdue(self, transport: Any) -> None:
        # Still uvicorn's HTTP protocol's (an upgraded one has left the set) and no head yet.
        inner = self.inner
        if (not transport.is_closing() and inner in inner.server_state.connections  # type: ignore[attr-defined]
                and getattr(inner, "cycle", True) is None):
            transport.close()

    def _report(self, address: str) -> None:
        """An INFO line for an address's first refusal, then one a minute with the count (a flood is thousands)."""
        now = time.monotonic()
        refused, last = self.reports.get(address, (0, -REPORT_EVERY_S))
        if now - last < REPORT_EVERY_S:
            self.reports[address] = (refused + 1, last)
            return
        if refused:
            log.info("Refused %d more connection(s) from %s: %d open already", refused, address, self.cap)
        else:
            log.info("Refused a connection from %s: %d open already (refusals are counted once a minute)", address, self.cap)
        self.reports[address] = (0, now)

    # Before the hand-over nothing else reaches this protocol but a close.
    def data_received(self, data: bytes) -> None:
        pass

    def connection_lost(self, exc: Exception | None) -> None:
        pass


def capped(protocol_class: Callable[..., asyncio.Protocol], cap: int) -> Callable[..., asyncio.Protocol]:
    """uvicorn's `http_protocol_class`, with `AddressCap` in front of each connection."""
    reports: dict[str, tuple[int, float]] = {}

    def create(*args: Any, **kwargs: Any) -> asyncio.Protocol:
        return AddressCap(protocol_class(*args, **kwargs), cap, reports)

    return create


class BodyLimits:
    """ASGI wrapper outside the app: a request body must arrive within BODY_WITHIN_S of the head
    and stay under MAX_BODY_BYTES (MAX_UPLOAD_BYTES for uploads). A body declared too large gets 413
    before it is read; one that does not arrive in time is ended for the app as if the client had
    gone (Starlette raises ClientDisconnect, answered by chat/ui/gradio_errors.py) and the client
    gets 408. Both answers close the connection."""

    def __init__(self, app: Any, refuse_declared: bool = True) -> None:
        self.app = app
        # Behind the front door the sizes are left to the app (Gradio's upload limit): a worker that
        # answered before the body had arrived made Caddy reset the visitor's connection mid-upload
        # (tests/test_hostile.py).
        self.refuse_declared = refuse_declared

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = MAX_UPLOAD_BYTES if str(scope.get("path", "")).startswith(UPLOAD_PATH) else MAX_BODY_BYTES
        declared = next((value for name, value in scope.get("headers", ()) if name == b"content-length"), b"")
        if self.refuse_declared and declared.isdigit() and int(declared) > limit:
            await _refuse_unread(receive, send, BODY_TOO_LARGE.format(limit // (1024 * 1024)))
            return
        noted = scope.setdefault(SCOPE_KEY, {})
        deadline = asyncio.get_running_loop().time() + BODY_WITHIN_S
        received = 0
        complete = False

        async def limited() -> dict[str, Any]:
            nonlocal received, complete
            if complete:
                message: dict[str, Any] = await receive()  # the app waits for the client to go (a streamed answer)
                return message
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                noted["overdue"] = True
                return {"type": "http.disconnect"}
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                complete = not message.get("more_body", False)
                if received > limit and self.refuse_declared:
                    noted["too_large"] = limit
                    return {"type": "http.disconnect"}
            return message

        await self.app(scope, limited, send)


async def _refuse_unread(receive: Any, send: Any, sentence: str) -> None:
    """413 at once, then what the client still sends is read and dropped for up to LINGER_S before
    the connection closes (as nginx's lingering close): closed with its body unread, the client got a
    reset instead of the answer, if it reads only once it has sent everything (httpx does)."""
    body = (sentence + "\n").encode()
    await send({"type": "http.response.start", "status": 413,
                "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body, "more_body": True})
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while (message := await receive())["type"] == "http.request" and message.get("more_body", False):
                pass
    await send({"type": "http.response.body", "body": b""})
