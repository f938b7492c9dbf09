"""Votes that last: every vote cast in the Compare tab, kept in one SQLite file for the leaderboard.

    store = VoteStore(path)                                   # or VoteStore.open_default()
    record = store.record(comparison, turn_index, session)    # after comparison.vote(choice)
    await store.record_async(comparison, turn_index, session) # the same, off the event loop
    store.votes()                                             # every VoteRecord, oldest first
    vote_exports.write_exports(store.votes(), directory)      # votes.csv and votes.json (chat/vote_exports.py)

A record holds what a reader of the leaderboard may ask about: each column's preset, model, engine
arguments, system prompt and exact sampling values, the prompt, each column's reply and its stats,
the choice, whether it was cast blind, and the time. The voter is named only by digests: of the
browser session id, of the voter cookie the server signed and of the address (chat/voters.py). Each
voter may cast VOTES_PER_VOTER votes an hour and each address VOTES_PER_ADDRESS (not counted for this
machine's own loopback address); the store counts them in the transaction that adds a vote, so the
limits hold across every process that shares the file.

Many app processes may share the file: SQLite's WAL mode lets readers run beside the one writer,
writers wait for each other (busy timeout) instead of failing, and "one vote per turn" is a UNIQUE
constraint, so it holds across processes. Each write is a single small INSERT; the *_async methods
run the calls in a worker thread anyway, because a writer may wait on another process's lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from chat.compare import ALL_BAD, LABELS, MAX_COLUMNS, MIN_COLUMNS, TIE, Comparison
from chat.embedded import cache_root
from chat.errors import ChatError, InputError
from chat.voters import Voter, VoterKeys

FILE_NAME = "votes.sqlite3"
SCHEMA_VERSION = 2  # 2: voter and address digests
VOTES_PER_VOTER = 20  # an hour
VOTES_PER_ADDRESS = 60  # an hour
LIMIT_WINDOW_S = 3600
BUSY_TIMEOUT_S = 15.0  # how long a write waits for another process's write before giving up
MAX_SESSION_CHARS = 200

SCHEMA = """
CREATE TABLE IF NOT EXISTS votes (
    id INTEGER PRIMARY KEY,
    comparison TEXT NOT NULL,
    turn INTEGER NOT NULL,
    session TEXT NOT NULL,
    cast_at TEXT NOT NULL,
    prompt TEXT NOT NULL,
    choice TEXT NOT NULL,
    blind INTEGER NOT NULL,
    columns TEXT NOT NULL,
    voter TEXT NOT NULL DEFAULT '',
    address TEXT NOT NULL DEFAULT '',
    UNIQUE (comparison, turn)
)
"""
TOO_MANY_FROM_VOTER = (f"You have cast {VOTES_PER_VOTER} votes in the last hour, the most one visitor may; "
                       "thank you, and come back later to vote again.")
TOO_MANY_FROM_ADDRESS = (f"{VOTES_PER_ADDRESS} votes came from your network in the last hour, the most one address "
                         "may; please come back later to vote again.")


def default_path() -> Path:
    """Beside the converted models: $CHAT_MODEL_CACHE/votes.sqlite3, else ~/.cache/vllm-chat-demo/."""
    return cache_root() / FILE_NAME


@dataclass(frozen=True)
class ColumnVote:
    """One column of a voted turn: which preset, with which exact settings, wrote what."""

    label: str
    preset: str
    model: str
    engine: dict[str, Any]
    system_prompt: str
    sampling: dict[str, Any]  # Sampling.as_dict() of the turn's own reply
    stats: dict[str, Any] | None  # ReplyStats.as_dict(); None when the reply failed before any stats
    text: str
    error: str | None = None
    attempts: int = 1  # reruns shown beside the reply when the vote was cast count here too


@dataclass(frozen=True)
class VoteRecord:
    """One stored vote; `id` is given by the store."""

    comparison: str  # comparison_id(): stable for one comparison of one session
    turn: int  # the turn's number as the page shows it, from 1
    session: str  # session_digest(): anonymous, and not the live session id
    cast_at: str  # ISO 8601, UTC
    prompt: str
    choice: str  # a column's label, TIE or ALL_BAD
    blind: bool  # the preset names were hidden when it was cast
    columns: tuple[ColumnVote, ...]
    voter: str = ""  # a digest of the signed voter cookie (chat/voters.py); "" in votes from before it
    address: str = ""  # a digest of the voter's address; "" for this machine's loopback address
    id: int | None = None

    @property
    def winner(self) -> str | None:
        """The preset the voter chose, None for a tie or "all bad"."""
        return next((column.preset for column in self.columns if column.label == self.choice), None)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def session_digest(session: str) -> str:
    """What is stored instead of the session id: Gradio's session hash also lets its holder read
    that session's events, so it must not be written to a file that is exported."""
    return hashlib.sha256(f"vllm-chat-demo vote {session}".encode()).hexdigest()[:16]


