"""What each reply measured, and how it is said beneath the reply.

Times come from two clocks: the app's monotonic clock around the stream (what the person waited)
and the engine's own timestamps (queue wait and prompt processing inside vLLM), which are only
compared with each other.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from chat.sampling import KNOBS, Sampling

READING = "Reading your message…"  # the line beneath a reply before its first token
REPLIED = "replied after"
"""How the stats line begins once a reply has its first token; tests and benches wait for it."""
SUMMARY = re.compile(
    r"(?:the model took (?P<load>[\d.,]+) s to load · )?"
    rf"{REPLIED} (?P<first>[\d.,]+) s(?: \((?P<queue>[\d.,]+) s waiting in line\))?"
    r" · (?P<tokens>[\d,]+) tokens?(?: at (?P<rate>[\d.,]+) a second)? · (?P<total>[\d.,]+) s in all · (?P<finish>.+)$")
"""The stats line's numbers, for tests and benches that read them (seconds, tokens, tokens a second)."""


class Finish(enum.Enum):
    """Why a reply ended; the value is how the stats line says it."""

    FINISHED = "finished"
    MAX_TOKENS = "reached the Max tokens limit"
    CONTEXT_FULL = "filled the model's context window"
    STOP_SEQUENCE = "hit a stop sequence"
    REPETITION = "stopped because it kept repeating itself"
    STOPPED_BY_USER = "stopped by you"
    DISCONNECTED = "stopped: the browser disconnected"
    UNLOADED = "stopped: the model was unloaded"
    TIMED_OUT = "timed out"
    ENGINE_FAILED = "failed: the engine stopped working"
    ERROR = "failed"


