"""One visitor, one voice: signed voter cookies, and the store's limits per voter and per address."""

from __future__ import annotations

import sqlite3
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from chat.errors import InputError
from chat.voters import Voter, VoterKeys
from chat.votes import VOTES_PER_ADDRESS, VOTES_PER_VOTER, VoteStore, vote_record
from tests.test_votes import voted

pytestmark = pytest.mark.unit


def test_a_voter_cookie_is_the_servers_and_cannot_be_forged_or_edited(tmp_path):
    keys = VoterKeys.beside(tmp_path / "votes.sqlite3")
    value = keys.issue()
    voter = keys.voter(value)
    assert voter and keys.voter(value) == voter and keys.issue() != value
    version, who, signature = value.split(".")
    other = who[:-1] + ("1" if who[-1] == "0" else "0")
    assert keys.voter(f"{version}.{other}.{signature}") is None  # another voter, the same signature
    assert keys.voter(f"{version}.{who}.{'0' * len(signature)}") is None
    assert keys.voter(f"{version}.{who}.{'é' * len(signature)}") is None  # compare_digest raises on it
    assert keys.voter("anything") is None and keys.voter(None) is None and keys.voter("v1..") is None
    again = VoterKeys.beside(tmp_path / "votes.sqlite3")  # the same key after a restart, or in another worker
    assert again.voter(value) == voter
    assert oct((tmp_path / "votes.sqlite3.key").stat().st_mode & 0o777) == "0o600"
    assert VoterKeys.beside(tmp_path / "other.sqlite3").voter(value) is None


def test_workers_starting_at_once_sign_with_one_key(tmp_path):
    """UI workers read the key as they start, side by side: one that found the file another had just
    created read it empty, and the two signed with two keys (151 of 200 rounds of eight threads)."""
    import threading

    def start_worker(votes_db: Path, barrier: threading.Barrier, issued: list[str]) -> None:
        barrier.wait()
        issued.append(VoterKeys.beside(votes_db).issue())

    for round_ in range(50):
        votes_db = tmp_path / f"votes-{round_}.sqlite3"
        barrier = threading.Barrier(8)
        issued: list[str] = []
        workers = [threading.Thread(target=start_worker, args=(votes_db, barrier, issued)) for _ in range(8)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
        keys = VoterKeys.beside(votes_db)
        assert all(keys.voter(value) for value in issued), f"round {round_}: a worker signed with another key"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"votes-{r}.sqlite3.key" for r in range(50)), "nothing left beside"


def test_each_voter_and_each_address_gets_a_few_votes_an_hour(tmp_path):
    store = VoteStore(tmp_path / "votes.sqlite3")
    now = datetime.now(UTC)
    for i in range(VOTES_PER_VOTER):
        store.record(voted(prompt=f"p{i}"), 0, f"s{i}", Voter("one", "home"))
    with pytest.raises(InputError, match=f"You have cast {VOTES_PER_VOTER} votes in the last hour"):
        store.record(voted(prompt="one more"), 0, "s-more", Voter("one", "home"))
    for i in range(VOTES_PER_ADDRESS - VOTES_PER_VOTER):  # new voters (cookies dropped), the same address
        store.record(voted(prompt=f"q{i}"), 0, f"t{i}", Voter(f"new-{i}", "home"))
    with pytest.raises(InputError, match=f"{VOTES_PER_ADDRESS} votes came from your network"):
        store.record(voted(prompt="and more"), 0, "t-more", Voter("newest", "home"))
    store.record(voted(prompt="elsewhere"), 0, "u", Voter("far", "elsewhere"))  # another address
    for i in range(VOTES_PER_VOTER):  # this machine's own address is not counted, only its voters
        store.record(voted(prompt=f"local {i}"), 0, f"l{i}", Voter(f"local-{i}", ""))
    assert store.count() == VOTES_PER_ADDRESS + 1 + VOTES_PER_VOTER
    # An hour later the voter may vote again.
    later = vote_record(voted(prompt="later"), 0, "s-later", now=now + timedelta(hours=1, seconds=1),
                        voter=Voter("one", "home"))
    assert store.add(later).voter == "one"


def test_a_votes_file_from_before_voters_is_upgraded_in_place(tmp_path):
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE votes (id INTEGER PRIMARY KEY, comparison TEXT NOT NULL, turn INTEGER NOT NULL, "
               "session TEXT NOT NULL, cast_at TEXT NOT NULL, prompt TEXT NOT NULL, choice TEXT NOT NULL, "
               "blind INTEGER NOT NULL, columns TEXT NOT NULL, UNIQUE (comparison, turn))")
    db.execute("INSERT INTO votes VALUES (1, 'c', 1, 's', '2026-11-01T00:00:00.000+00:00', 'p', 'A', 1, '[]')")
    db.execute("PRAGMA user_version=1")
    db.commit()
    db.close()
    with VoteStore(path) as store:
        (old,) = store.votes()
        assert old.voter == "" and old.prompt == "p"
        store.record(voted(), 0, "s2", Voter("v", "a"))
        assert [r.voter for r in store.votes()] == ["", "v"]


def test_an_ipv6_network_is_one_voters_address(tmp_path):
    """One host gets a whole /64: its addresses are one address to the votes' limits."""
    from types import SimpleNamespace

    from chat.voters import COOKIE

    keys = VoterKeys.beside(tmp_path / "votes.sqlite3")
    cookie = keys.issue()

    def voter(host: str) -> Voter | None:
        return Voter.of(keys, SimpleNamespace(cookies={COOKIE: cookie}, client=SimpleNamespace(host=host)))

    one, same, other = voter("2001:db8:5:6::1"), voter("2001:db8:5:6:ffff::2"), voter("2001:db8:5:7::1")
    assert one and same and other and one.address == same.address != other.address
    assert voter("::1") and voter("::1").address == ""  # this machine's own loopback: not counted
