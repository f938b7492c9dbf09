"""A comparison summarised and exported: the per-column summary, and Markdown, CSV and JSON reports.

Blind comparisons stay blind here too: until the first vote, whatever tells the columns apart reads
HIDDEN (chat/compare.py decides).
"""

from __future__ import annotations

import csv
import io
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chat.compare import HIDDEN, HIDDEN_STATS, Comparison
from chat.exports import spreadsheet_safe, write_texts
from chat.sampling import KNOB_NAMES, KNOBS, Sampling
from chat.stats import percentile


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
        if comparison.hides_stats:  # blind: speed and length would tell the columns apart before the vote
            rows.append(ColumnSummary(column.label, comparison.preset_of(index), len(stats), None, None, None, None, 0))
            continue
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
             "stats": _without(reply.stats.as_dict(), "preset", "sampling")
             if reply.stats and not comparison.hides_stats else None,
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
                "turn": turn["number"], "prompt": spreadsheet_safe(turn["prompt"]), "column": reply["column"],
                "preset": reply["preset"], "attempt": reply["attempt"], "text": spreadsheet_safe(reply["text"]),
                "error": reply["error"] or "", "notice": reply["notice"] or "",
                "vote": vote.get("text", ""), "vote_cast_blind": vote.get("cast_blind", ""),
                "won": "" if not vote else vote["choice"] == reply["column"],
            }
            if isinstance(reply["sampling"], dict):
                row.update(reply["sampling"])
            row.update({key: "" if value is None else value for key, value in (reply["stats"] or {}).items()})
            writer.writerow(row)
    return out.getvalue()


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
                lines.append(f"*{HIDDEN_STATS if comparison.hides_stats else reply.stats.summary()}*")
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
    return write_texts(directory, "comparison", {"md": to_markdown(comparison), "csv": to_csv(comparison),
                                                 "json": to_json(comparison)})
