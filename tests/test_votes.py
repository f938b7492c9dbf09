"""The vote store: what a vote keeps, what it refuses, and that no vote is lost when many voters
(threads of one app, or several app processes) write the same file at once."""

from __future__ import annotations

import asyncio
import csv
import io
import json
import sqlite3
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime

import pytest

from chat import settings
from chat.compare import ALL_BAD, LABELS, TIE, Column, Comparison
from chat.errors import ChatError, InputError
from chat.sampling import SamplingRules
from chat.stats import Finish, ReplyStats
from chat.vote_exports import votes_csv, votes_json, write_exports
from chat.votes import VoteStore, comparison_id, default_path, session_digest
from tests.conftest import ROOT

SESSION = "a1b2c3d4e5"


def voted(presets=("fast", "steady"), choice="A", prompt="Write a haiku.", texts=None, blind=True,
          first_token_s=0.25) -> Comparison:
    """A comparison with one finished turn and a vote on it, as the Compare tab leaves it."""
    columns = [Column(LABELS[i], name, f"org/{name}-model", {"max_num_seqs": 8 + i}, "Be brief.")
               for i, name in enumerate(presets)]
    comparison = Comparison(columns, blind=blind)
    answer(comparison, prompt, texts, first_token_s)
    comparison.vote(choice)
    return comparison


def answer(comparison: Comparison, prompt: str, texts=None, first_token_s=0.25) -> None:
    sampling = SamplingRules().defaults
    turn = comparison.add_turn(prompt, [sampling] * len(comparison.columns))
    for reply in turn.replies:
        reply.text = texts[reply.column] if texts else f"Reply {reply.column} at {time.perf_counter_ns()}."
        reply.stats = ReplyStats(
            preset=comparison.columns[reply.column].preset, sampling=sampling, prompt_tokens=12,
            cached_prompt_tokens=0, generated_tokens=21, first_token_s=first_token_s + reply.column / 10,
            total_s=1.25 + time.perf_counter() % 1e-3, queue_s=0.0, prefill_s=0.05, decode_s=1.0,
            finish=Finish.FINISHED, context_limit=2048,
        )
        reply.finished = True


@pytest.fixture
def store(tmp_path):
    with VoteStore(tmp_path / "votes.sqlite3") as store:
        yield store


def test_a_vote_keeps_the_presets_settings_prompt_stats_choice_and_time(store):
    comparison = voted(presets=("fast", "steady", "big"), choice="B")
    record = store.record(comparison, 0, SESSION)
    [stored] = store.votes()
    assert stored == record and stored.id is not None
    assert (stored.turn, stored.prompt, stored.choice, stored.blind, stored.winner) == (1, "Write a haiku.", "B", True, "steady")
    assert [c.preset for c in stored.columns] == ["fast", "steady", "big"]
    column = stored.columns[2]
    assert (column.model, column.engine, column.system_prompt) == ("org/big-model", {"max_num_seqs": 10}, "Be brief.")
    assert column.sampling == SamplingRules().defaults.as_dict()
    assert column.stats == comparison.turns[0].reply(2).stats.as_dict()
    assert column.text == comparison.turns[0].reply(2).text
    assert abs(datetime.fromisoformat(stored.cast_at) - datetime.now(UTC)).total_seconds() < 60
    # The voter is named only by a digest: Gradio's session hash would let its holder read that session.
    assert stored.session == session_digest(SESSION) and SESSION not in json.dumps(stored.as_dict())


def test_each_turn_of_a_comparison_takes_one_vote(store):
    comparison = voted()
    store.record(comparison, 0, SESSION)
    answer(comparison, "And another?")
    comparison.vote(TIE)
    store.record(comparison, 1, SESSION)
    first, second = store.votes()
    assert first.comparison == second.comparison == comparison_id(comparison, SESSION)
    assert (second.turn, second.choice, second.blind) == (2, TIE, False)  # the names were shown by then
    with pytest.raises(InputError, match="^Turn 2 already has a vote; send another prompt to vote again.$"):
        store.record(comparison, 1, SESSION)


def test_two_comparisons_with_the_same_prompt_are_told_apart(store):
    for _ in range(2):
        store.record(voted(texts=["Same.", "Same."]), 0, SESSION)
    assert len({vote.comparison for vote in store.votes()}) == 2


