"""How a comparison looks: each column's conversation as chat messages (the Compare tab draws them,
the /compare API answers with them), and the session summary's table and chart data."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import gradio as gr
import pandas as pd

from chat.compare import HIDDEN_STATS, ComparedReply, Comparison
from chat.compare_report import summarize
from chat.compare_service import Job
from chat.service import Waiting, Writing
from chat.ui.messages import PROBLEM, STATS, STOPPED, WAITING, annotation, event_messages, shown_text, stats_annotation

HIDDEN_DETAILS = "The preset and its exact settings are shown after you vote."


def column_messages(comparison: Comparison, column: int, jobs: Sequence[Job] = (),
                    live_ids: Mapping[int, str] | None = None) -> list[gr.ChatMessage]:
    """The column's conversation: each prompt, its reply with stats beneath, and any reruns; a
    reply being written (its job in `jobs`) with its live text where `live_ids` has its log (by job)."""
    live = {id(job.entry): job for job in jobs}
    messages = []
    for turn in comparison.turns:
        messages.append(gr.ChatMessage(role="user", content=turn.prompt))
        for entry in turn.attempts(column):
            if entry.attempt > 1:
                messages.append(annotation(f"↻ Rerun {entry.attempt - 1} of this prompt, same preset and settings"))
            job = live.get(id(entry))
            messages += entry_messages(comparison, entry, job, (live_ids or {}).get(id(job)))
    return messages


def entry_messages(comparison: Comparison, entry: ComparedReply, job: Job | None,
                   live_id: str | None = None) -> list[gr.ChatMessage]:
    """One reply of a column. Blind, until the vote, every column's lines read the same: no engine
    status (it names the preset), no tokens, no times (they tell the columns apart)."""
    blind = comparison.hides_stats
    if not entry.finished:
        if job is None or job.event is None or (blind and isinstance(job.event, Waiting)):
            return [annotation(f"{WAITING} Waiting for the engine…", pending=True)]
        messages = event_messages(job.event, live_id)
        if blind and isinstance(job.event, Writing):
            messages[-1] = annotation(f"{WAITING} Writing…", pending=True)
        return messages
    messages = [gr.ChatMessage(role="assistant", content=shown_text(entry.text))] if entry.text else []
    if entry.error:
        messages.append(annotation(f"{STOPPED if entry.stopped_early else PROBLEM} {entry.error}"))
    elif entry.stats is not None and not blind:
        messages.append(stats_annotation(entry.stats, entry.notice))
    elif entry.stats is not None:
        messages.append(annotation(f"{STATS} {HIDDEN_STATS}", HIDDEN_DETAILS))
    return messages


def summary_frames(comparison: Comparison | None) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """The summary table, then the time-to-first-token and speed charts' data."""
    rows = summarize(comparison) if comparison else []

    def ms(seconds: float | None) -> float | None:
        return None if seconds is None else round(seconds * 1000)

    def one(value: float | None) -> float | None:
        return None if value is None else round(value, 1)

    table = pd.DataFrame(
        [[r.label, r.preset, r.replies, ms(r.first_token_median_s), ms(r.first_token_p95_s), one(r.tokens_per_s_median),
          one(r.length_median_tokens), r.votes_won] for r in rows],
        columns=["Column", "Preset", "Replies", "Median first token (ms)", "95th percentile first token (ms)",
                 "Median tokens/s", "Median length (tokens)", "Votes won"],
    )
    first_token = pd.DataFrame(
        [{"bar": f"{r.label} {name}", "ms": ms(value)}
         for r in rows for name, value in (("median", r.first_token_median_s), ("p95", r.first_token_p95_s)) if value is not None],
        columns=["bar", "ms"],
    ).astype({"ms": float})  # typed even when empty: the chart reads its axis type from the first value
    speed = pd.DataFrame([{"column": r.label, "tokens/s": one(r.tokens_per_s_median)} for r in rows if r.tokens_per_s_median],
                         columns=["column", "tokens/s"]).astype({"tokens/s": float})
    return table, first_token, speed