def comparison_id(comparison: Comparison, session: str) -> str:
    """A name for one comparison of one session, the same at every vote on it.

    Comparison has no id of its own, so it is derived from what never changes once the first turn
    has finished: the session, the start time, the columns, the first prompt and its replies (their
    texts and timings make two comparisons differ even when started in the same second).
    """
    first = comparison.turns[0] if comparison.turns else None
    material = [
        session, comparison.started, [(column.label, column.preset) for column in comparison.columns],
        first.prompt if first else None,
        [(reply.text, reply.stats.total_s if reply.stats else None) for reply in first.replies if reply.attempt == 1]
        if first else None,
    ]
    return hashlib.sha256(json.dumps(material, default=str).encode()).hexdigest()[:32]


def vote_record(comparison: Comparison | None, turn_index: int, session: str, now: datetime | None = None,
                voter: Voter | None = None) -> VoteRecord:
    """The record of the vote already cast (Comparison.vote) on that turn; InputError says what is wrong."""
    if not isinstance(comparison, Comparison) or not comparison.turns:
        raise InputError("There is no comparison to vote on; send a prompt to the presets first.")
    if not isinstance(session, str) or not session.strip() or len(session) > MAX_SESSION_CHARS:
        raise InputError("This vote came without a valid session; reload the page and vote again.")
    if isinstance(turn_index, bool) or not isinstance(turn_index, int) or not 0 <= turn_index < len(comparison.turns):
        raise InputError(f"There is no turn {turn_index!r} in this comparison to vote on.")
    turn = comparison.turns[turn_index]
    if turn.vote is None:
        raise InputError(f"Turn {turn_index + 1} has no vote yet; pick one of the vote buttons first.")
    columns = comparison.columns
    labels = [column.label for column in columns]
    presets = [column.preset for column in columns]
    if not MIN_COLUMNS <= len(columns) <= MAX_COLUMNS or labels != list(LABELS[: len(columns)]) \
            or len(set(presets)) != len(presets):
        raise InputError("This comparison's columns are not two to four distinct presets labelled A, B, …; start a new one.")
    if turn.vote.choice not in (*labels, TIE, ALL_BAD):
        raise InputError(f"{turn.vote.choice!r} is not one of the choices.")
    voted = []
    for index, column in enumerate(columns):
        attempts = turn.attempts(index)
        if not attempts:
            raise InputError(f"Column {column.label} has no reply on this turn; send the prompt again.")
        reply = attempts[0]
        voted.append(ColumnVote(
            label=column.label, preset=column.preset, model=column.model, engine=dict(column.engine),
            system_prompt=column.system_prompt, sampling=reply.sampling.as_dict(),
            stats=reply.stats.as_dict() if reply.stats else None, text=reply.text, error=reply.error,
            attempts=len(attempts),
        ))
    cast_at = (now or datetime.now(UTC)).astimezone(UTC).isoformat(timespec="milliseconds")
    return VoteRecord(
        comparison=comparison_id(comparison, session), turn=turn_index + 1, session=session_digest(session),
        cast_at=cast_at, prompt=turn.prompt, choice=turn.vote.choice, blind=turn.vote.blind, columns=tuple(voted),
        voter=voter.id if voter else "", address=voter.address if voter else "",
    )


class VoteStore:
    """The votes of every visitor, in one SQLite file that several processes may share.

    One connection per store, used by one thread at a time (a lock): SQLite lets one writer in at
    a time anyway, and a store is shared by every session of the app.
    """

    def __init__(self, path: Path | str, busy_timeout_s: float = BUSY_TIMEOUT_S) -> None:
        self.path = Path(path).expanduser()
        self._lock = threading.Lock()
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False)
        except (OSError, sqlite3.Error) as exc:
            raise ChatError(f"Cannot open the votes file {self.path} ({exc}); set --votes-db to a writable file.") from exc
        self._db.row_factory = sqlite3.Row
        try:
            self.keys = VoterKeys.beside(self.path)  # signs voter cookies; beside the votes, for every process
        except OSError as exc:
            self._db.close()
            raise ChatError(f"Cannot keep the voters' key beside {self.path} ({exc}); set --votes-db to a writable file.") from exc
        try:
            self._prepare(busy_timeout_s)
        except sqlite3.DatabaseError as exc:
            self._db.close()
            raise ChatError(f"Cannot use {self.path} for votes ({exc}); set --votes-db to another file.") from exc
        except BaseException:
            self._db.close()
            raise

    @classmethod
    def open_default(cls) -> VoteStore:
        return cls(default_path())

    def _prepare(self, busy_timeout_s: float) -> None:
        # Switching a new file to WAL needs the file to itself; a process starting at the same
        # moment can be told "locked" without waiting, so it tries again for a little while.
        deadline = time.monotonic() + busy_timeout_s
        while True:
            try:
                self._db.execute("PRAGMA journal_mode=WAL")
                # NORMAL: in WAL mode a commit survives the app crashing or restarting; only a power
                # loss can undo the last few. FULL syncs the disk on every vote, and voters queue
                # behind each other's syncs (300 votes from 12 threads: 2.2 s with FULL, 0.3 s with
                # NORMAL on a 2-core development machine).
                self._db.execute("PRAGMA synchronous=NORMAL")
                with self._transaction():
                    self._db.execute(SCHEMA)
                    version = self._db.execute("PRAGMA user_version").fetchone()[0]
                    if version > SCHEMA_VERSION:
                        raise ChatError(f"{self.path} was written by a newer version of this app; "
                                        "upgrade the app or set --votes-db to another file.")
                    known = {row[1] for row in self._db.execute("PRAGMA table_info(votes)")}
                    for column in ("voter", "address"):  # a file from version 1
                        if column not in known:
                            self._db.execute(f"ALTER TABLE votes ADD COLUMN {column} TEXT NOT NULL DEFAULT ''")
                    self._db.execute(f"PRAGMA user_version={SCHEMA_VERSION}")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        # IMMEDIATE takes the write lock first (waiting up to the busy timeout), so a transaction
        # never fails half-way on a read lock it could not upgrade to a write lock.
        self._db.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    # --- writing -------------------------------------------------------------------------------

    def add(self, record: VoteRecord) -> VoteRecord:
        """Store a record; a second vote on the same comparison turn is refused with InputError."""
        columns = json.dumps([asdict(column) for column in record.columns], ensure_ascii=False, default=str)
        row = (record.comparison, record.turn, record.session, record.cast_at, record.prompt, record.choice,
               int(record.blind), columns, record.voter, record.address)
        with self._lock:
            try:
                with self._transaction():
                    self._check_limits(record)
                    cursor = self._db.execute(
                        "INSERT INTO votes (comparison, turn, session, cast_at, prompt, choice, blind, columns, voter, "
                        "address) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", row)
            except sqlite3.IntegrityError:
                raise InputError(
                    f"Turn {record.turn} already has a vote; send another prompt to vote again."
                ) from None
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                raise ChatError("The votes file was busy, so this vote was not saved; please try again in a moment.") from exc
        return replace(record, id=cursor.lastrowid)

    def _check_limits(self, record: VoteRecord) -> None:
        since = (datetime.fromisoformat(record.cast_at) - timedelta(seconds=LIMIT_WINDOW_S)).isoformat(timespec="milliseconds")
        for column, value, limit, sentence in (("voter", record.voter, VOTES_PER_VOTER, TOO_MANY_FROM_VOTER),
                                                ("address", record.address, VOTES_PER_ADDRESS, TOO_MANY_FROM_ADDRESS)):
            if value and self._db.execute(f"SELECT COUNT(*) FROM votes WHERE {column} = ? AND cast_at > ?",
                                          (value, since)).fetchone()[0] >= limit:
                raise InputError(sentence)

    def record(self, comparison: Comparison | None, turn_index: int, session: str,
               voter: Voter | None = None) -> VoteRecord:
        """Store the vote cast on comparison.turns[turn_index] by that session; returns what was stored."""
        return self.add(vote_record(comparison, turn_index, session, voter=voter))

    def reset(self) -> int:
        """Delete every vote (the UI offers it to administrators only); returns how many there were."""
        with self._lock, self._transaction():
            return self._db.execute("DELETE FROM votes").rowcount

    # --- reading -------------------------------------------------------------------------------

    def votes(self) -> list[VoteRecord]:
        """Every vote, oldest first."""
        with self._lock:
            rows = self._db.execute("SELECT * FROM votes ORDER BY id").fetchall()
        return [_record_of(row) for row in rows]

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM votes").fetchone()[0])

    # --- off the event loop --------------------------------------------------------------------

    async def record_async(self, comparison: Comparison | None, turn_index: int, session: str,
                           voter: Voter | None = None) -> VoteRecord:
        # The record is made here, on the event loop, so no other handler changes the comparison
        # while it is read; only the write goes to a thread.
        return await asyncio.to_thread(self.add, vote_record(comparison, turn_index, session, voter=voter))

    async def votes_async(self) -> list[VoteRecord]:
        return await asyncio.to_thread(self.votes)

    async def reset_async(self) -> int:
        return await asyncio.to_thread(self.reset)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> VoteStore:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def _record_of(row: sqlite3.Row) -> VoteRecord:
    columns = tuple(ColumnVote(**column) for column in json.loads(row["columns"]))
    return VoteRecord(
        comparison=row["comparison"], turn=row["turn"], session=row["session"], cast_at=row["cast_at"],
        prompt=row["prompt"], choice=row["choice"], blind=bool(row["blind"]), columns=columns, voter=row["voter"],
        address=row["address"], id=row["id"],
    )