@pytest.mark.parametrize(("comparison", "turn", "session", "says"), [
    (None, 0, SESSION, "There is no comparison to vote on"),
    (Comparison([]), 0, SESSION, "There is no comparison to vote on"),
    ("not a comparison", 0, SESSION, "There is no comparison to vote on"),
    ("voted", 1, SESSION, "There is no turn 1 in this comparison"),
    ("voted", -1, SESSION, "There is no turn -1"),
    ("voted", "0", SESSION, "There is no turn '0'"),
    ("voted", True, SESSION, "There is no turn True"),
    ("voted", 0, "", "without a valid session"),
    ("voted", 0, None, "without a valid session"),
    ("voted", 0, "x" * 201, "without a valid session"),
    ("unvoted", 0, SESSION, "Turn 1 has no vote yet"),
])
def test_votes_that_cannot_be_taken_are_refused_with_a_sentence(store, comparison, turn, session, says):
    if comparison == "voted":
        comparison = voted()
    elif comparison == "unvoted":
        comparison = voted()
        comparison.turns[0].vote = None
    with pytest.raises(InputError, match=says) as refused:
        store.record(comparison, turn, session)
    assert refused.value.message.endswith(".") and "\n" not in refused.value.message
    assert store.count() == 0


def test_a_malformed_comparison_is_refused(store):
    twice = voted()
    twice.columns[1] = Column("B", "fast", "m", {}, "")
    with pytest.raises(InputError, match="two to four distinct presets"):
        store.record(twice, 0, SESSION)
    forged = voted()
    forged.turns[0].vote = type(forged.turns[0].vote)("C", True)
    with pytest.raises(InputError, match="'C' is not one of the choices"):
        store.record(forged, 0, SESSION)


def test_a_repeated_vote_is_refused_by_a_second_store_on_the_same_file(tmp_path):
    path = tmp_path / "shared.sqlite3"
    comparison = voted()
    with VoteStore(path) as first, VoteStore(path) as second:
        first.record(comparison, 0, SESSION)
        with pytest.raises(InputError, match="already has a vote"):
            second.record(comparison, 0, SESSION)
        assert first.count() == second.count() == 1


