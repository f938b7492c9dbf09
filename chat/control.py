"""The line between the engine owner (in the supervisor, chat/owner.py) and each UI worker
(chat/owner_link.py): typed messages on ZeroMQ.

The owner binds a ROUTER socket in the app's private folder (mode 0700: no other local user can
reach it) and each worker connects a DEALER to it for its life; pyzmq comes with vLLM, whose own
engine cores speak the same library. Each message is a pydantic model, sent as JSON and read back
through a union on `op` (as chat/api_schema.py reads the /chat API), so a message that does not
fit fails at the line. A question carries an `id` that its answers repeat. Nothing a browser sends
reaches this line.

    worker                                owner
    Hello                           ->
    Acquire(preset, have)           ->    starts or wakes the engine (budget, back-off)
                                    <-    Progress*, then Granted (a client slot) | Refused
    Report                          ->    when its streams or load changed (at most twice a second)
                                    <-    Snapshot: every engine as the whole app sees it, the workers,
                                          the capacity test; when something changed
                                    <-    News(drain) -> Answer(ok: idle); News(resume | asleep | died),
                                          News(detach) -> Answer
    Capacity(take | give_back | stop) ->  one capacity test at a time -> Answer (take);
                                    <-    Capacity(stop) to the worker that runs it
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import itertools
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from zmq.asyncio import Context
from zmq.constants import DEALER, LINGER, ROUTER, ROUTER_MANDATORY
from zmq.error import ZMQError

from chat.engine_core import EngineSlot
from chat.registry import EngineView

ADDRESS = "owner.sock"


class WorkerState(enum.StrEnum):
    STARTING = "starting"
    SERVING = "serving"  # listening, and its first engine start has ended (/healthz waits for every worker's)
    RESTARTING = "restarting"
    STOPPED = "stopped"


class News(enum.StrEnum):
    """What the owner tells a worker about one of its engines."""

    DRAIN = "drain"  # is it idle here? if so, hold new requests for it until told what became of it
    RESUME = "resume"  # kept: go on
    ASLEEP = "asleep"
    DETACH = "detach"  # about to be unloaded: close the client (answered once closed)
    DIED = "died"  # its core died and is being restarted


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineReport(_Message):  # one engine as one worker sees it
    generation: int
    streams: int
    unfinished: int
    running: int
    waiting: int
    kv_cache_usage: float
    updated_at: float
    generated_tokens: int
    idle_s: float


class CapacityView(_Message):
    presets: list[str]
    ends_at: float
    by: str


class WorkerView(_Message):
    index: int
    state: WorkerState


class Hello(_Message):
    op: Literal["hello"] = "hello"
    worker: int


class Acquire(_Message):
    op: Literal["acquire"] = "acquire"
    id: int = 0
    preset: str
    have: int | None = None  # the core generation this worker's client is on, if any


class Report(_Message):
    op: Literal["report"] = "report"
    engines: dict[str, EngineReport]
    first_tokens: list[tuple[str, float]]  # (preset, seconds) since the last report
    settled: bool  # its first engine start has ended


class Progress(_Message):
    op: Literal["progress"] = "progress"
    id: int
    phase: str
    elapsed: float
    delay: float


class Granted(_Message):
    op: Literal["granted"] = "granted"
    id: int
    generation: int
    slot: EngineSlot | None = None  # None: the client it has is on this generation


class Refused(_Message):
    op: Literal["refused"] = "refused"
    id: int
    message: str
    busy: bool = False  # no room now, rather than failed


class Snapshot(_Message):
    op: Literal["snapshot"] = "snapshot"
    engines: list[EngineView]
    workers: list[WorkerView]
    capacity: CapacityView | None = None


class EngineNews(_Message):
    op: Literal["news"] = "news"
    id: int = 0
    news: News
    key: str
    generation: int = 0
    reason: str = ""


class Capacity(_Message):
    op: Literal["capacity"] = "capacity"
    id: int = 0
    act: Literal["take", "give_back", "stop"]
    test: CapacityView | None = None  # with take


class Answer(_Message):
    op: Literal["answer"] = "answer"
    id: int
    ok: bool = True
    message: str = ""


Message = Annotated[Hello | Acquire | Report | Progress | Granted | Refused | Snapshot | EngineNews | Capacity | Answer,
                    Field(discriminator="op")]
MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
FINAL = (Granted, Refused, Answer)  # a question's last answer


_RUNNING: set[asyncio.Task[Any]] = set()


def background(work: Coroutine[Any, Any, Any]) -> None:
    """Run `work` on this loop without waiting for it (held here until it ends: a task nothing holds may be lost)."""
    task = asyncio.get_running_loop().create_task(work)
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)


class Line:
    """One end of the line: the owner's (ROUTER: `peer` names the worker) or a worker's (DEALER)."""

    def __init__(self, folder: Path, owner: bool) -> None:
        self.context = Context()
        self.socket = self.context.socket(ROUTER if owner else DEALER)
        self.socket.setsockopt(LINGER, 0)
        address = f"ipc://{folder / ADDRESS}"
        if owner:
            self.socket.setsockopt(ROUTER_MANDATORY, 1)  # a message to a worker gone raises, not vanishes
            self.socket.bind(address)
        else:
            self.socket.connect(address)

    async def send(self, message: _Message, peer: bytes | None = None) -> None:
        """Send; ConnectionError when `peer` is gone."""
        data = message.model_dump_json().encode()
        try:
            await self.socket.send_multipart([data] if peer is None else [peer, data])
        except ZMQError as exc:
            raise ConnectionError(f"the other end is gone ({exc})") from exc

    async def receive(self) -> tuple[bytes, Message]:
        """The next message and who sent it (b"" on a worker's end). Raises pydantic's ValidationError
        for one that is not a message."""
        *peer, data = await self.socket.recv_multipart()
        return (peer[0] if peer else b""), MESSAGE.validate_json(data)

    def close(self) -> None:
        self.socket.close()
        self.context.term()


class Calls:
    """Questions sent on a line, waiting for their answers."""

    def __init__(self) -> None:
        self._ids = itertools.count(1)
        self._open: dict[int, asyncio.Queue[Message | None]] = {}

    @contextlib.contextmanager
    def open(self) -> Iterator[tuple[int, asyncio.Queue[Message | None]]]:
        """A new question's id, and where its answers arrive."""
        ident, queue = next(self._ids), asyncio.Queue[Message | None]()
        self._open[ident] = queue
        try:
            yield ident, queue
        finally:
            del self._open[ident]

    def answered(self, message: Message) -> bool:
        """Hand an answer to its question; False when it answers none (a question itself)."""
        queue = self._open.get(getattr(message, "id", 0))
        if queue is None or not isinstance(message, (Progress, *FINAL)):
            return False
        queue.put_nowait(message)
        return True

    def close(self) -> None:
        """The other end is gone: every question still open gets None."""
        for queue in self._open.values():
            queue.put_nowait(None)
