"""Who is an administrator: the people who may reset the votes and run capacity tests.

    admins = Admins.parse("alice,bob", local=False, login=login)   # --admins, --admin-local, --auth
    admins.allows(username="alice", host="203.0.113.9")            # True

Two ways in, both off by default: a user name from `--auth` listed in `--admins` (the login is
checked by Gradio, so the name cannot be forged by a browser), or, with `--admin-local`, any
connection from this machine's loopback address (127.0.0.1 or ::1). The address is the TCP peer's,
never a header a client writes; behind a reverse proxy on the same machine every visitor connects
from loopback, so `--admin-local` must stay off there.

The UI hides admin-only controls from everyone else, but that is only for tidiness: every admin-only
event asks `allows` again on the server.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Any

from chat.auth import Login

NOT_ADMIN = "Only an administrator can do this; sign in with an account named by --admins."


@dataclass(frozen=True)
class Admins:
    names: frozenset[str] = frozenset()
    local: bool = False  # anyone connecting from a loopback address

    @classmethod
    def parse(cls, spec: str | None, *, local: bool = False, login: Login | None = None) -> Admins:
        """'alice,bob' -> Admins; every name must be a user of `login` (ValueError says what to fix)."""
        names = frozenset(name.strip() for name in (spec or "").split(",") if name.strip())
        if names and login is None:
            raise ValueError("--admins names users of --auth; add --auth user:password for each of them.")
        users = {user for user, _ in login.accounts} if login else set()
        unknown = sorted(names - users)
        if unknown:
            raise ValueError(f"--admins names {', '.join(unknown)}, who is not a user of --auth; "
                             "add them to --auth or remove them from --admins.")
        return cls(names, local)

    @property
    def anyone_can_be(self) -> bool:
        """Whether any visitor can be an administrator at all (else admin-only controls never show)."""
        return bool(self.names) or self.local

    def allows(self, username: str | None, host: str | None) -> bool:
        if username is not None and username in self.names:
            return True
        return self.local and is_loopback(host)

    def allows_request(self, request: Any) -> bool:
        """`allows` for a web request (Gradio's or Starlette's): its signed-in user and its peer address."""
        username = getattr(request, "username", None)
        try:
            host = request.client.host
        except AttributeError:  # no connection behind it (a request made in a test)
            host = None
        return self.allows(username if isinstance(username, str) else None, host if isinstance(host, str) else None)


def is_loopback(host: str | None) -> bool:
    """127.0.0.0/8 or ::1, also written as an IPv4-mapped IPv6 address; False for names and junk."""
    if not host:
        return False
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback
