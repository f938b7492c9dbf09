"""The votes as files to download: one CSV row per column of each vote, and the whole records as JSON."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from chat.compare import ALL_BAD, TIE
from chat.exports import spreadsheet_safe, write_texts
from chat.sampling import KNOB_NAMES
from chat.votes import SCHEMA_VERSION, ColumnVote, VoteRecord

STATS_FIELDS = (
    "first_token_s", "tokens_per_s", "generated_tokens", "prompt_tokens", "cached_prompt_tokens", "total_s",
    "queue_s", "prefill_s", "decode_s", "engine_wait_s", "finish", "context_limit",
)
CSV_FIELDS = (
    "vote", "cast_at", "session", "voter", "comparison", "turn", "blind", "prompt", "choice", "column", "preset", "outcome",
    "model", "engine", "system_prompt", *KNOB_NAMES, *STATS_FIELDS, "attempts", "error", "text",
)


def outcome(record: VoteRecord, column: ColumnVote) -> str:
    """What the vote said about this column: won, lost, tie or all bad."""
    if record.choice == TIE:
        return "tie"
    if record.choice == ALL_BAD:
        return "all bad"
    return "won" if column.label == record.choice else "lost"


def votes_csv(records: Sequence[VoteRecord]) -> str:
    """One row per column of each vote, the vote's own fields repeated on each of its rows."""
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
    writer.writeheader()
    for record in records:
        for column in record.columns:
            row: dict[str, object] = {
                "vote": record.id, "cast_at": record.cast_at, "session": record.session, "voter": record.voter,
                "comparison": record.comparison, "turn": record.turn, "blind": record.blind, "prompt": record.prompt,
                "choice": record.choice, "column": column.label, "preset": column.preset,
                "outcome": outcome(record, column), "model": column.model,
                "engine": json.dumps(column.engine, sort_keys=True, default=str), "system_prompt": column.system_prompt,
                "attempts": column.attempts, "error": column.error or "", "text": column.text,
                **column.sampling,
            }
            row.update({key: "" if value is None else value for key, value in (column.stats or {}).items()
                        if key in STATS_FIELDS})
            writer.writerow({key: spreadsheet_safe(value) for key, value in row.items()})
    return out.getvalue()


def votes_json(records: Sequence[VoteRecord]) -> str:
    data = {"kind": "vllm-chat-demo votes", "version": SCHEMA_VERSION,
            "exported": datetime.now(UTC).isoformat(timespec="seconds"),
            "votes": [record.as_dict() for record in records]}
    return json.dumps(data, indent=2, ensure_ascii=False, default=str)


def write_exports(records: Sequence[VoteRecord], directory: Path) -> dict[str, Path]:
    """Write votes.csv and votes.json into `directory` (a server temp dir); return them by format."""
    return write_texts(directory, "votes", {"csv": votes_csv(records), "json": votes_json(records)})
