"""Presets side by side: the record of a comparison, blind labels, votes, summary, exports, links.

    comparison = Comparison.start([preset_a, preset_b], blind=True)   # columns A, B, shuffled
    turn = comparison.add_turn("Write a haiku.", [sampling_a, sampling_b])
    comparison.messages(column, turn_index)   # that column's own conversation, for its model
    comparison.vote("A")                      # on the latest turn; the names are then revealed

No Gradio and no engine here (chat/ui/compare_tab.py streams and draws). Until a blind comparison
has a vote, whatever tells its columns apart (names, models, settings) reads HIDDEN, in the UI and
in the exports alike.
"""

from __future__ import annotations

import csv
import io
import json
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from chat.errors import InputError, SettingsError
from chat.history import Message, to_model_messages
from chat.presets import Preset
from chat.sampling import KNOB_NAMES, KNOBS, Sampling, SamplingRules
from chat.stats import ReplyStats

LABELS = "ABCD"
MIN_COLUMNS, MAX_COLUMNS = 2, len(LABELS)
HIDDEN = "hidden until you vote"
TIE, ALL_BAD = "tie", "bad"
LINK_PROMPT_CHARS = 2000  # a longer prompt is left out of a link (browsers cut long addresses)


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

    def messages(self, column: int, turn: int) -> list[Message]:
        """The column's own conversation up to that turn's prompt (reruns are never part of it)."""
        history: list[dict[str, Any]] = []
        for earlier in self.turns[:turn]:
            history.append({"role": "user", "content": earlier.prompt})
            history.append({"role": "assistant", "content": earlier.reply(column).text})
        return to_model_messages(history, self.turns[turn].prompt, self.columns[column].system_prompt)

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


# --- summary -------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, interpolating between the closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


@dataclass(frozen=True)
class ColumnSummary:
    """One row of the session summary: every reply of one column (reruns included)."""

    label: str
    preset: str
    replies: int
    first_token_median_s: float | None
    first_token_p95_s: float | None
    tokens_per_s_median: float | None
    length_median_tokens: float | None
    votes_won: int



def summarize(comparison: Comparison) -> list[ColumnSummary]:
    rows = []
    for index, column in enumerate(comparison.columns):
        stats = [r.stats for turn in comparison.turns for r in turn.attempts(index) if r.stats is not None]
        first_tokens = [s.first_token_s for s in stats if s.first_token_s is not None]
        speeds = [s.tokens_per_s for s in stats if s.tokens_per_s is not None]
        wins = sum(1 for turn in comparison.turns if turn.vote and turn.vote.choice == column.label)
        rows.append(ColumnSummary(
            label=column.label, preset=comparison.preset_of(index), replies=len(stats),
            first_token_median_s=percentile(first_tokens, 50), first_token_p95_s=percentile(first_tokens, 95),
            tokens_per_s_median=percentile(speeds, 50),
            length_median_tokens=percentile([s.generated_tokens for s in stats], 50), votes_won=wins,
        ))
    return rows


# --- exports -------------------------------------------------------------------------------


def as_dict(comparison: Comparison) -> dict[str, Any]:
    """Everything: columns with their preset and engine, every turn, reply, stat and vote."""
    shown = comparison.revealed
    columns = [
        {"label": column.label, "preset": comparison.preset_of(i), "model": column.model if shown else HIDDEN,
         "engine": column.engine if shown else HIDDEN, "system_prompt": column.system_prompt if shown else HIDDEN}
        for i, column in enumerate(comparison.columns)
    ]
    turns = []
    for number, turn in enumerate(comparison.turns, 1):
        vote = None
        if turn.vote:
            vote = {"choice": turn.vote.choice, "text": comparison.vote_text(turn.vote), "cast_blind": turn.vote.blind}
        replies = [
            {"column": comparison.columns[reply.column].label, "preset": comparison.preset_of(reply.column),
             "attempt": reply.attempt, "sampling": reply.sampling.as_dict() if shown else HIDDEN, "text": reply.text,
             "stats": _without(reply.stats.as_dict(), "preset", "sampling") if reply.stats else None,
             "error": reply.error, "notice": reply.notice}
            for reply in turn.replies
        ]
        turns.append({"number": number, "prompt": turn.prompt, "vote": vote, "replies": replies})
    return {"kind": "vllm-chat-demo preset comparison", "version": 1, "started": comparison.started,
            "blind": comparison.blind, "revealed": shown, "columns": columns, "turns": turns,
            "summary": [asdict(row) for row in summarize(comparison)]}


