"""The last minutes of engine load, sampled every few seconds for the Monitor view.

One sampler per process (started with the server) reads each loaded engine's scheduler view and
the app's recent first-token times; the UI only draws what it holds.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections import deque
from dataclasses import dataclass

from chat import metrics
from chat.engine import EngineState
from chat.registry import EngineRegistry


@dataclass(frozen=True)
class Sample:
    at: float  # wall clock, for the charts' time axis
    preset: str
    tokens_per_s: float
    running: int
    waiting: int
    kv_cache_percent: float
    ttft_p50_ms: float | None
    ttft_p95_ms: float | None


class Monitor:
    def __init__(self, registry: EngineRegistry, every_s: float = 2.0, window_s: float = 300.0) -> None:
        self.registry = registry
        self.every_s = every_s
        self.window_s = window_s
        self.samples: deque[Sample] = deque(maxlen=int(window_s / every_s) * 8)
        self._last_tokens: dict[int, tuple[float, int]] = {}  # engine id -> (time, generated)

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(self.every_s)

    def sample(self) -> None:
        now, wall = time.monotonic(), time.time()
        recent = [(preset, s) for t, preset, s in metrics.RECENT_FIRST_TOKENS if now - t <= 60]
        for engine in self.registry:
            if engine.state is not EngineState.READY:
                continue
            load = engine.load
            before = self._last_tokens.get(id(engine))
            self._last_tokens[id(engine)] = (now, load.generated_tokens)
            rate = 0.0 if before is None else (load.generated_tokens - before[1]) / max(now - before[0], 1e-6)
            ttfts = sorted(s for preset, s in recent if preset == engine.preset.name)
            self.samples.append(
                Sample(
                    at=wall,
                    preset=engine.preset.name,
                    tokens_per_s=rate,
                    running=load.running,
                    waiting=load.waiting,
                    kv_cache_percent=100 * load.kv_cache_usage,
                    ttft_p50_ms=1000 * statistics.median(ttfts) if ttfts else None,
                    ttft_p95_ms=1000 * ttfts[min(len(ttfts) - 1, int(0.95 * len(ttfts)))] if ttfts else None,
                )
            )

    def recent(self) -> list[Sample]:
        cutoff = time.time() - self.window_s
        return [s for s in self.samples if s.at >= cutoff]
