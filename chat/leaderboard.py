"""The leaderboard: presets ranked by every stored vote, as Chatbot Arena ranks models.

    board = rank(store.votes())              # or: await rank_async(await store.votes_async())
    board.standings[0].preset, board.standings[0].rating, board.standings[0].ci_low
    write_exports(board, directory)          # leaderboard.csv and leaderboard.json

Each vote becomes pairwise battles: "X is better/best" means X beat every other column; "tie" and
"all bad" are ties between every pair. A Bradley-Terry model, in which preset i beats preset j with
probability s_i / (s_i + s_j), is fitted to the battles by maximum likelihood, ties counting as
half a win each way. Ratings are on Arena's Elo-like scale, 1000 + 400 * log10(strength), centred
so the presets' average is 1000: a gap of 400 points means about 10:1 odds of winning. The 95%
intervals come from refitting on votes resampled with replacement (the battles of one vote stay
together, since they share a prompt and a voter).

Only votes cast blind count by default: once the names are shown, a vote says as much about the
names as about the replies (Arena leaves those out too).
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np

from chat.compare import ALL_BAD, TIE
from chat.exports import spreadsheet_safe, write_texts
from chat.votes import VoteRecord

BASE, SCALE = 1000.0, 400.0
ROUNDS = 1000  # bootstrap refits; about half a second for a handful of presets
# Each preset also plays one virtual battle, tied, against a fixed reference preset of strength 1:
# a light prior (half a win and half a loss) that keeps the fit finite when a preset wins or loses
# every battle, or when groups of presets were never compared with each other. With tens of
# battles per preset it moves a rating by a few points.
PRIOR_BATTLES = 1.0
FEW_VOTES = 20  # below this, resampling the votes understates how unsure the ratings are
METHOD = "Bradley-Terry"  # named for those who know it; visitors read what it does instead
_NEWTON_STEPS, _NEWTON_TOLERANCE = 100, 1e-10


@dataclass(frozen=True)
class Battle:
    """One pairwise result taken from a vote; score is a's: 1 won, 0.5 tie, 0 lost."""

    a: str
    b: str
    score: float


def battles_of(record: VoteRecord) -> list[Battle]:
    """The pairwise battles one vote stands for (none for a vote that names a preset twice)."""
    presets = [column.preset for column in record.columns]
    if len(presets) < 2 or len(set(presets)) != len(presets):
        return []
    if record.choice in (TIE, ALL_BAD):
        return [Battle(a, b, 0.5) for i, a in enumerate(presets) for b in presets[i + 1:]]
    winner = record.winner
    if winner is None:
        return []
    return [Battle(winner, other, 1.0) for other in presets if other != winner]


def fit_ratings(scores: np.ndarray, prior: float = PRIOR_BATTLES) -> np.ndarray:
    """Bradley-Terry ratings from scores[i, j] = i's points against j (a win 1, a tie 0.5 each).

    Maximises the log-likelihood (plus the prior) by Newton's method on log-strengths, which is
    logistic regression without an intercept; the prior makes it strictly concave, so it converges
    in a few steps. Returns ratings centred on BASE.
    """
    n = scores.shape[0]
    if n == 0:
        return np.zeros(0)
    played = scores + scores.T
    theta = np.zeros(n)

    def objective(t: np.ndarray) -> float:
        diff = t[:, None] - t[None, :]
        pair = float(np.sum(scores * -np.logaddexp(0.0, -diff)))
        return pair + prior / 2 * float(np.sum(-np.logaddexp(0.0, -t) - np.logaddexp(0.0, t)))

    current = objective(theta)
    for _ in range(_NEWTON_STEPS):
        p = _sigmoid(theta[:, None] - theta[None, :])
        q = _sigmoid(theta)
        gradient = np.sum(scores - played * p, axis=1) + prior * (0.5 - q)
        weights = played * p * (1 - p)
        hessian = weights.copy()
        np.fill_diagonal(hessian, -weights.sum(axis=1) - prior * q * (1 - q))
        step = np.linalg.solve(hessian, -gradient)
        # Halve the step until the objective improves: a full Newton step can overshoot when a
        # preset's results are lopsided.
        scale = 1.0
        while scale > 1e-6:
            trial = theta + scale * step
            value = objective(trial)
            if value >= current - 1e-12:
                break
            scale /= 2
        theta, current = trial, value
        if float(np.max(np.abs(scale * step))) < _NEWTON_TOLERANCE:
            break
    theta -= theta.mean()
    ratings: np.ndarray = BASE + SCALE * theta / math.log(10)
    return ratings


def _sigmoid(x: np.ndarray) -> np.ndarray:
    probability: np.ndarray = 0.5 * (1 + np.tanh(x / 2))  # never overflows
    return probability


