"""Who votes: one visitor, one voice.

A voter is named by a cookie the server issues and signs (`chat_voter`), not by anything a client
chooses: a client that makes up a new Gradio session for every vote is still the same voter while
it keeps the cookie, and one that drops the cookie every time is still one address. The store
(chat/votes.py) allows each voter and each address a few votes an hour.

    keys = VoterKeys.beside(votes_db)            # the signing key, kept beside the votes file
    value = keys.issue()                         # "v1.<id>.<signature>", set as the cookie
    keys.voter(value)                            # the id, or None for a value the server did not sign
    Voter.of(keys, request)                      # who cast a vote: the cookie's id and the address
    visitor_of(request)                          # who sent a request: "voter:<id>", else "address:<address>"

The key lives in a file beside the votes (mode 0600), so the same voter stays the same across
restarts and across UI workers. Stored votes name voters and addresses only by digests.

A visitor (whose replies a socket may follow: chat/live.py) is the signed voter cookie where the
request carries one, else its address, an IPv6 address by its /64 (one host gets a whole /64). The
cookie middleware (`VoterCookie`) decides it once for every HTTP request and WebSocket, and leaves it
in the request's state, where the WebSocket API and the page's Gradio events alike read it.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

COOKIE = "chat_voter"
KEY_BYTES = 32
COOKIE_MAX_AGE_S = 365 * 24 * 3600
NEEDS_COOKIE = "Votes need this site's cookie, which your browser or program did not send; allow cookies and reload the page."


class VoterKeys:
    def __init__(self, key: bytes) -> None:
        self._key = key

    @classmethod
    def beside(cls, votes_db: Path) -> VoterKeys:
        """The key in `<votes file>.key`, made on first use (several processes may race: one wins)."""
        path = Path(str(votes_db) + ".key")
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            try:  # several processes may race: one creates it
                with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as file:
                    file.write(secrets.token_bytes(KEY_BYTES))
            except FileExistsError:
                pass
        # The file exists from its creation, its key a moment later: a UI worker starting beside the one
        # that created it read it empty, and the two signed with two keys (half the votes were refused
        # as without a cookie). Wait for the whole key (any filesystem: no rename or link needed).
        deadline = time.monotonic() + 10
        while len(key := path.read_bytes()) < KEY_BYTES:
            if time.monotonic() > deadline:
                raise OSError(f"{path} holds no whole key; remove it and start again")
            time.sleep(0.01)
        return cls(key)

    def _sign(self, voter: str) -> str:
        return hmac.new(self._key, f"voter {voter}".encode(), hashlib.sha256).hexdigest()[:32]

    def issue(self) -> str:
        voter = secrets.token_hex(12)
        return f"v1.{voter}.{self._sign(voter)}"

    def voter(self, value: str | None) -> str | None:
        if not value or not isinstance(value, str) or value.count(".") != 2:
            return None
        version, voter, signature = value.split(".")
        # compare_digest raises on a str that is not ASCII: a forged cookie is no cookie, not a 500.
        if version != "v1" or not signature.isascii() or not hmac.compare_digest(signature, self._sign(voter)):
            return None
        return voter

    def digest(self, kind: str, value: str) -> str:
        """What is stored for a voter or an address: keyed, so it cannot be worked back."""
        return hmac.new(self._key, f"{kind} {value}".encode(), hashlib.sha256).hexdigest()[:16]


@dataclass(frozen=True)
class Voter:
    """Who cast a vote, as stored: digests of the signed voter id and of the address ("" for this
    machine's own loopback address, which every visitor shares behind a proxy that names none)."""

    id: str
    address: str

    @classmethod
    def of(cls, keys: VoterKeys, request: Any) -> Voter | None:
        """The voter of a web request (Gradio's or Starlette's); None without a valid cookie."""
        cookies = getattr(request, "cookies", None) or {}
        voter = keys.voter(cookies.get(COOKIE))
        if voter is None:
            return None
        host = str(getattr(getattr(request, "client", None), "host", "") or "")
        return cls(keys.digest("voter", voter), "" if _loopback(host) else keys.digest("address", address_group(host)))


VISITOR = "chat_visitor"  # the name under which VoterCookie leaves a request's visitor in its state


def visitor_of(request: Any) -> str:
    """Who sent a web request (Gradio's or Starlette's, HTTP or WebSocket), as `VoterCookie` found
    ("voter:<id>" or "address:<address>"); by its address where no VoterCookie saw it."""
    try:
        visitor = getattr(request.state, VISITOR, None)
    except AttributeError:  # no state: a request made in a test
        visitor = None
    if isinstance(visitor, str):
        return visitor
    return _by_address(str(getattr(getattr(request, "client", None), "host", "") or ""))


def _by_address(host: str) -> str:
    return f"address:{address_group(host)}"


def address_group(host: str) -> str:
    """An address as visitors are told apart by it: IPv4 as it is, IPv6 by its /64 (an IPv4
    address written as IPv6 is that IPv4 address); anything else as it came."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return not host


class VoterCookie:
    """ASGI middleware: gives every browser and program without a valid voter cookie a new one, and
    notes each request's visitor (`visitor_of`): the cookie's voter, else the address (the request
    that is given a cookie is still its address's; the next one it sends is the voter's)."""

    def __init__(self, app: Any, keys: VoterKeys) -> None:
        self.app, self.keys = app, keys

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        voter = self._voter(scope)
        host = str((scope.get("client") or ("",))[0] or "")
        scope.setdefault("state", {})[VISITOR] = f"voter:{voter}" if voter is not None else _by_address(host)
        if scope["type"] != "http" or voter is not None:  # a WebSocket's answer sets no cookie
            await self.app(scope, receive, send)
            return
        cookie = (f"{COOKIE}={self.keys.issue()}; Path=/; Max-Age={COOKIE_MAX_AGE_S}; HttpOnly; SameSite=Lax").encode()

        async def with_cookie(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", cookie)]}
            await send(message)

        await self.app(scope, receive, with_cookie)

    def _voter(self, scope: dict[str, Any]) -> str | None:
        """The voter of the request's first valid voter cookie (None: it sent none)."""
        for name, value in scope.get("headers", []):
            if name == b"cookie":
                for part in value.decode("latin-1").split(";"):
                    key, _, cookie = part.strip().partition("=")
                    if key == COOKIE and (voter := self.keys.voter(cookie)) is not None:
                        return voter
        return None
