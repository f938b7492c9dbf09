"""The last minutes of engine load, sampled every few seconds for the Monitor view.

One sampler per process (started with the server) reads each loaded engine's view from the
registry: its scheduler's load and the recent first-token times, for the whole app. `Monitor.charts()` shapes them into what a person reads (axis
titles in words, values rounded, a time axis that spans the whole window, and a break in a line
wherever it has no data, instead of a straight line across idle minutes); the UI only draws it.

Presets that share an engine (they differ only in sampling, as Compare's two SmolLM2 presets do)
have one engine view, named after the preset that started it: the load is that engine's, but each
preset's first-token times get a line of their own, so a preset used only in Compare shows too.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import Counter, deque
from collections.abc import Iterable
from dataclasses import dataclass

from chat import metrics
from chat.engine import EngineState
from chat.registry import FIRST_TOKENS_WINDOW_S, EngineRegistry, first_token_percentiles


@dataclass(frozen=True)
class Sample:
    at: float  # wall clock, for the charts' time axis
    preset: str
    tokens_per_s: float | None  # the load is None for a preset sharing another's engine (its view has it)
    running: int | None
    waiting: int | None
    kv_cache_percent: float | None
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None


@dataclass(frozen=True)
class Chart:
    """One chart of the Monitor view: which sample field it draws and how a person reads it."""

    field: str  # the Sample attribute drawn
    title: str
    y_title: str  # what the axis counts, with its unit
    digits: int  # decimals shown: whole milliseconds, tokens per second to one decimal
    floor: float  # the axis reaches at least this high, so a small value looks small
    top: float | None = None  # a fixed top (a percentage: 100)
    counts: bool = False  # whole numbers only on the axis
    empty: str = "Nothing to draw in this window."

    def rounded(self, value: float) -> float | int:
        return round(value) if self.digits == 0 else round(value, self.digits)

    def y_top(self, values: Iterable[float]) -> float:
        """The top of the axis: fixed, or a round number above the highest value."""
        if self.top is not None:
            return self.top
        return _round_up(max([self.floor, *values]))


TTFT_EMPTY = "No reply started in the last minute."
CHARTS: tuple[Chart, ...] = (
    Chart("tokens_per_s", "Tokens written per second", "Tokens per second", 1, 10),
    Chart("running", "Replies being written", "Replies", 0, 5, counts=True),
    Chart("waiting", "Replies waiting for a free slot", "Replies", 0, 5, counts=True),
    Chart("kv_cache_percent", "Memory for replies in use (KV cache)", "Percent used", 1, 100, top=100),
    Chart("ttft_p50_ms", "Time to first token, median of the last minute", "Milliseconds", 0, 100, empty=TTFT_EMPTY),
    Chart("ttft_p95_ms", "Time to first token, slowest 5% of the last minute", "Milliseconds", 0, 100, empty=TTFT_EMPTY),
)


@dataclass(frozen=True)
class ChartData:
    """What one chart draws: (time, preset, value) points and the limits of both axes."""

    chart: Chart
    points: list[tuple[float, str, float | int | None]]  # wall-clock seconds, preset name, rounded value; None breaks the line
    x_lim: tuple[float, float]  # wall-clock seconds
    y_lim: tuple[float, float]

    @property
    def note(self) -> str | None:
        """A sentence under the chart when its lines cannot show yet (a line needs two points)."""
        per_preset = Counter(preset for _, preset, value in self.points if value is not None)
        if not per_preset:
            return self.chart.empty
        if max(per_preset.values()) < 2:
            return "One sample so far: the line appears with the next one, in a few seconds."
        return None


def _round_up(value: float) -> float:
    """The next 1, 2, 2.5 or 5 times a power of ten at or above `value` (for an axis top)."""
    if value <= 0:
        return 1.0
    scale = 10 ** math.floor(math.log10(value))
    return float(next(step * scale for step in (1, 2, 2.5, 5, 10) if step * scale >= value - 1e-9))


def time_axis(now: float, window_s: float) -> tuple[float, float]:
    """From the whole minute `window_s` before the current minute to the end of the current one.

    A fixed span keeps the axis readable with one point or none, and moving it once a minute
    (not on every refresh) lets the browser keep the chart instead of redrawing it.
    """
    end = (math.floor(now / 60) + 1) * 60
    return end - 60 * math.ceil(window_s / 60) - 60, end


GAP_S = 6.0  # samples of a preset further apart than this (three sampling intervals) leave a gap between them


def chart_data(samples: Iterable[Sample], chart: Chart, now: float, window_s: float, gap_s: float = GAP_S) -> ChartData:
    """The chart's points, each preset's in time order. Where a preset has no value (no reply started
    in the last minute) or no sample (its engine was asleep or gone), a None point breaks its line:
    the chart draws nothing there rather than a straight line from the last value to the next."""
    series: dict[str, list[tuple[float, float | int | None]]] = {}
    for s in sorted(samples, key=lambda s: s.at):
        if s.at >= now - window_s:
            value = getattr(s, chart.field)
            series.setdefault(s.preset, []).append((s.at, None if value is None else chart.rounded(value)))
    points: list[tuple[float, str, float | int | None]] = []
    for preset, values in series.items():
        if all(value is None for _, value in values):
            continue  # nothing of this preset on this chart (a shared engine's load is on its own line)
        for i, (at, value) in enumerate(values):
            if i and at - values[i - 1][0] > gap_s:
                points.append(((values[i - 1][0] + at) / 2, preset, None))
            points.append((at, preset, value))
    drawn = (value for _, _, value in points if value is not None)
    return ChartData(chart, points, time_axis(now, window_s), (0.0, chart.y_top(drawn)))


def is_quiet(samples: Iterable[Sample]) -> bool:
    """True when no reply was written or waiting in these samples: nothing worth a chart."""
    return not any(s.running or s.waiting or (s.tokens_per_s or 0) > 0 or s.ttft_p50_ms is not None for s in samples)


def window_words(window_s: float) -> str:
    minutes = window_s / 60
    if minutes >= 1 and minutes == int(minutes):
        return "minute" if minutes == 1 else f"{int(minutes)} minutes"
    return f"{window_s:g} seconds"


class Monitor:
    def __init__(self, registry: EngineRegistry, every_s: float = 2.0, window_s: float = 300.0) -> None:
        self.registry = registry
        self.every_s = every_s
        self.window_s = window_s
        self.samples: deque[Sample] = deque(maxlen=int(window_s / every_s) * 8)
        self._last_tokens: dict[str, tuple[float, int]] = {}  # engine key -> (time, generated)

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.every_s)

    def sample(self) -> None:
        now, wall = time.monotonic(), time.time()
        views = [view for view in self.registry.overview(first_tokens=True) if view.state == EngineState.READY.value]
        for view in views:
            before = self._last_tokens.get(view.key)
            self._last_tokens[view.key] = (now, view.generated_tokens)
            rate = 0.0 if before is None else max(view.generated_tokens - before[1], 0) / max(now - before[0], 1e-6)
            self.samples.append(
                Sample(
                    at=wall,
                    preset=view.preset,
                    tokens_per_s=rate,
                    running=view.running,
                    waiting=view.waiting,
                    kv_cache_percent=100 * view.kv_cache_usage,
                    ttft_p50_ms=_ms(view.ttft_p50_s),
                    ttft_p95_ms=_ms(view.ttft_p95_s),
                )
            )
        # A preset sharing an engine with the one that started it has no view: the engine's view
        # carries only that preset's first tokens. These come from this process's replies (every
        # reply, with one UI worker; with several, each worker's own).
        named = {view.preset for view in views}
        recent = list(metrics.RECENT_FIRST_TOKENS)
        for preset in sorted({name for at, name, _ in recent if now - at <= FIRST_TOKENS_WINDOW_S} - named):
            p50, p95 = first_token_percentiles(recent, preset, now)
            self.samples.append(Sample(wall, preset, None, None, None, None, _ms(p50), _ms(p95)))

    def recent(self) -> list[Sample]:
        cutoff = time.time() - self.window_s
        return [s for s in self.samples if s.at >= cutoff]

    @property
    def quiet_message(self) -> str:
        return f"No replies in the last {window_words(self.window_s)}: send a message on the Chat tab to see the load here."

    def charts(self, now: float | None = None) -> list[ChartData] | None:
        """Every chart of the window ending `now`, or None when there was no reply to draw."""
        now = time.time() if now is None else now
        samples = [s for s in self.samples if now - self.window_s <= s.at <= now]
        if is_quiet(samples):
            return None
        return [chart_data(samples, chart, now, self.window_s) for chart in CHARTS]


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else 1000 * seconds
