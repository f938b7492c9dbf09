"""What every benchmark path shares: the workload, the per-request timeline, and the statistics.

A `Timeline` is what one client saw of one streamed reply: when it asked, and each later moment
new text arrived with how many tokens that text holds. All figures are computed from timelines the
same way whichever path produced them, so the paths differ only in what sits between the client
and the engine.

Definitions (all client-observed, milliseconds unless said):
  TTFT     first arrival of non-empty text minus the moment the request was sent.
  ITL      per token: an arrival after a gap g carrying k new tokens counts as k tokens of g/k each
           (token-weighted, so coalesced updates neither hide nor exaggerate the rate). The raw
           engine reports k exactly; the HTTP paths see text only, so k is the growth in token
           count of the text so far, re-tokenized with the model's tokenizer (at least 1).
  gap      the plain time between two arrivals carrying new text (what a reader sees as stutter).
  TPOT     per request (last arrival - first arrival) / (tokens - 1), mean over requests.
  tok/s    output tokens of all requests of the run / wall time from the first send to the last
           arrival (fixed output length: ignore_eos).
  queue    HTTP paths only: from sending to Gradio starting the handler (time in Gradio's queue).
  CPU/1k   user+system CPU seconds of the front-end process(es) during the run, per 1,000 output
           tokens (engine child processes excluded).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

SYSTEM_PROMPT = "You are a helpful, friendly assistant. Answer briefly."
TOPICS = (
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how a refrigerator keeps food cold, step by step.",
    "Describe a walk through a busy market in a city you like.",
    "Give advice to someone starting to learn the piano as an adult.",
    "Tell me about the history of bicycles and how they changed cities.",
    "Plan a three-day trip to the mountains for a family with two children.",
    "Explain why the sky is blue to a curious ten-year-old.",
    "Write a letter from a cat to its owner about breakfast.",
)
# Sampling shared by all paths (the app's /chat knobs, SamplingParams, the OpenAI request).
TEMPERATURE, TOP_P, TOP_K, REPETITION_PENALTY = 0.7, 0.9, 0, 1.1


FILLER = (
    "Note {j} for request {i}: the reader prefers plain words, short paragraphs and concrete examples, "
    "and would like the answer to stay on the topic above."
)


def user_message(index: int, context_lines: int = 0) -> str:
    """A distinct message per request (its number comes first, so no prefix beyond the system
    prompt is shared and no reply is served from the prefix cache), optionally made longer with
    `context_lines` filler lines of about 30 tokens each."""
    lines = [f"Request {index}. {TOPICS[index % len(TOPICS)]}"]
    lines += [FILLER.format(i=index, j=j) for j in range(context_lines)]
    return "\n".join(lines)


EARLIER_QUESTION = (
    "Conversation {i}, question {k}: {topic} Before you answer, please take into account what I said in "
    "message {k} of conversation {i}: I read on a phone, I like plain words, and I would like one concrete example."
)
EARLIER_ANSWER = (
    "Answer {k} in conversation {i}. Here is a plain explanation in a few short steps. First, the main idea: "
    "it works because each part does one small job and hands the result to the next part, so nothing has to be "
    "done twice. Second, an example from daily life: think of a kitchen where one person washes, one cuts and one "
    "cooks, and the meal is ready sooner than if one person did all three. Third, what to watch for: if one step "
    "is slow, everything after it waits, so look for the slowest step first. Last, a way to check it yourself: "
    "try it once slowly and once quickly and compare. That is the short version for message {k} of conversation "
    "{i}; ask again if a step is unclear."
)


def earlier_turns(index: int, turns: int) -> list[dict[str, str]]:
    """The `turns` - 1 turns a conversation holds before its new message (user, assistant, ...): about
    60-token questions and 150-token answers of filler, the conversation's number first in each, so
    that no two conversations share a prefix beyond the system prompt (none is served from the prefix cache)."""
    out = []
    for k in range(1, turns):
        out += [{"role": "user", "content": EARLIER_QUESTION.format(i=index, k=k, topic=TOPICS[(index + k) % len(TOPICS)])},
                {"role": "assistant", "content": EARLIER_ANSWER.format(i=index, k=k)}]
    return out


def chat_messages(index: int, context_lines: int = 0, turns: int = 1) -> list[dict[str, str]]:
    """Request `index`'s conversation as the model reads it: the system prompt, its earlier turns, its message."""
    return [{"role": "system", "content": SYSTEM_PROMPT}, *earlier_turns(index, turns),
            {"role": "user", "content": user_message(index, context_lines)}]


@dataclass
class Timeline:
    started: float  # seconds, the client's monotonic clock, when the request was sent
    arrivals: list[tuple[float, int]] = field(default_factory=list)  # (when, new tokens), text-carrying only
    tokens: int = 0  # output tokens of the reply (exact where known)
    error: str | None = None
    handler_started: float | None = None  # HTTP paths: when Gradio began running the handler

    @property
    def ended(self) -> float:
        return self.arrivals[-1][0] if self.arrivals else self.started


def tokens_per_update(lengths: Sequence[int], text: str, count: Callable[[str], int]) -> list[int]:
    """New tokens in each update, from the reply's length (in characters) at each update."""
    out, before = [], 0
    for length in lengths:
        now = count(text[:length])
        out.append(max(1, now - before))
        before = max(before, now)
    return out


def pct(values: Sequence[float], p: float) -> float:
    """Linear-interpolated percentile; NaN when empty."""
    if not values:
        return math.nan
    xs = sorted(values)
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


@dataclass
class Summary:
    path: str
    concurrency: int
    requests: int
    errors: int
    output_tokens: int
    wall_s: float
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    gap_p50_ms: float
    gap_p99_ms: float
    tpot_ms: float
    tok_s: float
    cpu_s_per_1k: float | None
    updates_per_reply: float
    queue_p50_ms: float | None = None  # HTTP paths: sent -> Gradio starts the handler (its queue)
    queue_p99_ms: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def summarize(path: str, concurrency: int, timelines: Iterable[Timeline], cpu_s: float | None = None) -> Summary:
    timelines = list(timelines)
    ok = [t for t in timelines if t.error is None and t.arrivals]
    ttft = [t.arrivals[0][0] - t.started for t in ok]
    itl: list[float] = []
    gaps: list[float] = []
    tpot: list[float] = []
    for t in ok:
        for (before, _), (now, k) in zip(t.arrivals, t.arrivals[1:], strict=False):
            gaps.append(now - before)
            itl.extend([(now - before) / k] * k)
        if t.tokens > 1 and len(t.arrivals) > 1:
            tpot.append((t.arrivals[-1][0] - t.arrivals[0][0]) / (t.tokens - 1))
    queued = [t.handler_started - t.started for t in ok if t.handler_started is not None]
    tokens = sum(t.tokens for t in ok)
    wall = (max(t.ended for t in ok) - min(t.started for t in timelines)) if ok else math.nan
    return Summary(
        path=path,
        concurrency=concurrency,
        requests=len(timelines),
        errors=len(timelines) - len(ok),
        output_tokens=tokens,
        wall_s=wall,
        ttft_p50_ms=1e3 * pct(ttft, 50),
        ttft_p99_ms=1e3 * pct(ttft, 99),
        itl_p50_ms=1e3 * pct(itl, 50),
        itl_p99_ms=1e3 * pct(itl, 99),
        gap_p50_ms=1e3 * pct(gaps, 50),
        gap_p99_ms=1e3 * pct(gaps, 99),
        tpot_ms=1e3 * statistics.mean(tpot) if tpot else math.nan,
        tok_s=tokens / wall if ok and wall > 0 else math.nan,
        cpu_s_per_1k=None if cpu_s is None or not tokens else 1e3 * cpu_s / tokens,
        updates_per_reply=statistics.mean(len(t.arrivals) for t in ok) if ok else math.nan,
        queue_p50_ms=1e3 * pct(queued, 50) if queued else None,
        queue_p99_ms=1e3 * pct(queued, 99) if queued else None,
    )


