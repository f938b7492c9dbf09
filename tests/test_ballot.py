"""Casting a Compare vote: an API caller's values checked plainly, the vote kept in the store, and a
vote the store cannot keep taken back so it can be cast again."""

from __future__ import annotations

import pytest

from chat import ballot
from chat.compare import LABELS, Column, Comparison
from chat.errors import ChatError, InputError
from chat.voters import Voter
from chat.votes import VoteStore
from tests.test_votes import answer

pytestmark = pytest.mark.unit


def compared(blind: bool = True) -> Comparison:
    columns = [Column(LABELS[i], name, f"org/{name}", {}, "") for i, name in enumerate(("fast", "steady"))]
    comparison = Comparison(columns, blind=blind)
    answer(comparison, "Write a haiku.")
    return comparison


@pytest.mark.parametrize(("choice", "turn", "meant"), [
    ("A", None, "A"), (" b ", "", "B"), ("TIE", 1, "tie"), ("bad", 1.0, "bad"), ("A is better", None, "A"),
    ("Both bad", None, "bad"),
])
def test_an_api_caller_may_name_a_choice_by_label_or_by_the_buttons_words(choice, turn, meant):
    assert ballot.choice_of(compared(), choice, turn) == meant


@pytest.mark.parametrize(("comparison", "choice", "turn", "message"), [
    (None, "A", None, "There is no comparison in this session to vote on; run one with /compare first."),
    ("one turn", "C", None, "Vote with one of: A, B, tie, bad; 'C' is not one."),
    ("one turn", None, None, "Vote with one of: A, B, tie, bad; None is not one."),
    ("one turn", 1, None, "Vote with one of: A, B, tie, bad; 1 is not one."),
    ("one turn", "A", "first", "The turn must be a whole number; the latest turn is 1."),
    ("one turn", "A", True, "The turn must be a whole number; the latest turn is 1."),
    ("one turn", "A", 1.5, "The turn must be a whole number; the latest turn is 1."),
    ("one turn", "A", float("nan"), "The turn must be a whole number; the latest turn is 1."),
    ("one turn", "A", float("inf"), "The turn must be a whole number; the latest turn is 1."),
    ("one turn", "A", 1e400, "The turn must be a whole number; the latest turn is 1."),
    ("one turn", "A", 2, "Only the latest turn (1) can be voted on; turn 2 is not it."),
])
def test_a_malformed_vote_is_refused_with_a_sentence(comparison, choice, turn, message):
    with pytest.raises(InputError) as refused:
        ballot.choice_of(compared() if comparison else None, choice, turn)
    assert refused.value.message == message


VOTER = Voter("a-voter-digest", "an-address-digest")


async def test_a_kept_vote_needs_a_voter_and_nothing_is_cast_without_one(tmp_path):
    store = VoteStore(tmp_path / "votes.sqlite3")
    comparison = compared()
    with pytest.raises(InputError, match="Votes need this site's cookie"):
        await ballot.cast(comparison, "B", "session-1", store, None)
    assert comparison.turns[-1].vote is None and store.count() == 0
    assert (await ballot.cast(comparison, "B", "session-1", None)).choice == "B"  # in the page only: no voter needed


async def test_a_vote_is_kept_and_a_second_vote_on_the_turn_refused(tmp_path):
    store = VoteStore(tmp_path / "votes.sqlite3")
    comparison = compared()
    vote = await ballot.cast(comparison, "B", "session-1", store, VOTER)
    assert vote.blind and store.count() == 1 and store.votes()[0].winner == "steady"
    assert ballot.said(comparison, vote) == "You voted “B is better” on turn 1. A was fast; B was steady."
    with pytest.raises(InputError, match="You have voted on turn 1; send another prompt to vote again."):
        await ballot.cast(comparison, "A", "session-1", store, VOTER)
    assert store.count() == 1


async def test_a_vote_the_store_cannot_keep_is_taken_back(tmp_path):
    class Busy(VoteStore):
        def add(self, record):
            raise ChatError("The votes file was busy, so this vote was not saved; please try again in a moment.")

    class Broken(VoteStore):
        def add(self, record):
            raise OSError("disk I/O error")

    comparison = compared()
    with pytest.raises(ChatError, match="was busy"):
        await ballot.cast(comparison, "A", "session-1", Busy(tmp_path / "busy.sqlite3"), VOTER)
    assert comparison.turns[-1].vote is None and not comparison.revealed  # the names stay hidden
    with pytest.raises(ChatError) as failed:
        await ballot.cast(comparison, "A", "session-1", Broken(tmp_path / "broken.sqlite3"), VOTER)
    assert failed.value.message == ballot.NOT_SAVED and comparison.turns[-1].vote is None
    store = VoteStore(tmp_path / "votes.sqlite3")
    await ballot.cast(comparison, "A", "session-1", store, VOTER)  # and then it can be cast again
    assert store.count() == 1
