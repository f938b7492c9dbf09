"""Votes through the running app's Gradio API: on disk for the next start, none lost when several sessions
vote at once, and refused with a sentence when there is nothing to vote on, twice, or malformed."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import threading

import pytest
from gradio_client import Client

from chat.ui.leaderboard_tab import Standings, leaderboard_data
from chat.votes import VoteStore
from tests.conftest import api_client

pytestmark = pytest.mark.app

CREATIVE, DETERMINISTIC = "SmolLM2 135M (CPU)", "SmolLM2 135M (CPU, deterministic)"


def compare(client: Client, prompt: str, blind: bool = True, max_tokens: int = 6) -> None:
    """One finished turn of a comparison in this client's session (the /compare endpoint's inputs:
    presets, blind, prompt, then each preset's settings by name)."""
    settings = {"temperature": 0.0, "max_tokens": max_tokens, "seed": 1}
    client.predict([CREATIVE, DETERMINISTIC], blind, prompt, [settings, settings], api_name="/compare")


def vote(client: Client, choice: object, turn: object = None) -> dict:
    return client.predict(choice, turn, api_name="/vote")


def stored(client: Client) -> dict:
    return client.predict(False, api_name="/leaderboard")


def test_several_sessions_voting_at_once_lose_no_vote(app_server):
    sessions = [api_client(app_server.url) for _ in range(4)]
    before = stored(sessions[0])["votes_stored"]
    threads = [threading.Thread(target=compare, args=(client, f"Name a colour, number {i}.")) for i, client in enumerate(sessions)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    start = threading.Barrier(len(sessions))
    answers: list[dict] = []

    def cast(client: Client, choice: str) -> None:
        start.wait(30)
        answers.append(vote(client, choice))

    voters = [threading.Thread(target=cast, args=(client, choice)) for client, choice in zip(sessions, "AB", strict=False)]
    voters += [threading.Thread(target=cast, args=(client, choice)) for client, choice in zip(sessions[2:], ("tie", "bad"), strict=True)]
    for voter in voters:
        voter.start()
    for voter in voters:
        voter.join(60)
    assert len(answers) == 4 and all(answer["ok"] for answer in answers), answers
    assert all(answer["blind"] and answer["turn"] == 1 for answer in answers)
    assert {answer["choice"] for answer in answers} == {"A", "B", "tie", "bad"}
    board = stored(sessions[0])
    assert board["votes_stored"] == before + 4
    assert {s["preset"] for s in board["standings"]} == {CREATIVE, DETERMINISTIC}


def test_votes_with_nothing_to_vote_on_twice_or_malformed_are_refused_with_a_sentence(app_server):
    client = api_client(app_server.url)
    assert vote(client, "A") == {"ok": False,
                                 "error": "There is no comparison in this session to vote on; run one with /compare first."}
    compare(client, "Say hello.", blind=False)
    for choice, turn, error in [
        ("Z", None, "Vote with one of: A, B, tie, bad; 'Z' is not one."),
        (None, None, "Vote with one of: A, B, tie, bad; None is not one."),
        ("A", "first", "The turn must be a whole number; the latest turn is 1."),
        ("A", 7, "Only the latest turn (1) can be voted on; turn 7 is not it."),
    ]:
        assert vote(client, choice, turn) == {"ok": False, "error": error}
    first = vote(client, "B", 1)
    assert first["ok"] and not first["blind"] and first["message"] == "You voted “B is better” on turn 1."
    assert vote(client, "A") == {"ok": False, "error": "You have voted on turn 1; send another prompt to vote again."}


async def test_votes_survive_a_restart_of_the_app(app_server, tmp_path):
    """A vote is on disk once it is answered, not only at a clean stop: the leaderboard a new app
    would build from a copy of the running app's votes file (taken while that app runs; chat/server.py
    opens it as `VoteStore`, /leaderboard answers `leaderboard_data`) is the one the app shows. In the
    test process: another app's start would only add Gradio's and the stand-in engine's to it."""
    client = api_client(app_server.url)
    await asyncio.to_thread(compare, client, "Write one word about the sea.")
    assert (await asyncio.to_thread(vote, client, "A"))["ok"]
    board = await asyncio.to_thread(stored, client)
    copy = tmp_path / "votes.sqlite3"
    votes_file = app_server.process.args[app_server.process.args.index("--votes-db") + 1]
    with contextlib.closing(sqlite3.connect(votes_file)) as source, contextlib.closing(sqlite3.connect(copy)) as target:
        source.backup(target)
    store = VoteStore(copy)
    try:
        after = json.loads(json.dumps(await leaderboard_data(Standings(store))))  # as /leaderboard sends it
    finally:
        store.close()
    assert after["votes_stored"] == board["votes_stored"] >= 1
    assert after["votes_counted"] == board["votes_counted"] >= 1
    assert after["standings"] == board["standings"] and {s["preset"] for s in after["standings"]} >= {CREATIVE, DETERMINISTIC}