def merge(summaries: Sequence[Summary], timelines: Sequence[Timeline], cpu_s: float | None) -> Summary:
    """One summary over several repeats of the same path and level (timelines pooled)."""
    first = summaries[0]
    pooled = summarize(first.path, first.concurrency, timelines, cpu_s)
    # Throughput is averaged over repeats: pooling walls would count the gaps between them.
    rates = [s.tok_s for s in summaries if not math.isnan(s.tok_s)]
    pooled.tok_s = statistics.mean(rates) if rates else math.nan
    pooled.wall_s = sum(s.wall_s for s in summaries)
    return pooled


COLUMNS = (
    ("ttft_p50_ms", "TTFT p50", "{:.0f}"),
    ("ttft_p99_ms", "TTFT p99", "{:.0f}"),
    ("itl_p50_ms", "ITL p50", "{:.1f}"),
    ("itl_p99_ms", "ITL p99", "{:.1f}"),
    ("tok_s", "tok/s", "{:.1f}"),
    ("cpu_s_per_1k", "CPU s/1k", "{:.2f}"),
)


def fmt(value: float | None, spec: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return spec.format(value)


def table(summaries: Sequence[Summary]) -> str:
    head = f"{'path':<10} {'conc':>4} {'reqs':>4} {'err':>3} " + " ".join(f"{label:>9}" for _, label, _ in COLUMNS)
    lines = [head, "-" * len(head)]
    for s in sorted(summaries, key=lambda s: (s.concurrency, s.path)):
        cells = " ".join(f"{fmt(getattr(s, key), spec):>9}" for key, _, spec in COLUMNS)
        lines.append(f"{s.path:<10} {s.concurrency:>4} {s.requests:>4} {s.errors:>3} {cells}")
    return "\n".join(lines)


def ratio_table(summaries: Sequence[Summary], base: str) -> str:
    """Each path against `base` at the same concurrency: ratios, and TTFT as a difference in ms."""
    by = {(s.path, s.concurrency): s for s in summaries}
    head = (f"{'path':<10} {'conc':>4} {'TTFT p50 +ms':>12} {'TTFT p99 +ms':>12} {'ITL p50 x':>9} "
            f"{'ITL p99 x':>9} {'tok/s x':>8} {'CPU/1k x':>8}")
    lines = [f"against {base} (x: ratio to {base}; +ms: difference)", head, "-" * len(head)]
    for s in sorted(summaries, key=lambda s: (s.concurrency, s.path)):
        b = by.get((base, s.concurrency))
        if b is None or s.path == base:
            continue

        def r(key: str, s: Summary = s, b: Summary = b) -> str:
            x, y = getattr(s, key), getattr(b, key)
            return "-" if x is None or y is None or not y or math.isnan(x) or math.isnan(y) else f"{x / y:.2f}"

        lines.append(
            f"{s.path:<10} {s.concurrency:>4} {s.ttft_p50_ms - b.ttft_p50_ms:>+12.0f} {s.ttft_p99_ms - b.ttft_p99_ms:>+12.0f} "
            f"{r('itl_p50_ms'):>9} {r('itl_p99_ms'):>9} {r('tok_s'):>8} {r('cpu_s_per_1k'):>8}"
        )
    return "\n".join(lines)


def chart(summaries: Sequence[Summary], path: str, title: str) -> bool:
    """A PNG with one panel per figure against concurrency; False when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [("ttft_p50_ms", "TTFT p50 (ms)"), ("ttft_p99_ms", "TTFT p99 (ms)"), ("itl_p50_ms", "ITL p50 (ms/token)"),
              ("itl_p99_ms", "ITL p99 (ms/token)"), ("tok_s", "output tokens/s (total)"),
              ("cpu_s_per_1k", "front-end CPU s / 1k tokens")]
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    paths = sorted({s.path for s in summaries})
    for ax, (key, label) in zip(axes.flat, panels, strict=True):
        for p in paths:
            pts = sorted((s.concurrency, getattr(s, key)) for s in summaries if s.path == p and getattr(s, key) is not None)
            if pts:
                ax.plot([c for c, _ in pts], [v for _, v in pts], marker="o", label=p)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent streams")
        ax.set_title(label)
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
