"""`/compare`, `/vote` and `/compare_stop` on the Gradio API: comparisons for programs.

The Compare tab is made only in pages that open it (chat/ui/lazy.py), and its events with it, so
programs get endpoints of their own, made with the page. Each program session (a `gradio_client`
Client) has one comparison, as a page has; the latest `MAX_SESSIONS` sessions' comparisons are kept
in memory. A turn goes through the same service as the tab's (`chat.compare_service`, `chat.ballot`).
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import gradio as gr

from chat import ballot
from chat.compare import Comparison
from chat.compare_service import Begun, Busy, CompareService, Ended, Job, Redraw
from chat.errors import ChatError
from chat.ui.compare_view import column_messages
from chat.ui.messages import PROBLEM
from chat.voters import Voter, visitor_of
from chat.votes import VoteStore

MAX_SESSIONS = 1000
BUSY = f"{PROBLEM} Wait until every column has finished, or call /compare_stop."
SAMPLING_SHAPE = ("sampling is a list with one object of settings per picked preset, "
                  'e.g. [{"temperature": 0.2}, {"max_tokens": 64}].')
BLIND_SHARED = (f"{PROBLEM} In a blind comparison every column writes with the same settings, or they could be "
                "told apart: give one set of settings, or the same for each preset.")


def view(comparison: Comparison | None, jobs: Sequence[Job] = (), status: str = "") -> dict[str, Any]:
    """What /compare answers: {status, turn, columns: [{title, messages}]}, each message a chat
    message as the tab shows it ({role, content, metadata}; the stats are the last one's title)."""
    if comparison is None:
        return {"status": status, "turn": 0, "columns": []}
    return {
        "status": status,
        "turn": len(comparison.turns),
        "columns": [
            {"title": comparison.title(column),
             "messages": [{"role": m.role, "content": m.content, "metadata": dict(m.metadata or {})}
                          for m in column_messages(comparison, column, jobs)]}
            for column in range(len(comparison.columns))
        ],
    }


@dataclass
class ProgramBoard:
    """One program session's comparison (the tab's `Board` also keeps a page's exports; programs get none)."""

    comparison: Comparison | None = None


class CompareApi:
    def __init__(self, comparisons: CompareService, store: VoteStore | None, max_sessions: int = MAX_SESSIONS) -> None:
        self.comparisons, self.store, self.max_sessions = comparisons, store, max_sessions
        self.boards: OrderedDict[str, ProgramBoard] = OrderedDict()

    def board(self, session: str) -> ProgramBoard:
        board = self.boards.pop(session, None) or ProgramBoard()
        self.boards[session] = board  # the most recently used last; the oldest are forgotten
        idle = [name for name in self.boards if name not in self.comparisons.writing]  # not one being written
        for name in idle[:max(0, len(self.boards) - self.max_sessions)]:
            del self.boards[name]
        return board

    async def compare(
        self, picked: list[str], blind: bool, prompt: str, sampling: list[dict[str, Any]] | None = None,
        request: gr.Request | None = None,
    ) -> AsyncIterator[dict[str, Any]]:
        """One prompt to every column of this session's comparison, which the first prompt starts
        with the picked presets (two to four; `blind` hides their names until a vote); `sampling`
        holds each picked preset's settings by name (temperature, top_p, top_k, max_tokens,
        repetition_penalty, seed; missing ones take the preset's defaults). Answers each column's
        chat as it is written, then with its stats: {status, turn, columns: [{title, messages}]}."""
        session = request.session_hash or "" if request is not None else ""
        board = self.board(session)
        if sampling is not None and not (isinstance(sampling, list) and all(isinstance(s, dict) for s in sampling)):
            yield view(board.comparison, status=f"{PROBLEM} {SAMPLING_SHAPE}")
            return
        hidden = board.comparison.hides_stats if board.comparison else bool(blind)
        if hidden and sampling and any(s != sampling[0] for s in sampling[1:]):
            yield view(board.comparison, status=BLIND_SHARED)
            return
        jobs: list[Job] = []
        try:
            async with contextlib.aclosing(self.comparisons.send(board.comparison, list(picked or []), bool(blind), prompt,
                                                                 sampling or [], session,
                                                                 visitor=visitor_of(request) if request is not None else "")) as events:
                async for event in events:
                    if isinstance(event, Begun):
                        board.comparison, jobs = event.comparison, event.jobs
                        yield view(board.comparison, jobs)
                    elif isinstance(event, Redraw):
                        yield view(board.comparison, jobs)
                    elif isinstance(event, Ended):
                        yield view(board.comparison)
        except Busy:
            yield view(board.comparison, status=BUSY)
        except ChatError as exc:
            yield view(board.comparison, status=f"{PROBLEM} {exc.message}")

    async def vote(self, choice: str | None, turn: int | str | None, request: gr.Request) -> dict[str, Any]:
        """Vote on a turn of this session's comparison (the latest when `turn` is empty): `choice`
        is a column's label (A, B, …), "tie" or "bad", or a vote button's words. Answers
        {ok, choice, turn, blind, message} or {ok: false, error}."""
        comparison = self.board(request.session_hash or "").comparison
        try:
            value = ballot.choice_of(comparison, choice, turn)
            assert comparison is not None
            voter = Voter.of(self.store.keys, request) if self.store is not None else None
            cast = await ballot.cast(comparison, value, request.session_hash or "", self.store, voter)
        except ChatError as exc:
            return {"ok": False, "error": exc.message}
        return {"ok": True, "choice": cast.choice, "turn": len(comparison.turns), "blind": cast.blind,
                "message": ballot.said(comparison, cast)}

    async def stop(self, request: gr.Request) -> None:  # async: stopping aborts on the server's event loop
        """Stop every column of this session's comparison."""
        self.comparisons.stop(request.session_hash or "")


def compare_api(comparisons: CompareService, store: VoteStore | None) -> CompareApi:
    """Register the endpoints on the Blocks being built."""
    api = CompareApi(comparisons, store)
    gr.api(api.compare, api_name="compare", concurrency_limit=None)
    gr.api(api.vote, api_name="vote", concurrency_limit=None)
    gr.api(api.stop, api_name="compare_stop", concurrency_limit=None)
    return api
