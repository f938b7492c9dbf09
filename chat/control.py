"""The line between the engine owner (in the supervisor) and each UI worker.

One Unix socket in the app's private folder (mode 0700, so no other local user can reach it); each
worker holds one connection to it for its life. Messages are JSON objects, one per line, each with
an `op`; a request carries an `id` that its answers repeat. chat/owner.py answers, chat/owner_link.py
asks. Nothing a browser sends reaches this line: only the app's own processes.
"""

from __future__ import annotations

import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

MAX_MESSAGE_BYTES = 1 << 22
SOCKET_NAME = "owner.sock"


def private_folder() -> Path:
    """A new folder only this user can enter: the owner's socket and the engine cores' sockets."""
    folder = Path(tempfile.mkdtemp(prefix="vllm-chat-"))
    os.chmod(folder, 0o700)
    return folder


async def send(writer: asyncio.StreamWriter, message: dict[str, Any]) -> None:
    writer.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
    await writer.drain()


async def receive(reader: asyncio.StreamReader) -> dict[str, Any] | None:
    """The next message, or None once the other side has gone."""
    try:
        line = await reader.readline()
    except (ConnectionError, asyncio.LimitOverrunError, ValueError):
        return None
    if not line:
        return None
    message = json.loads(line)
    if not isinstance(message, dict):
        raise ValueError(f"not a message: {line[:80]!r}")
    return message


async def connect(folder: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_unix_connection(str(folder / SOCKET_NAME), limit=MAX_MESSAGE_BYTES)


async def listen(folder: Path, handle: Any) -> asyncio.AbstractServer:
    return await asyncio.start_unix_server(handle, str(folder / SOCKET_NAME), limit=MAX_MESSAGE_BYTES)
