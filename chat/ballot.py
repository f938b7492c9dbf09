"""Casting a Compare vote: on the comparison, then in the vote store, or not at all.

    choice = choice_of(comparison, "A", turn=1)      # an API caller's values, checked (InputError)
    vote = await cast(comparison, choice, session, store, voter)
    said(comparison, vote)                           # "You voted “A is better” on turn 1. A was …"

A vote the store cannot keep (busy, refused) is taken back from the comparison, so the person can
cast it again; the store's sentence is what they read. No Gradio here.
"""

from __future__ import annotations

import logging
import math

from chat.compare import Comparison, Vote
from chat.errors import ChatError, InputError
from chat.voters import NEEDS_COOKIE, Voter
from chat.votes import VoteStore

log = logging.getLogger(__name__)

NOT_SAVED = "Your vote could not be saved on the server; please vote again in a moment."


def choice_of(comparison: Comparison | None, choice: object, turn: object = None) -> str:
    """The choice an API caller means: a column's label, "tie" or "bad", or a vote button's words
    (any case); `turn`, when given, must be the latest turn's number (only it can be voted on)."""
    if comparison is None or not comparison.turns:
        raise InputError("There is no comparison in this session to vote on; run one with /compare first.")
    options = comparison.vote_options()
    words = choice.strip().lower() if isinstance(choice, str) else None
    value = next((value for text, value in options if words in (value.lower(), text.lower())), None)
    if value is None:
        raise InputError(f"Vote with one of: {', '.join(value for _, value in options)}; {choice!r} is not one.")
    latest = len(comparison.turns)
    if turn is not None and turn != "":
        if isinstance(turn, bool) or not isinstance(turn, int | float) or not math.isfinite(turn) or int(turn) != turn:
            raise InputError(f"The turn must be a whole number; the latest turn is {latest}.")
        if int(turn) != latest:
            raise InputError(f"Only the latest turn ({latest}) can be voted on; turn {turn:g} is not it.")
    return value


async def cast(comparison: Comparison, choice: str, session: str, store: VoteStore | None,
               voter: Voter | None = None) -> Vote:
    """Vote on the latest turn and keep it in `store` (None: in the page only); a kept vote needs a
    voter (the signed cookie, chat/voters.py)."""
    if store is not None and voter is None:
        raise InputError(NEEDS_COOKIE)
    vote = comparison.vote(choice)
    if store is None:
        return vote
    try:
        await store.record_async(comparison, len(comparison.turns) - 1, session, voter)
    except ChatError:
        comparison.turns[-1].vote = None
        raise
    except Exception as exc:  # a disk or database fault: logged, and the person may try again
        log.exception("Saving a vote failed")
        comparison.turns[-1].vote = None
        raise ChatError(NOT_SAVED) from exc
    return vote


def said(comparison: Comparison, vote: Vote) -> str:
    """What the voter reads: their choice, and after a blind vote which preset wrote which column."""
    text = f"You voted “{comparison.vote_text(vote)}” on turn {len(comparison.turns)}."
    names = "; ".join(f"{c.label} was {c.preset}" for c in comparison.columns)
    return f"{text} {names}." if vote.blind else text
