"""The line between the engine owner (chat/owner.py, in the supervisor) and each UI worker
(chat/owner_link.py): pydantic messages on ZeroMQ (pyzmq comes with vLLM, whose engine cores speak it).

The owner binds a ROUTER socket in the app's private folder (mode 0700: no other local user can
reach it), each worker connects a DEALER for its life. A message that does not fit the models below
fails at the line, as the /chat API's do (chat/api_schema.py). A question carries an `id` that its
answers repeat. Nothing a browser sends reaches this line.

    worker                                owner
    Hello                           ->
    Acquire(preset, have)           ->    starts or wakes the engine (budget, back-off)
                                    <-    Progress*, then Answer: ok with a client slot, or why not
    Report                          ->    when its streams or load changed (at most twice a second)
                                    <-    Snapshot when something changed: every engine as the whole
                                          app sees it, the workers, the capacity test
                                    <-    EngineNews(drain) -> Answer(ok: idle); (resume | asleep | died);
                                          (detach) -> Answer once its client is closed
    Capacity(take | give_back | stop) ->  one capacity test at a time -> Answer (take);
                                    <-    Capacity(stop) to the worker that runs it
    Tally(hold | release | add | recent) -> the app's counts (chat/tallies.py) -> Answer(count), but
                                          to release; what a worker held is released when it goes
    Tally(enter)                    ->    a slot (--concurrency-limit) -> Answer(ok), or Progress
                                          while in line then Answer(ok); not ok: the line is full
    Tally(leave)                    ->    the slot, or the place in line, given back (no answer)
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from zmq.asyncio import Context
from zmq.constants import DEALER, LINGER, ROUTER, ROUTER_MANDATORY
from zmq.error import ZMQError

from chat.engine_core import EngineSlot
from chat.registry import EngineView

log = logging.getLogger(__name__)


class WorkerState(enum.StrEnum):
    STARTING = "starting"
    SERVING = "serving"  # listening, and its first engine start has ended (/healthz waits for every worker's)
    RESTARTING = "restarting"
    STOPPED = "stopped"


class News(enum.StrEnum):
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


class Answer(_Message):  # a question's last answer
    op: Literal["answer"] = "answer"
    id: int
    ok: bool = True
    message: str = ""  # why not
    busy: bool = False  # no room now, rather than failed
    generation: int = 0  # to Acquire: the core's start that the slot is on
    slot: EngineSlot | None = None  # to Acquire: None when the worker's client is on this generation already
    count: int | None = None  # to Tally: how many (None: a hold refused at its limit)


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


class Tally(_Message):
    op: Literal["tally"] = "tally"
    id: int = 0
    act: Literal["hold", "release", "enter", "leave", "add", "recent"]
    key: str
    limit: int = 0  # to hold and enter
    max_waiting: int = 0  # to enter: how many may wait in line
    ticket: str = ""  # to enter and leave: the worker's name for the slot or the place in line
    window_s: float = 0.0  # to add and recent


Message = Annotated[Hello | Acquire | Report | Progress | Answer | Snapshot | EngineNews | Capacity | Tally,
                    Field(discriminator="op")]
MESSAGE: TypeAdapter[Message] = TypeAdapter(Message)
_RUNNING: set[asyncio.Task[Any]] = set()


def background(work: Coroutine[Any, Any, Any]) -> None:
    """Run `work` on this loop without waiting for it (held here until it ends: a task nothing holds may be lost)."""
    task = asyncio.get_running_loop().create_task(work)
    _RUNNING.add(task)
    task.add_done_callback(_RUNNING.discard)


class Line:
    """One end of the line: the owner's (ROUTER: `peer` names a worker) or a worker's (DEALER: b"")."""

    def __init__(self, folder: Path, owner: bool) -> None:
        self.context = Context()
        self.socket = self.context.socket(ROUTER if owner else DEALER)
        self.socket.setsockopt(LINGER, 0)
        if owner:
            self.socket.setsockopt(ROUTER_MANDATORY, 1)  # a message to a worker gone raises, not vanishes
            self.socket.bind(f"ipc://{folder / 'owner.sock'}")
        else:
            self.socket.connect(f"ipc://{folder / 'owner.sock'}")
        self._ids = itertools.count(1)
        self._asked: dict[int, tuple[bytes, asyncio.Queue[Progress | Answer]]] = {}

    async def send(self, message: _Message, peer: bytes = b"") -> None:
        """Send; ConnectionError when `peer` is gone."""
        try:
            await self.socket.send_multipart([*([peer] if peer else []), message.model_dump_json().encode()])
        except ZMQError as exc:
            raise ConnectionError(f"the other end is gone ({exc})") from exc

    async def messages(self) -> AsyncIterator[tuple[bytes, Message]]:
        """Each message that answers none of our questions, with its sender; one that is not a message is logged."""
        while True:
            *peer, data = await self.socket.recv_multipart()
            try:
                message = MESSAGE.validate_json(data)
            except ValidationError as exc:
                log.warning("A message between the engine owner and a UI worker cannot be read: %s", exc.errors()[:1])
                continue
            sender, asked = (peer[0] if peer else b""), self._asked.get(getattr(message, "id", 0))
            if isinstance(message, (Progress, Answer)) and asked is not None and asked[0] == sender:
                asked[1].put_nowait(message)
            else:
                yield sender, message

    async def ask(self, question: Acquire | Capacity | EngineNews | Tally, peer: bytes = b"",
                  progress: Callable[[Progress], None] = lambda _: None) -> Answer:
        """Send a question and return its answer (not ok if `peer` goes first); `progress` meanwhile."""
        ident, answers = next(self._ids), asyncio.Queue[Progress | Answer]()
        self._asked[ident] = (peer, answers)
        try:
            await self.send(question.model_copy(update={"id": ident}), peer)
            while isinstance(answer := await answers.get(), Progress):
                progress(answer)
            return answer
        finally:
            del self._asked[ident]

    def gone(self, peer: bytes) -> None:
        """`peer` has gone: its questions end unanswered."""
        for ident, (asked, answers) in self._asked.items():
            if asked == peer:
                answers.put_nowait(Answer(id=ident, ok=False, message="It has gone."))

    def close(self) -> None:
        self.socket.close()
        self.context.term()
