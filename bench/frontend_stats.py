"""The front-end benchmark's figures for one run, and its markdown table.

Definitions (client-observed unless said; the app, the client and the token source share the
machine's monotonic clock):
  offered      tokens/s the token source offers: one token per stream per engine step
               (streams / step), what a GPU engine decoding that batch would stream.
  delivered    output tokens of the completed replies / (last update - first send).
  x offered    delivered / offered: 1.0 means the front end kept pace with the engine (a burst:
               time to first token counts against it too).
  pace         per reply, the engine's time for the tokens after the first ((tokens - 1) steps) /
               the reader's time from the first text to the last update, averaged: below 1.0 the
               reader gets text slower than the engine writes it (queueing before the first token
               does not count here).
  TTFT         first update carrying reply text - sending (browser: pressing Enter).
  source TTFT  at the token source: its first token - the request reaching it (one engine step
               when the front end keeps up; admission, not the front end, beyond max_num_seqs).
  loop lag     per reply, the mean delay between an engine step ending and the app's event loop
               taking its output (what vLLM's output socket would hold meanwhile).
  updates      messages of the reply's stream received per reply (each one a redraw the app did).
  empty        of those, updates that added no reply text (a redraw that showed nothing new).
  tok/update   tokens per reply / updates: coalescing; 1 means a redraw per token.
  queue        Gradio's queue: the reply's event joined -> Gradio started it.
  app CPU      user+system CPU seconds of the app's process during the run, per redraw (all
               updates), per turn, and per 1,000 tokens; "cores" is CPU seconds / wall seconds (the
               app is pinned to one core, so near 1.0 its event loop is saturated).
  tok/s per app core  tokens / app CPU seconds: what one core fully given to the app would carry
               at this run's cost per token (robust to other load; the cost itself grows with load).
  client cores the benchmark's own CPU seconds / wall seconds (it must stay well below its cores).
  others' cores  CPU used meanwhile by processes that are not this benchmark's (a shared machine);
               rows marked * stayed above --max-others in every attempt.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from bench.common import pct
from bench.frontend_client import Turn


@dataclass
class RunFigures:
    app: str
    door: str  # browser, api or ws
    history: int  # earlier turns in every conversation
    streams: int
    replies: int
    errors: int
    offered_tok_s: float
    source_tok_s: float  # what the source actually emitted over its own busy window
    delivered_tok_s: float
    x_offered: float
    pace: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    source_ttft_p50_ms: float
    source_ttft_p99_ms: float
    loop_lag_p50_ms: float
    loop_lag_p99_ms: float
    updates_per_reply: float
    empty_updates_per_reply: float
    tokens_per_update: float
    queue_p50_ms: float | None
    queue_p99_ms: float | None
    requests_per_turn: float
    app_cpu_s: float
    app_cores: float
    cpu_ms_per_update: float
    cpu_ms_per_turn: float
    cpu_s_per_1k_tokens: float
    client_cores: float
    others_cores: float  # CPU used meanwhile by processes that are not this benchmark's
    wall_s: float
    tok_s_per_app_core: float = math.nan  # tokens / app CPU seconds: the ceiling one saturated core would reach
    first_error: str | None = None
    noisy: bool = False  # other processes used more than --max-others cores in every attempt

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def figures(app: str, door: str, history: int, streams: int, max_tokens: int, step_s: float,
            turns: Sequence[Turn], source: Sequence[dict[str, Any]], app_cpu_s: float, client_cpu_s: float,
            busy_s: float, wall_s: float) -> RunFigures:
    ok = [t for t in turns if t.error is None and t.updates]
    with_text = [t for t in ok if any(length for _, length in t.updates)]
    first_text = [next(w for w, length in t.updates if length) for t in with_text]
    ttft = [first - t.started for t, first in zip(with_text, first_text, strict=True)]
    paces = [(max_tokens - 1) * step_s / max(t.updates[-1][0] - first, 1e-9)
             for t, first in zip(with_text, first_text, strict=True)]
    tokens = max_tokens * len(ok)
    window = (max(t.updates[-1][0] for t in ok) - min(t.started for t in turns)) if ok else math.nan
    delivered = tokens / window if ok and window > 0 else math.nan
    emitted = [r for r in source if r["first_token"] is not None]
    source_ttft = [r["first_token"] - r["added"] for r in emitted]
    lags = [r["lag_sum"] / r["tokens"] for r in emitted if r["tokens"]]
    source_window = (max(r["last_token"] for r in emitted) - min(r["added"] for r in emitted)) if emitted else math.nan
    grew = [sum(1 for (_, a), (_, b) in zip([(0, 0), *t.updates], t.updates, strict=False) if b > a) for t in ok]
    updates = sum(len(t.updates) for t in turns)
    queued = [t.process_started - t.joined for t in ok if t.process_started is not None and t.joined is not None]
    offered = streams / step_s
    return RunFigures(
        app=app, door=door, history=history, streams=streams, replies=len(turns), errors=len(turns) - len(ok),
        offered_tok_s=offered,
        source_tok_s=sum(r["tokens"] for r in emitted) / source_window if emitted and source_window > 0 else math.nan,
        delivered_tok_s=delivered, x_offered=delivered / offered,
        pace=statistics.mean(paces) if paces else math.nan,
        ttft_p50_ms=1e3 * pct(ttft, 50), ttft_p99_ms=1e3 * pct(ttft, 99),
        source_ttft_p50_ms=1e3 * pct(source_ttft, 50), source_ttft_p99_ms=1e3 * pct(source_ttft, 99),
        loop_lag_p50_ms=1e3 * pct(lags, 50), loop_lag_p99_ms=1e3 * pct(lags, 99),
        updates_per_reply=statistics.mean(len(t.updates) for t in ok) if ok else math.nan,
        empty_updates_per_reply=statistics.mean(len(t.updates) - g for t, g in zip(ok, grew, strict=True)) if ok else math.nan,
        tokens_per_update=max_tokens / statistics.mean(len(t.updates) for t in ok) if ok else math.nan,
        queue_p50_ms=1e3 * pct(queued, 50) if queued else None, queue_p99_ms=1e3 * pct(queued, 99) if queued else None,
        requests_per_turn=statistics.mean(t.requests for t in turns) if turns else math.nan,
        app_cpu_s=app_cpu_s, app_cores=app_cpu_s / wall_s,
        cpu_ms_per_update=1e3 * app_cpu_s / updates if updates else math.nan,
        cpu_ms_per_turn=1e3 * app_cpu_s / len(turns) if turns else math.nan,
        cpu_s_per_1k_tokens=1e3 * app_cpu_s / tokens if tokens else math.nan,
        client_cores=client_cpu_s / wall_s, others_cores=max(busy_s - app_cpu_s - client_cpu_s, 0.0) / wall_s,
        wall_s=wall_s, tok_s_per_app_core=tokens / app_cpu_s if app_cpu_s else math.nan, first_error=next((t.error for t in turns if t.error), None),
    )


COLUMNS = (  # (field or pair of fields, header, format)
    ("app", "app", "{}"), ("door", "door", "{}"), ("history", "earlier turns", "{}"), ("streams", "streams", "{}"),
    ("offered_tok_s", "offered tok/s", "{:,.0f}"), ("delivered_tok_s", "delivered tok/s", "{:,.0f}"),
    ("x_offered", "x offered", "{:.2f}"), ("pace", "pace", "{:.2f}"),
    (("ttft_p50_ms", "ttft_p99_ms"), "TTFT p50 / p99 ms", "{:,.0f}"),
    (("source_ttft_p50_ms", "source_ttft_p99_ms"), "source TTFT p50 / p99 ms", "{:,.0f}"),
    (("queue_p50_ms", "queue_p99_ms"), "queue p50 / p99 ms", "{:,.0f}"),
    ("updates_per_reply", "updates / reply", "{:.0f}"), ("empty_updates_per_reply", "empty", "{:.0f}"), ("tokens_per_update", "tok / update", "{:.2f}"),
    ("app_cores", "app cores", "{:.2f}"), ("cpu_ms_per_update", "CPU ms / update", "{:.2f}"),
    ("cpu_ms_per_turn", "CPU ms / turn", "{:.0f}"), ("cpu_s_per_1k_tokens", "CPU s / 1k tok", "{:.2f}"),
    ("tok_s_per_app_core", "tok/s per app core", "{:,.0f}"),
    ("client_cores", "client cores", "{:.2f}"), ("others_cores", "others' cores", "{:.2f}"), ("errors", "errors", "{}"),
)


def cell(value: Any, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value)


def table(rows: Sequence[RunFigures]) -> str:
    lines = ["| " + " | ".join(header for _, header, _ in COLUMNS) + " |",
             "| " + " | ".join("---" if key in ("app", "door") else "---:" for key, _, _ in COLUMNS) + " |"]
    for row in rows:
        cells = []
        label = row.app + (" *" if row.noisy else "")
        for key, _, spec in COLUMNS:
            if isinstance(key, tuple):
                cells.append(" / ".join(cell(getattr(row, k), spec) for k in key))
            else:
                cells.append(label if key == "app" else cell(getattr(row, key), spec))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)
