"""Optional login, the same for the UI and the API (`--auth user:password` or CHAT_AUTH).

The UI uses Gradio's login page; the app's own routes (the WebSocket API, /metrics) accept that
login's cookie or HTTP Basic credentials. /healthz stays open for load balancers: to a stranger it
says only whether the app serves.

Failed sign-ins are counted for the whole app (chat/tallies.py: in the engine owner when there are
several UI workers), by address (an IPv6 address by its /64) and by user name: after 10 from one
address within 5 minutes, that address is refused for the rest of those 5 minutes; after 50 for one
of the login's user names, from any addresses, so is that name (a guesser with many addresses gets no
more tries; the price is that such a guesser can keep the name's owner out for 5 minutes, which the
log says). Refused on the login page and for HTTP Basic credentials alike.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import secrets
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.requests import HTTPConnection

from chat.tallies import AppTallies, InProcess
from chat.voters import address_group

log = logging.getLogger(__name__)

MAX_FAILURES = 10  # from one address
MAX_FAILURES_PER_USER = 50  # for one user name, from every address together
FAILURES_WINDOW_S = 300.0
TOO_MANY = "Too many failed sign-ins from your address; wait 5 minutes and try again."
TOO_MANY_FOR_USER = "Too many failed sign-ins for this user name lately; wait 5 minutes and try again."
MAX_FORM_BYTES = 64 * 1024  # a login form is two short fields; a bigger one is read no further


class FailedLogins:
    """Failed sign-ins over the last FAILURES_WINDOW_S, by address and by (known) user name."""

    def __init__(self, tallies: AppTallies, users: frozenset[str] = frozenset(), per_address: int = MAX_FAILURES,
                 per_user: int = MAX_FAILURES_PER_USER, window_s: float = FAILURES_WINDOW_S) -> None:
        self.tallies, self.users = tallies, users
        self.per_address, self.per_user, self.window_s = per_address, per_user, window_s

    def _keys(self, address: str, user: str | None) -> list[tuple[str, int, str]]:
        keys = [(f"login-address:{address_group(address)}", self.per_address, TOO_MANY)]
        if user in self.users:  # only the login's own names: a stranger's made-up ones would pile up
            keys.append((f"login-user:{user}", self.per_user, TOO_MANY_FOR_USER))
        return keys

    async def refusal(self, address: str, user: str | None = None) -> str | None:
        """Why a sign-in from `address` (as `user`, where known) is refused now; None if it is not."""
        for key, limit, sentence in self._keys(address, user):
            if await self.tallies.recent(key, self.window_s) >= limit:
                return sentence
        return None

    async def failed(self, address: str, user: str | None = None) -> None:
        for key, limit, _ in self._keys(address, user):
            if await self.tallies.add(key, self.window_s) == limit and key.startswith("login-user:"):
                log.warning("%d failed sign-ins for user %r within %.0f minutes; that name is refused for a while.",
                            limit, user, self.window_s / 60)


def address_of(connection: Any) -> str:
    client = getattr(connection, "client", None)
    return str(getattr(client, "host", "") or "")


class LoginLimit:
    """ASGI middleware: refuses Gradio's login form (POST /login) from an address, or for a user name,
    with too many failed sign-ins, and counts the failures it answers."""

    def __init__(self, app: Any, failures: FailedLogins) -> None:
        self.app, self.failures = app, failures

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope.get("method") != "POST" or scope.get("path", "").rstrip("/") != "/login":
            await self.app(scope, receive, send)
            return
        address = str((scope.get("client") or ("",))[0])
        body, complete = await _read_form(receive)
        user = _form_user(body) if complete else None
        if (refusal := await self.failures.refusal(address, user)) is not None:
            payload = json.dumps({"detail": refusal}).encode()
            await send({"type": "http.response.start", "status": 429,
                        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        sent = False

        async def replay() -> dict[str, Any]:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": not complete}
            return dict(await receive())

        async def counted(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] in (400, 401):
                await self.failures.failed(address, user)
            await send(message)

        await self.app(scope, replay, counted)


async def _read_form(receive: Any) -> tuple[bytes, bool]:
    """The request's body up to MAX_FORM_BYTES, and whether that is all of it."""
    body = b""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return body, False
        body += message.get("body", b"")
        if not message.get("more_body", False):
            return body, True
        if len(body) > MAX_FORM_BYTES:
            return body, False


def _form_user(body: bytes) -> str | None:
    try:
        values = urllib.parse.parse_qs(body.decode(), max_num_fields=8)
    except (UnicodeDecodeError, ValueError):
        return None
    user = values.get("username", [None])[0]
    return user if isinstance(user, str) else None


def _no_page_login(connection: HTTPConnection) -> bool:
    return False


@dataclass(frozen=True)
class Login:
    accounts: tuple[tuple[str, str], ...]
    # Whether a request carries the cookie of a sign-in on the UI's login page. The UI says (the
    # cookie's names are its web framework's, chat/ui/gradio_internals.py); this layer does not look up.
    signed_in_on_page: Callable[[HTTPConnection], bool] = _no_page_login
    failures: FailedLogins = field(default_factory=lambda: FailedLogins(InProcess()))

    @classmethod
    def parse(cls, spec: str | None, signed_in_on_page: Callable[[HTTPConnection], bool] = _no_page_login,
              tallies: AppTallies | None = None) -> Login | None:
        """'user:password[,user2:password2]' -> Login; empty -> None (no login)."""
        if not spec:
            return None
        accounts = []
        for item in spec.split(","):
            user, sep, password = item.strip().partition(":")
            if not sep or not user or not password:
                raise ValueError("--auth takes user:password pairs separated by commas, e.g. demo:s3cret.")
            accounts.append((user, password))
        users = frozenset(user for user, _ in accounts)
        return cls(tuple(accounts), signed_in_on_page, FailedLogins(tallies or InProcess(), users))

    def check(self, user: str, password: str) -> bool:
        return any(
            secrets.compare_digest(user, known_user) & secrets.compare_digest(password, known_password)
            for known_user, known_password in self.accounts
        )

    async def allows(self, connection: HTTPConnection) -> bool:
        """True for HTTP Basic credentials that match, or the cookie of a UI login."""
        header = connection.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            address = address_of(connection)
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                user = password = ""
            if await self.failures.refusal(address, user) is not None:
                return False
            if self.check(user, password):
                return True
            await self.failures.failed(address, user)
            return False
        return self.signed_in_on_page(connection)
