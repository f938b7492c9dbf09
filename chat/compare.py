"""Presets side by side: the record of a comparison, its blind labels and its votes.

    comparison = Comparison.start([preset_a, preset_b], blind=True)   # columns A, B, shuffled
    turn = comparison.add_turn("Write a haiku.", [sampling_a, sampling_b])
    comparison.history(column, turn_index)    # that column's own earlier turns, for its model
    comparison.vote("A")                      # on the latest turn; the names are then revealed

No Gradio and no engine here (chat/ui/compare_tab.py streams and draws; chat/compare_report.py
summarises and exports; chat/share_link.py encodes a setup as a link). Until a blind comparison has
a vote, whatever tells its columns apart (names, models, settings) reads HIDDEN, in the UI and in
the exports alike.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from chat.errors import InputError
from chat.history import Message, to_model_messages
from chat.presets import Preset
from chat.sampling import Sampling
from chat.stats import ReplyStats

LABELS = "ABCD"
MIN_COLUMNS, MAX_COLUMNS = 2, len(LABELS)
HIDDEN = "hidden until you vote"
HIDDEN_STATS = "Stats are shown after you vote: how fast and how long each reply is could tell the columns apart."
TIE, ALL_BAD = "tie", "bad"


@dataclass(frozen=True)
class Column:
    """One preset in the comparison, as it was when the comparison started."""

    label: str
    preset: str
    model: str
    engine: dict[str, Any]
    system_prompt: str

    @classmethod
    def of(cls, label: str, preset: Preset) -> Column:
        return cls(label, preset.name, preset.model, dict(preset.engine), preset.system_prompt)


@dataclass
class ComparedReply:
    """One reply in one column: attempt 1 answers the turn, later attempts are reruns."""

    column: int
    attempt: int
    sampling: Sampling  # the exact values it was (or is being) written with
    text: str = ""
    stats: ReplyStats | None = None
    error: str | None = None  # our plain sentence when it could not be written
    notice: str | None = None  # e.g. a timeout, shown with the stats
    stopped_early: bool = False  # Stop was pressed before the engine took it (error says so)
    finished: bool = False


@dataclass(frozen=True)
class Vote:
    choice: str  # a column label, TIE or ALL_BAD
    blind: bool  # the preset names were hidden when it was cast


@dataclass
class Turn:
    prompt: str
    replies: list[ComparedReply]
    vote: Vote | None = None

    def attempts(self, column: int) -> list[ComparedReply]:
        return [reply for reply in self.replies if reply.column == column]

    def reply(self, column: int) -> ComparedReply:
        """The turn's own reply in that column (the one later turns build on)."""
        return self.attempts(column)[0]


@dataclass
class Comparison:
    columns: list[Column]
    blind: bool = False
    turns: list[Turn] = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))

    @classmethod
    def start(cls, presets: Sequence[Preset], blind: bool = False, rng: random.Random | None = None) -> Comparison:
        """Columns for two to four distinct presets; in blind mode they are shuffled first."""
        names = [preset.name for preset in presets]
        if not MIN_COLUMNS <= len(names) <= MAX_COLUMNS:
            raise InputError(f"Pick two to four presets to compare; {len(names)} picked.")
        if len(set(names)) != len(names):
            raise InputError("Pick each preset only once.")
        order = list(presets)
        if blind:
            (rng or random.SystemRandom()).shuffle(order)
        return cls([Column.of(LABELS[i], preset) for i, preset in enumerate(order)], blind=blind)

    @property
    def revealed(self) -> bool:
        """Whether preset names may be shown: always, unless blind and not voted yet."""
        return not self.blind or any(turn.vote for turn in self.turns)

    @property
    def hides_stats(self) -> bool:
        """Blind and not voted on yet: nothing may tell the columns apart, speed and length included."""
        return not self.revealed

    def preset_of(self, column: int) -> str:
        return self.columns[column].preset if self.revealed else HIDDEN

    def title(self, column: int) -> str:
        """The column's heading: its label while blind, then the label and the preset's name."""
        label = self.columns[column].label
        return f"{label} · {self.columns[column].preset}" if self.revealed else label

    @property
    def in_flight(self) -> bool:
        return any(not reply.finished for turn in self.turns for reply in turn.replies)

    def add_turn(self, prompt: str, sampling: Sequence[Sampling]) -> Turn:
        """A new prompt for every column, each with its own exact settings."""
        if len(sampling) != len(self.columns):
            raise ValueError("one Sampling per column")
        turn = Turn(prompt, [ComparedReply(i, 1, values) for i, values in enumerate(sampling)])
        self.turns.append(turn)
        return turn

    def add_rerun(self, turn: int, column: int) -> ComparedReply:
        """Another reply to an earlier turn's prompt, with that column's preset and exact settings."""
        if not 0 <= turn < len(self.turns):
            raise InputError("There is no such turn to rerun; send a prompt first.")
        attempts = self.turns[turn].attempts(column)
        rerun = ComparedReply(column, len(attempts) + 1, attempts[0].sampling)
        self.turns[turn].replies.append(rerun)
        return rerun

    def history(self, column: int, turn: int) -> list[Message]:
        """The column's own conversation before that turn's prompt (reruns are never part of it)."""
        history: list[Message] = []
        for earlier in self.turns[:turn]:
            history.append({"role": "user", "content": earlier.prompt})
            history.append({"role": "assistant", "content": earlier.reply(column).text})
        return history

    def messages(self, column: int, turn: int) -> list[Message]:
        """What the column's model reads for that turn: system prompt, history, the turn's prompt."""
        return to_model_messages(self.history(column, turn), self.turns[turn].prompt, self.columns[column].system_prompt)

    def vote_options(self) -> list[tuple[str, str]]:
        """(button text, choice): "A is better" for two columns, "A is best" for more."""
        word = "better" if len(self.columns) == 2 else "best"
        options = [(f"{column.label} is {word}", column.label) for column in self.columns]
        return options + [("Tie", TIE), ("Both bad" if len(self.columns) == 2 else "All bad", ALL_BAD)]

    def vote(self, choice: str) -> Vote:
        """Record a vote on the latest turn; InputError says why it cannot be taken."""
        if not self.turns:
            raise InputError("Send a prompt first, then vote on the replies.")
        if self.in_flight:
            raise InputError("Wait until every column has finished, then vote.")
        turn = self.turns[-1]
        if turn.vote is not None:
            raise InputError(f"You have voted on turn {len(self.turns)}; send another prompt to vote again.")
        if choice not in dict((value, text) for text, value in self.vote_options()):
            raise InputError(f"{choice!r} is not one of the choices.")
        turn.vote = Vote(choice, blind=not self.revealed)
        return turn.vote

    def vote_text(self, vote: Vote) -> str:
        return next(text for text, value in self.vote_options() if value == vote.choice)
