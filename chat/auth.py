"""Optional login, the same for the UI and the API (`--auth user:password` or CHAT_AUTH).

The UI uses Gradio's login page; the app's own routes (the WebSocket API, /metrics) accept that
login's cookie or HTTP Basic credentials. /healthz stays open for load balancers: it shows
engine states and counts, nothing a user wrote.
"""

from __future__ import annotations

import base64
import binascii
import secrets
from dataclasses import dataclass

from starlette.requests import HTTPConnection


@dataclass(frozen=True)
class Login:
    accounts: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, spec: str | None) -> Login | None:
        """'user:password[,user2:password2]' -> Login; empty -> None (no login)."""
        if not spec:
            return None
        accounts = []
        for item in spec.split(","):
            user, sep, password = item.strip().partition(":")
            if not sep or not user or not password:
                raise ValueError("--auth takes user:password pairs separated by commas, e.g. demo:s3cret.")
            accounts.append((user, password))
        return cls(tuple(accounts))

    def check(self, user: str, password: str) -> bool:
        return any(
            secrets.compare_digest(user, known_user) & secrets.compare_digest(password, known_password)
            for known_user, known_password in self.accounts
        )

    def allows(self, connection: HTTPConnection) -> bool:
        """True for HTTP Basic credentials that match, or the cookie of a UI login."""
        header = connection.headers.get("authorization", "")
        if header.lower().startswith("basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except (binascii.Error, UnicodeDecodeError):
                return False
            return self.check(user, password)
        from chat.ui.gradio_internals import login_token  # Gradio's cookie names live there

        return login_token(connection) is not None