def _without(values: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {key: value for key, value in values.items() if key not in keys}  # said beside the stats already


def to_json(comparison: Comparison) -> str:
    return json.dumps(as_dict(comparison), indent=2, ensure_ascii=False, default=str)


CSV_FIELDS = (
    "turn", "prompt", "column", "preset", "attempt", "text", "error", "notice", *KNOB_NAMES,
    "first_token_s", "tokens_per_s", "generated_tokens", "prompt_tokens", "cached_prompt_tokens", "total_s",
    "queue_s", "prefill_s", "decode_s", "finish", "context_limit", "vote", "vote_cast_blind", "won",
)


def to_csv(comparison: Comparison) -> str:
    """One row per reply; the turn's vote is repeated on each of its rows."""
    data = as_dict(comparison)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for turn in data["turns"]:
        vote = turn["vote"] or {}
        for reply in turn["replies"]:
            row = {
                "turn": turn["number"], "prompt": _cell(turn["prompt"]), "column": reply["column"],
                "preset": reply["preset"], "attempt": reply["attempt"], "text": _cell(reply["text"]),
                "error": reply["error"] or "", "notice": reply["notice"] or "",
                "vote": vote.get("text", ""), "vote_cast_blind": vote.get("cast_blind", ""),
                "won": "" if not vote else vote["choice"] == reply["column"],
            }
            if isinstance(reply["sampling"], dict):
                row.update(reply["sampling"])
            row.update({key: "" if value is None else value for key, value in (reply["stats"] or {}).items()})
            writer.writerow(row)
    return out.getvalue()


def _cell(text: str) -> str:
    """Text a spreadsheet will not run as a formula (a reply can be steered into writing one)."""
    if text[:1] in ("=", "+", "@") or (text[:1] == "-" and text[1:2] not in (" ", "")):
        return "'" + text
    return text


def to_markdown(comparison: Comparison) -> str:
    """A report to paste: the columns and their settings, the summary, then every turn."""
    data = as_dict(comparison)
    lines = [
        "# Preset comparison",
        "",
        f"Started {comparison.started}." + (" Blind: the columns were labelled A, B, … until the first vote." if comparison.blind else ""),
        "",
        "## Columns",
        "",
        "| Column | Preset | Model | Engine arguments | System prompt |",
        "|---|---|---|---|---|",
    ]
    for column in data["columns"]:
        engine = column["engine"] if column["engine"] == HIDDEN else json.dumps(column["engine"], default=str)
        lines.append(_row(column["label"], column["preset"], column["model"], engine, column["system_prompt"]))
    lines += ["", "## Summary", "", "| Column | Preset | Replies | Median first token | 95th percentile first token "
              "| Median tokens/s | Median length (tokens) | Votes won |", "|---|---|---|---|---|---|---|---|"]
    for row in summarize(comparison):
        lines.append(_row(row.label, row.preset, row.replies, _ms(row.first_token_median_s), _ms(row.first_token_p95_s),
                          _number(row.tokens_per_s_median), _number(row.length_median_tokens), row.votes_won))
    for number, turn in enumerate(comparison.turns, 1):
        lines += ["", f"## Turn {number}", "", *(f"> {line}" for line in turn.prompt.splitlines() or [""])]
        for reply in turn.replies:
            rerun = f" (rerun {reply.attempt})" if reply.attempt > 1 else ""
            lines += ["", f"### {comparison.title(reply.column)}{rerun}", ""]
            lines += [*(f"> {line}" for line in reply.text.splitlines() or ["(no text)"]), ""]
            if reply.stats is not None:
                lines.append(f"*{reply.stats.summary()}*")
            if reply.error or reply.notice:
                lines.append(f"*{reply.error or reply.notice}*")
            lines.append(f"Settings: {settings_text(reply.sampling) if comparison.revealed else HIDDEN}")
        if turn.vote:
            blind = " (cast blind)" if turn.vote.blind else ""
            lines += ["", f"**Vote:** {comparison.vote_text(turn.vote)}{blind}"]
    return "\n".join(lines) + "\n"


def settings_text(sampling: Sampling) -> str:
    return " · ".join(f"{knob.label} {knob.format(getattr(sampling, knob.name))}" for knob in KNOBS)


def _row(*cells: object) -> str:
    return "| " + " | ".join(str(cell).replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.0f} ms"


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def write_exports(comparison: Comparison, directory: Path) -> dict[str, Path]:
    """Write comparison.md, .csv and .json into `directory` (a server temp dir); return them by format."""
    directory.mkdir(parents=True, exist_ok=True)
    files = {"md": to_markdown(comparison), "csv": to_csv(comparison), "json": to_json(comparison)}
    paths = {}
    for ext, text in files.items():
        path = directory / f"comparison.{ext}"
        path.write_text(text, encoding="utf-8", newline="")
        paths[ext] = path
    return paths


# --- share links -----------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkSetup:
    """What a share link reproduces: presets in order, each one's exact settings, the prompt."""

    presets: tuple[str, ...]
    sampling: tuple[Sampling, ...]
    prompt: str = ""
    blind: bool = False


def encode_link(presets: Sequence[Preset], sampling: Sequence[Sampling], prompt: str = "", blind: bool = False) -> str:
    """The query part of a share link, "?p=...&p=...&s1=temperature:0.2,max_tokens:64&q=...".

    Only preset names travel, and per preset only the settings that differ from its defaults.
    A prompt longer than LINK_PROMPT_CHARS is left out.
    """
    pairs = [("p", preset.name) for preset in presets]
    for index, (preset, values) in enumerate(zip(presets, sampling, strict=True), 1):
        changed = _overrides(preset.sampling, values)
        if changed:
            pairs.append((f"s{index}", ",".join(f"{name}:{value}" for name, value in changed.items())))
    if blind:
        pairs.append(("blind", "1"))
    if prompt and len(prompt) <= LINK_PROMPT_CHARS:
        pairs.append(("q", prompt))
    return "?" + urlencode(pairs, quote_via=quote, safe=":,()")


def _overrides(rules: SamplingRules, values: Sampling) -> dict[str, str]:
    defaults = rules.defaults
    changed = {}
    for knob in rules.knobs:
        value = getattr(values, knob.name)
        if value != getattr(defaults, knob.name):
            changed[knob.name] = str(int(value)) if knob.integer or float(value).is_integer() else repr(float(value))
    return changed


def decode_link(query: Iterable[tuple[str, str]], lookup: Callable[[str], Preset]) -> LinkSetup | None:
    """The setup a link's query describes, None when it describes none.

    `lookup` finds a usable preset by name (raising PresetError); every value is checked against
    that preset's ranges. Raises InputError, PresetError or SettingsError with a plain sentence.
    """
    pairs = list(query)
    names = [value for key, value in pairs if key == "p"]
    if not names:
        return None
    if not MIN_COLUMNS <= len(names) <= MAX_COLUMNS:
        raise InputError(f"A comparison link names two to four presets; this one names {len(names)}.")
    if len(set(names)) != len(names):
        raise InputError("This comparison link names a preset twice.")
    presets = [lookup(name) for name in names]
    settings = {key: value for key, value in pairs if re.fullmatch(r"s\d+", key)}
    for key in settings:
        if not 1 <= int(key[1:]) <= len(presets):
            raise SettingsError(f"This link has settings {key} but names only {len(presets)} presets.")
    sampling = []
    for index, preset in enumerate(presets, 1):
        try:
            sampling.append(preset.sampling.resolve(_parse_overrides(settings.get(f"s{index}", ""))))
        except SettingsError as exc:
            raise SettingsError(f"{preset.name}: {exc.message}") from None
    prompts = [value for key, value in pairs if key == "q"]
    prompt = prompts[-1] if prompts else ""
    if len(prompt) > LINK_PROMPT_CHARS:
        raise InputError(f"The prompt in this link is {len(prompt):,} characters; a link may carry {LINK_PROMPT_CHARS:,}.")
    blind = any(key == "blind" and value.lower() in ("1", "true", "yes") for key, value in pairs)
    return LinkSetup(tuple(p.name for p in presets), tuple(sampling), prompt, blind)


def _parse_overrides(text: str) -> dict[str, object]:
    values: dict[str, object] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, colon, raw = item.partition(":")
        if not colon:
            raise SettingsError(f"{item!r} in the link is not a setting; write name:value, e.g. temperature:0.2.")
        values[name.strip()] = _number_of(raw.strip())
    return values


def _number_of(raw: str) -> object:
    """An int or float when the text is one; otherwise the text, which the knob's check then refuses."""
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            continue
    return raw