def test_votes_survive_closing_and_reopening_the_file(tmp_path):
    path = tmp_path / "deep" / "folder" / "votes.sqlite3"  # folders are made
    with VoteStore(path) as store:
        records = [store.record(voted(choice=choice), 0, f"session-{choice}") for choice in ("A", "B", TIE, ALL_BAD)]
    with VoteStore(path) as reopened:
        assert reopened.votes() == records
        mode = reopened._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_many_threads_voting_at_once_lose_nothing(store):
    comparisons = [[voted() for _ in range(25)] for _ in range(12)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(comparisons))

    def vote_all(mine: list[Comparison], who: int) -> None:
        start.wait()
        for comparison in mine:
            try:
                store.record(comparison, 0, f"thread-{who}")
            except BaseException as exc:
                errors.append(exc)

    threads = [threading.Thread(target=vote_all, args=(mine, who)) for who, mine in enumerate(comparisons)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert store.count() == 300 and len({v.comparison for v in store.votes()}) == 300


# One app process voting COUNT times; it imports only what the app would, so several start quickly.
WORKER = """
import sys
from chat.compare import Column, Comparison
from chat.sampling import SamplingRules
from chat.votes import VoteStore

path, worker, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
comparisons = []
for i in range(count):
    comparison = Comparison([Column("A", "fast", "m", {}, ""), Column("B", "steady", "m", {}, "")], blind=True)
    for reply in comparison.add_turn(f"Prompt {worker}-{i}", [SamplingRules().defaults] * 2).replies:
        reply.finished = True
    comparison.vote("AB"[i % 2])
    comparisons.append(comparison)
print("ready", flush=True)
sys.stdin.readline()  # every process opens the file and writes at the same moment
with VoteStore(path) as store:
    for comparison in comparisons:
        store.record(comparison, 0, f"process-{worker}")
"""


def test_several_processes_writing_one_new_file_lose_nothing(tmp_path):
    path = tmp_path / "votes.sqlite3"  # not created beforehand: the processes race to set it up too
    # Four processes of 100 votes (eight of 50 until 2026-12-07: each start is ~0.35 s of CPU in `--fast`).
    processes = [subprocess.Popen([sys.executable, "-c", WORKER, str(path), str(worker), "100"], cwd=ROOT, text=True,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                 for worker in range(4)]
    for process in processes:
        assert process.stdout.readline() == "ready\n", process.communicate()[1]
    for process in processes:
        process.stdin.write("go\n")
        process.stdin.flush()
    for process in processes:
        _, stderr = process.communicate(timeout=120)
        assert process.returncode == 0 and "locked" not in stderr, stderr
    with VoteStore(path) as store:
        votes = store.votes()
    assert len(votes) == 400 and len({(vote.comparison, vote.turn) for vote in votes}) == 400
    assert {vote.session for vote in votes} == {session_digest(f"process-{w}") for w in range(4)}


async def test_waiting_for_another_process_does_not_block_the_event_loop(store):
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process is writing
    ticked = asyncio.Event()

    async def tick() -> None:
        for _ in range(10):
            await asyncio.sleep(0.01)
        ticked.set()

    ticker = asyncio.create_task(tick())
    voting = asyncio.create_task(store.record_async(voted(), 0, SESSION))
    await ticked.wait()  # were the vote blocking the loop, no tick would come until it gave up (15 s)
    assert not voting.done()  # it waits for the lock in its thread while the loop keeps running
    holder.execute("COMMIT")
    record = await asyncio.wait_for(voting, 5)
    ticker.cancel()
    holder.close()
    assert (await store.votes_async()) == [record]


def test_a_vote_that_waits_too_long_for_the_file_says_so(tmp_path):
    with VoteStore(tmp_path / "votes.sqlite3", busy_timeout_s=0.2) as store:
        holder = sqlite3.connect(store.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        with pytest.raises(ChatError, match="^The votes file was busy, so this vote was not saved; please try again"):
            store.record(voted(), 0, SESSION)
        holder.execute("ROLLBACK")
        holder.close()
        assert store.count() == 0


def test_exports_neutralise_spreadsheet_formulas(store, tmp_path):
    prompt = '=HYPERLINK("http://evil.example","click")'
    texts = ["+SUM(A1:A9)", "@cmd|' /C calc'!A0"]
    store.record(voted(prompt=prompt, texts=texts), 0, SESSION)
    store.record(voted(prompt="-2+3", texts=["- a list item", "\tTAB"]), 0, SESSION)
    rows = list(csv.DictReader(io.StringIO(votes_csv(store.votes()))))
    assert len(rows) == 4
    assert {row["prompt"] for row in rows} == {"'" + prompt, "'-2+3"}
    assert [row["text"] for row in rows] == ["'+SUM(A1:A9)", "'@cmd|' /C calc'!A0", "- a list item", "'\tTAB"]
    assert rows[0]["seed"] == "-1" and rows[0]["outcome"] == "won" and rows[1]["outcome"] == "lost"
    assert rows[0]["model"] == "org/fast-model" and json.loads(rows[1]["engine"]) == {"max_num_seqs": 9}
    assert float(rows[0]["first_token_s"]) == 0.25 and rows[0]["finish"] == "finished"
    data = json.loads(votes_json(store.votes()))
    assert data["votes"][0]["prompt"] == prompt  # JSON keeps the text exactly
    paths = write_exports(store.votes(), tmp_path / "out")
    assert sorted(p.name for p in paths.values()) == ["votes.csv", "votes.json"]


def test_reset_deletes_every_vote_and_voting_goes_on(store):
    comparison = voted()
    store.record(comparison, 0, SESSION)
    store.record(voted(), 0, SESSION)
    assert store.reset() == 2 and store.votes() == []
    store.record(comparison, 0, SESSION)
    assert store.count() == 1


def test_a_file_that_is_not_a_database_is_refused_with_a_sentence(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not votes\n" * 100)
    with pytest.raises(ChatError, match=r"Cannot use .*notes.txt for votes .*; set --votes-db to another file\."):
        VoteStore(path)


def test_the_file_is_set_by_flag_or_environment_and_defaults_beside_the_model_cache(monkeypatch, tmp_path):
    assert settings.parse([]).votes_db == str(default_path())
    assert default_path().name == "votes.sqlite3"
    monkeypatch.setenv("CHAT_VOTES_DB", str(tmp_path / "env.sqlite3"))
    assert settings.parse([]).votes_db == str(tmp_path / "env.sqlite3")
    assert settings.parse(["--votes-db", "/x/flag.sqlite3"]).votes_db == "/x/flag.sqlite3"