@dataclass(frozen=True)
class Standing:
    """One row of the leaderboard."""

    rank: int  # 1 + presets whose interval lies wholly above this one's (Arena's rule), so ties share a rank
    preset: str
    rating: float
    ci_low: float  # 95% bootstrap interval
    ci_high: float
    votes: int  # votes counted that showed this preset
    battles: int  # pairwise results from them
    wins: int
    ties: int
    losses: int
    win_rate: float | None  # (wins + ties / 2) / battles, as the fit counts them
    first_token_median_s: float | None  # over this preset's replies in the counted votes
    tokens_per_s_median: float | None

    @property
    def has_spread(self) -> bool:
        """Whether the resamples disagreed at all: one vote, or votes that all agree, resample to the
        same rating every time, an interval of no width that says nothing about how sure it is."""
        return round(self.ci_high) > round(self.ci_low)

    def range_text(self) -> str:
        """The interval as the page says it: "1090 – 1160"; "not enough votes yet" or "±0" when the
        resamples never differed (with few votes, or many that all agree)."""
        if self.has_spread:
            return f"{self.ci_low:.0f} – {self.ci_high:.0f}"
        return "not enough votes yet" if self.votes < FEW_VOTES else "±0"


@dataclass(frozen=True)
class Leaderboard:
    standings: tuple[Standing, ...]  # best first
    votes_counted: int
    votes_left_out: int  # cast after the names were shown (or naming a preset twice)
    rounds: int
    seed: int
    made_at: str
    voters: int = 0  # distinct voters behind the counted votes (each vote's signed voter, else its session)

    def as_dict(self) -> dict[str, Any]:
        return {"kind": "vllm-chat-demo leaderboard", "version": 1, **asdict(self),
                "method": f"{METHOD}, ties half, {self.rounds} bootstrap rounds over votes, "
                          f"ratings {BASE:.0f} + {SCALE:.0f} * log10(strength), centred on {BASE:.0f}"}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False)

    def to_csv(self) -> str:
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CSV_FIELDS)
        writer.writeheader()
        for standing in self.standings:
            writer.writerow({key: "" if value is None else spreadsheet_safe(value)
                             for key, value in asdict(standing).items()})
        return out.getvalue()


CSV_FIELDS = tuple(f.name for f in fields(Standing))


def rank(votes: Sequence[VoteRecord], *, rounds: int = ROUNDS, seed: int = 0,
         include_revealed: bool = False) -> Leaderboard:
    """Rank the presets in `votes`; the same votes and seed always give the same table."""
    counted = [v for v in votes if (v.blind or include_revealed) and battles_of(v)]
    made_at = datetime.now(UTC).isoformat(timespec="seconds")
    if not counted:
        return Leaderboard((), 0, len(votes), rounds, seed, made_at)
    presets = sorted({column.preset for vote in counted for column in vote.columns})
    index = {name: i for i, name in enumerate(presets)}
    n = len(presets)

    # Every battle as (vote, i, j, score of i), so a resample only reweights votes.
    rows = [(v, index[b.a], index[b.b], b.score) for v, vote in enumerate(counted) for b in battles_of(vote)]
    vote_of, first, second, score = (np.array(column) for column in zip(*rows, strict=True))
    first, second = first.astype(int), second.astype(int)

    def scores(weights: np.ndarray) -> np.ndarray:
        w = weights[vote_of]
        flat = np.bincount(first * n + second, w * score, n * n) + np.bincount(second * n + first, w * (1 - score), n * n)
        table: np.ndarray = flat.reshape(n, n)
        return table

    ratings = fit_ratings(scores(np.ones(len(counted))))
    rng = np.random.default_rng(seed)
    draws = np.empty((rounds, n))
    for r in range(rounds):
        draws[r] = fit_ratings(scores(rng.multinomial(len(counted), np.full(len(counted), 1 / len(counted)))))
    low, high = (np.percentile(draws, [2.5, 97.5], axis=0) if rounds else (ratings, ratings))

    standings = []
    for name, i in index.items():
        mine = [b for vote in counted for b in battles_of(vote) if name in (b.a, b.b)]
        wins = sum(1 for b in mine if b.score != 0.5 and (b.a == name) == (b.score == 1.0))
        ties = sum(1 for b in mine if b.score == 0.5)
        stats = [c.stats for vote in counted for c in vote.columns if c.preset == name and c.stats]
        standings.append(Standing(
            rank=1 + sum(1 for j in range(n) if low[j] > high[i]), preset=name, rating=float(ratings[i]),
            ci_low=float(low[i]), ci_high=float(high[i]),
            votes=sum(1 for vote in counted if any(c.preset == name for c in vote.columns)),
            battles=len(mine), wins=wins, ties=ties, losses=len(mine) - wins - ties,
            win_rate=(wins + ties / 2) / len(mine) if mine else None,
            first_token_median_s=_median([s.get("first_token_s") for s in stats]),
            tokens_per_s_median=_median([s.get("tokens_per_s") for s in stats]),
        ))
    standings.sort(key=lambda s: (-s.rating, s.preset))
    voters = len({vote.voter or vote.session for vote in counted})
    return Leaderboard(tuple(standings), len(counted), len(votes) - len(counted), rounds, seed, made_at, voters)


def _median(values: Sequence[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


async def rank_async(votes: Sequence[VoteRecord], **options: Any) -> Leaderboard:
    """rank() in a worker thread: the bootstrap takes about half a second, too long for the event loop."""
    return await asyncio.to_thread(rank, votes, **options)


def write_exports(board: Leaderboard, directory: Path) -> dict[str, Path]:
    """Write leaderboard.csv and leaderboard.json into `directory`; return them by format."""
    return write_texts(directory, "leaderboard", {"csv": board.to_csv(), "json": board.to_json()})
