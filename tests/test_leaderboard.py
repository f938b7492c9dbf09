"""The leaderboard's statistics: known strengths come back from simulated votes, ties count half,
intervals behave, and the edge cases (no votes, a preset that always wins) stay finite."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import random
import re

import numpy as np
import pytest

from chat.compare import ALL_BAD, LABELS, TIE, Column, Comparison
from chat.leaderboard import Battle, battles_of, fit_ratings, rank, rank_async, write_exports
from chat.votes import ColumnVote, VoteRecord, vote_record

TRUE = {"steady": 1150.0, "fast": 1050.0, "tiny": 950.0, "eager": 850.0}  # average 1000, as the fit centres


def record(presets, choice, blind=True, stats=None) -> VoteRecord:
    columns = tuple(
        ColumnVote(LABELS[i], name, "m", {}, "", {}, (stats or {}).get(name), "text")
        for i, name in enumerate(presets)
    )
    return VoteRecord("c", 1, "s", "2026-11-01T00:00:00.000+00:00", "p", choice, blind, columns)


def p_win(a: str, b: str) -> float:
    return 1 / (1 + 10 ** ((TRUE[b] - TRUE[a]) / 400))


def simulate(count: int, seed: int, sizes=(2,)) -> list[VoteRecord]:
    """Blind votes from voters who pick by the true strengths (Luce's choice rule for 3-4 columns)."""
    rng = random.Random(seed)
    votes = []
    for _ in range(count):
        presets = rng.sample(sorted(TRUE), rng.choice(sizes))
        strengths = [10 ** (TRUE[p] / 400) for p in presets]
        best = rng.choices(range(len(presets)), weights=strengths)[0]
        votes.append(record(presets, LABELS[best]))
    return votes


def by_preset(board):
    return {s.preset: s for s in board.standings}


def test_known_strengths_come_back_from_simulated_votes():
    board = rank(simulate(3000, seed=1), rounds=200)
    assert [s.preset for s in board.standings] == sorted(TRUE, key=TRUE.get, reverse=True)
    for name, standing in by_preset(board).items():
        assert standing.rating == pytest.approx(TRUE[name], abs=35), name
    rows = by_preset(board)
    assert rows["steady"].rating - rows["eager"].rating == pytest.approx(300, abs=50)
    assert sum(s.rating for s in board.standings) / 4 == pytest.approx(1000)


def test_votes_with_three_and_four_columns_rank_in_the_true_order():
    board = rank(simulate(1500, seed=2, sizes=(3, 4)), rounds=100)
    assert [s.preset for s in board.standings] == sorted(TRUE, key=TRUE.get, reverse=True)


def test_a_vote_becomes_pairwise_battles():
    assert battles_of(record(["a", "b"], "B")) == [Battle("b", "a", 1.0)]
    assert battles_of(record(["a", "b", "c"], "A")) == [Battle("a", "b", 1.0), Battle("a", "c", 1.0)]
    assert battles_of(record(["a", "b", "c", "d"], ALL_BAD)) == [
        Battle(a, b, 0.5) for a, b in itertools.combinations("abcd", 2)]
    assert battles_of(record(["a", "b", "c"], TIE)) == [Battle("a", "b", 0.5), Battle("a", "c", 0.5), Battle("b", "c", 0.5)]
    assert battles_of(record(["a", "a"], "A")) == []  # a malformed vote naming one preset twice counts for nothing


def test_ties_count_as_half_a_win_each_way():
    with_ties = [record(["a", "b"], "A")] * 10 + [record(["a", "b"], TIE)] * 10
    without = [record(["a", "b"], "A")] * 15 + [record(["a", "b"], "B")] * 5
    tied, plain = by_preset(rank(with_ties, rounds=0)), by_preset(rank(without, rounds=0))
    assert tied["a"].rating == pytest.approx(plain["a"].rating, abs=1e-6)
    # 15 points to 5 is odds of 3:1, a gap of 400*log10(3) = 191, less a little for the prior.
    assert 180 < tied["a"].rating - tied["b"].rating < 191
    a = tied["a"]
    assert (a.votes, a.battles, a.wins, a.ties, a.losses, a.win_rate) == (20, 20, 10, 10, 0, 0.75)


def test_the_interval_holds_the_rating_and_narrows_with_more_votes():
    few, many = rank(simulate(60, seed=3), rounds=300), rank(simulate(1200, seed=3), rounds=300)
    for board in (few, many):
        for s in board.standings:
            assert s.ci_low <= s.rating <= s.ci_high
    width = {name: s.ci_high - s.ci_low for name, s in by_preset(few).items()}
    for name, s in by_preset(many).items():
        assert s.ci_high - s.ci_low < width[name] / 2.5, name  # 20x the votes: about 1/4.5 the width


def test_the_same_votes_and_seed_give_the_same_table():
    votes = simulate(200, seed=4)
    first, again, other = rank(votes, rounds=100, seed=7), rank(votes, rounds=100, seed=7), rank(votes, rounds=100, seed=8)
    assert first.standings == again.standings
    assert first.standings != other.standings


def test_a_preset_that_always_wins_gets_a_finite_rating():
    votes = [record(["champ", "b"], "A")] * 30 + [record(["champ", "c"], "A")] * 30 + [record(["b", "c"], "A")] * 10
    board = rank(votes, rounds=200)
    rows = by_preset(board)
    assert [s.preset for s in board.standings] == ["champ", "b", "c"]
    assert all(math.isfinite(v) for s in board.standings for v in (s.rating, s.ci_low, s.ci_high))
    assert rows["champ"].rating - rows["b"].rating > 200 and rows["champ"].win_rate == 1.0
    assert rows["champ"].losses == 0 and rows["c"].wins == 0


def test_no_votes_one_preset_and_revealed_votes():
    assert rank([]).standings == ()
    assert fit_ratings(np.zeros((1, 1))).tolist() == [1000.0]
    revealed = [record(["a", "b"], "A", blind=False)] * 5
    assert rank(revealed).standings == () and rank(revealed).votes_left_out == 5
    board = rank(revealed + [record(["a", "b"], "B")], rounds=50, include_revealed=True)
    assert (board.votes_counted, by_preset(board)["a"].wins) == (6, 5)


def test_rank_says_which_presets_cannot_be_told_apart():
    votes = [record(["a", "b"], "A")] * 200 + [record(["b", "c"], TIE)] * 200 + [record(["a", "c"], "A")] * 200
    ranks = {s.preset: s.rank for s in rank(votes, rounds=200).standings}
    assert ranks == {"a": 1, "b": 2, "c": 2}


def test_medians_come_from_the_voted_replies():
    from tests.test_votes import voted  # a real comparison turned into a record, stats and all

    records = [vote_record(voted(first_token_s=ft), 0, f"s{i}") for i, ft in enumerate((0.1, 0.2, 0.9))]
    rows = by_preset(rank(records, rounds=20))
    assert rows["fast"].first_token_median_s == pytest.approx(0.2)
    assert rows["steady"].first_token_median_s == pytest.approx(0.3)  # column B was 0.1 s slower each time
    assert rows["fast"].tokens_per_s_median == pytest.approx(20.0)  # 20 tokens after the first, in 1 s
    failed = record(["fast", "x"], "A", stats={"x": None})
    assert by_preset(rank([failed], rounds=0))["x"].first_token_median_s is None


async def test_exports_and_the_async_form(tmp_path):
    named = [record(["=cmd()", "b"], "A")] * 3
    board = await rank_async(named, rounds=20)
    rows = list(csv.DictReader(io.StringIO(board.to_csv())))
    assert [row["preset"] for row in rows] == ["'=cmd()", "b"]
    assert float(rows[0]["rating"]) > float(rows[1]["rating"]) and rows[0]["wins"] == "3"
    data = json.loads(board.to_json())
    assert data["standings"][0]["preset"] == "=cmd()" and data["votes_counted"] == 3 and "Bradley-Terry" in data["method"]
    paths = write_exports(board, tmp_path)
    assert sorted(p.name for p in paths.values()) == ["leaderboard.csv", "leaderboard.json"]


def test_a_comparison_recorded_and_ranked_end_to_end(tmp_path):
    from chat.votes import VoteStore

    columns = [Column(LABELS[i], name, "m", {}, "") for i, name in enumerate(("x", "y"))]
    with VoteStore(tmp_path / "v.sqlite3") as store:
        for i in range(6):
            comparison = Comparison(list(columns), blind=True)
            for reply in comparison.add_turn(f"Q{i}", [_defaults()] * 2).replies:
                reply.finished = True
            comparison.vote("A" if i < 5 else "B")
            store.record(comparison, 0, f"s{i}")
        board = rank(store.votes(), rounds=50)
    assert [(s.preset, s.wins, s.losses) for s in board.standings] == [("x", 5, 1), ("y", 1, 5)]


def _defaults():
    from chat.sampling import SamplingRules

    return SamplingRules().defaults


def test_an_interval_without_width_is_said_honestly_and_the_method_is_one_click_away():
    from chat.ui.leaderboard_tab import COLUMNS, HOW, INTRO, chart, table

    one = rank([record(["a", "b"], "A")], rounds=50)  # every resample is this one vote
    assert all(s.ci_low == s.ci_high and not s.has_spread for s in one.standings)
    assert [s.range_text() for s in one.standings] == ["not enough votes yet"] * 2
    agreed = rank([record(["a", "b"], "A")] * 30, rounds=50)  # many votes, all alike: still no spread
    assert [s.range_text() for s in agreed.standings] == ["±0"] * 2
    mixed = rank(simulate(200, seed=5), rounds=100)
    assert all(s.has_spread and s.range_text() == f"{s.ci_low:.0f} – {s.ci_high:.0f}" for s in mixed.standings)

    rows = table(one)
    assert list(rows["Likely range"]) == ["not enough votes yet"] * 2 and "Likely range" in COLUMNS
    svg = chart(one)
    assert "(too few votes)" in svg and not re.search(r"(\d+)–\1\b", svg), svg  # never "1131–1131"
    assert "(±0)" in chart(agreed)
    assert "Bradley-Terry" not in INTRO and "Bradley-Terry" not in svg and "Bradley-Terry" in HOW
    assert "95% bootstrap interval" in HOW and "1 votes" not in svg