@dataclass(frozen=True)
class ReplyStats:
    """The numbers beneath one reply; also what the API, exports and metrics report."""

    preset: str
    sampling: Sampling
    prompt_tokens: int
    cached_prompt_tokens: int
    generated_tokens: int
    first_token_s: float | None  # from submitting to the first token, as the app saw it
    total_s: float
    queue_s: float | None  # waiting inside the engine for a free slot
    prefill_s: float | None  # the engine reading the prompt
    decode_s: float | None  # first token to last token, engine clock
    finish: Finish
    context_limit: int
    engine_wait_s: float = 0.0  # waiting for the engine to start or wake, before the request

    @property
    def tokens_per_s(self) -> float | None:
        """Generation speed after the first token (the first one is prompt processing)."""
        if self.generated_tokens < 2:
            return None
        span = self.decode_s
        if span is None and self.first_token_s is not None:
            span = self.total_s - self.first_token_s
        return (self.generated_tokens - 1) / span if span else None

    def summary(self) -> str:
        """The one line shown beneath the reply, visible without clicking, in words anyone reads
        (the technical names are in `details`)."""
        parts = []
        if self.engine_wait_s >= 1:
            parts.append(f"the model took {_seconds(self.engine_wait_s)} to load")
        if self.first_token_s is not None:
            replied = f"{REPLIED} {_seconds(self.first_token_s)}"
            if self.queue_s is not None and self.queue_s >= 0.05:
                replied += f" ({_seconds(self.queue_s)} waiting in line)"
            parts.append(replied)
        written = _count(self.generated_tokens, "token")
        if self.tokens_per_s is not None:
            written += f" at {_rate(self.tokens_per_s)} a second"
        parts.append(written)
        parts.append(f"{_seconds(self.total_s)} in all")
        parts.append(self.finish.value)
        return " · ".join(parts)

    def details(self) -> str:
        """Everything behind the line, each with what it means: the timing split, the prompt,
        and the exact settings that made this reply (a Markdown table with a header row)."""
        rows = [
            ("Preset", self.preset, "The model and settings that wrote this reply."),
            ("Model loading", _seconds(self.engine_wait_s) if self.engine_wait_s >= 0.05 else "-",
             "Waiting for the model to load before this message could be sent to it."),
            ("Replied after", _seconds(self.first_token_s),
             "From sending to the first word appearing (engineers call it time to first token)."),
            ("Waiting in line", _seconds(self.queue_s),
             "Part of the above: waiting for a free slot in the engine (the queue); long when the demo is busy."),
            ("Reading the prompt", _seconds(self.prefill_s),
             "Part of the above: the model reading the conversation (prefill); long when it is long."),
            ("Writing", _seconds(self.decode_s), "From the first token to the last (decode)."),
            ("In all", _seconds(self.total_s), "From sending to the end of the reply."),
            ("Speed", f"{_rate(self.tokens_per_s)} tokens a second" if self.tokens_per_s else "-",
             "Tokens written per second after the first one (tokens/s)."),
            ("Tokens", f"{self.generated_tokens:,}",
             "How much the model wrote, in tokens: the pieces a model reads and writes, "
             "a word or part of one; a token is about three quarters of an English word."),
            ("Prompt tokens", f"{self.prompt_tokens:,} ({self.cached_prompt_tokens:,} from the prefix cache)",
             "The conversation as the model read it; cached tokens were already read before."),
            ("Context used", f"{self.prompt_tokens + self.generated_tokens:,} of {self.context_limit:,} tokens",
             "How much of what the model can hold at once (its context window) this conversation fills."),
            ("Why it stopped", self.finish.value, "What ended the reply."),
        ]
        rows += [(knob.label, knob.format(getattr(self.sampling, knob.name)), knob.help) for knob in KNOBS]
        header = "| Figure | Value | What it means |\n|---|---|---|\n"
        return header + "\n".join(f"| {name} | {value} | {meaning} |" for name, value, meaning in rows)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ReplyStats:
        """The inverse of as_dict (derived fields like tokens_per_s are recomputed)."""
        names = {f.name for f in fields(cls)}
        values: dict[str, Any] = {name: data[name] for name in names if name in data}
        values["sampling"] = Sampling(**data["sampling"])
        values["finish"] = Finish[str(data["finish"]).upper()]
        return cls(**values)

    def as_dict(self) -> dict[str, object]:
        return {
            "preset": self.preset,
            "sampling": self.sampling.as_dict(),
            "prompt_tokens": self.prompt_tokens,
            "cached_prompt_tokens": self.cached_prompt_tokens,
            "generated_tokens": self.generated_tokens,
            "first_token_s": self.first_token_s,
            "tokens_per_s": self.tokens_per_s,
            "total_s": self.total_s,
            "queue_s": self.queue_s,
            "prefill_s": self.prefill_s,
            "decode_s": self.decode_s,
            "finish": self.finish.name.lower(),
            "finish_text": self.finish.value,
            "context_limit": self.context_limit,
            "engine_wait_s": self.engine_wait_s,
        }


@dataclass
class ReplyProgress:
    """What is known while a reply is still being written."""

    max_tokens: int
    started: float  # monotonic
    tokens: int = 0
    first_token_at: float | None = None
    waiting_for: str | None = field(default=None)  # e.g. "the engine to start"

    def line(self, now: float) -> str:
        elapsed = _seconds(now - self.started)
        if self.waiting_for:
            return f"Waiting for {self.waiting_for}… {elapsed}"
        if self.first_token_at is None:
            return f"{READING} {elapsed}"
        percent = 100 * self.tokens / self.max_tokens
        return f"Writing… {elapsed} · {_count(self.tokens, 'token')} · {percent:.0f}% of Max tokens"


def _seconds(value: float | None) -> str:
    """Seconds as people say them: 0.29 s, 2.1 s (never milliseconds)."""
    if value is None:
        return "-"
    if value < 0.01:
        return f"{value:.3f} s"
    if value < 1:
        return f"{value:.2f} s"
    return f"{value:,.1f} s"


def _rate(per_s: float | None) -> str:
    """A speed with as many digits as it deserves: 8.7, 65, 1,200."""
    if per_s is None:
        return "-"
    return f"{per_s:.1f}" if per_s < 10 else f"{per_s:,.0f}"


def _count(n: int, noun: str) -> str:
    """"1 token", "2 tokens", "1,024 tokens"."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile, interpolating between the closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)
