"""Optional login, the same for the UI and the API (`--auth user:password` or CHAT_AUTH).

The UI uses Gradio's login page; the app's own routes (the WebSocket API, /metrics) accept that
login's cookie or HTTP Basic credentials. /healthz stays open for load balancers: to a stranger it
says only whether the app serves.

Failed sign-ins are counted per address (`FailedLogins`): after 10 within 5 minutes, that address
is refused for the rest of those 5 minutes, on the login page and for HTTP Basic credentials alike.
With several UI workers the front door sends each address's logins to one worker, so the count
holds for the whole app.
"""

from __future__ import annotations

import base64
import binascii
import json
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import HTTPConnection

MAX_FAILURES = 10
FAILURES_WINDOW_S = 300.0
TOO_MANY = "Too many failed sign-ins from your address; wait 5 minutes and try again."


class FailedLogins:
    """Failed sign-ins per address, over the last FAILURES_WINDOW_S."""

    def __init__(self, limit: int = MAX_FAILURES, window_s: float = FAILURES_WINDOW_S) -> None:
        self.limit, self.window_s = limit, window_s
        self._times: dict[str, deque[float]] = {}

    def _recent(self, address: str) -> deque[float]:
        times = self._times.setdefault(address, deque())
        while times and time.monotonic() - times[0] > self.window_s:
            times.popleft()
        if not times:
            del self._times[address]
            return deque()
        return times

    def blocked(self, address: str) -> bool:
        return len(self._recent(address)) >= self.limit

    def failed(self, address: str) -> None:
        self._recent(address)
        self._times.setdefault(address, deque()).append(time.monotonic())


FAILED = FailedLogins()


def address_of(connection: Any) -> str:
    client = getattr(connection, "client", None)
    return str(getattr(client, "host", "") or "")


class LoginLimit:
    """ASGI middleware: refuses Gradio's login form (POST /login) from an address with too many
    failed sign-ins, and counts the failures it answers."""

    def __init__(self, app: Any, failures: FailedLogins = FAILED) -> None:
        self.app, self.failures = app, failures

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path", "").rstrip("/") != "/login":
            await self.app(scope, receive, send)
            return
        address = str((scope.get("client") or ("",))[0])
        if self.failures.blocked(address):
            body = json.dumps({"detail": TOO_MANY}).encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return

        async def counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] in (400, 401):
                self.failures.failed(address)
            await send(message)

        await self.app(scope, receive, counted)


def _no_page_login(connection: HTTPConnection) -> bool:
    return False


@dataclass(frozen=True)
class Login:
    accounts: tuple[tuple[str, str], ...]
    # Whether a request carries the cookie of a sign-in on the UI's login page. The UI says (the
    # cookie's names are its web framework's, chat/ui/gradio_internals.py); this layer does not look up.
    signed_in_on_page: Callable[[HTTPConnection], bool] = _no_page_login

    @classmethod
    def parse(cls, spec: str | None,
              signed_in_on_page: Callable[[HTTPConnection], bool] = _no_page_login) -> Login | None:
        """'user:password[,user2:password2]' -> Login; empty -> None (no login)."""
        if not spec:
            return None
        accounts = []
        for item in spec.split(","):
            user, sep, password = item.strip().partition(":")
            if not sep or not user or not password:
                raise ValueError("--auth takes user:password pairs separated by commas, e.g. demo:s3cret.")
            accounts.append((user, password))
        return cls(tuple(accounts), signed_in_on_page)

    def check(self, user: str, password: str) -> bool:
        return any(
            secrets.compare_digest(user, known_user) & secrets.compare_digest(password, known_password)
            for known_user, known_password in self.accounts
        )

    def allows(self, connection: HTTPConnection) -> bool:
        """True for HTTP Basic credentials that match, or the cookie of a UI login."""
        header = connection.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            address = address_of(connection)
            if FAILED.blocked(address):
                return False
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user = password = ""
            if self.check(user, password):
                return True
            FAILED.failed(address)
            return False
        return self.signed_in_on_page(connection)
