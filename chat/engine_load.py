"""An engine's load as its scheduler reports it after every step: running and waiting requests,
KV-cache use, prefix-cache hits and tokens written, copied from vLLM's stat-logger hook."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass
class EngineLoad:
    """The scheduler's view after its latest step (written by vLLM's stats hook)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0  # 0..1
    prefix_cache_hits: int = 0
    prefix_cache_queries: int = 0
    generated_tokens: int = 0  # since the engine started
    updated_at: float = 0.0  # wall clock of the latest scheduler step seen (several clients: the newest wins)
    on_change: Callable[[], object] = lambda: None  # a UI worker's: tell the engine owner (chat/owner_link.py)


def load_recorder(load: EngineLoad) -> Callable[..., Any]:
    """A vLLM per-engine stat-logger factory that copies scheduler stats into `load`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class LoadRecorder(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if iteration_stats is not None:
                load.generated_tokens += iteration_stats.num_generation_tokens
            if scheduler_stats is None:
                return
            load.updated_at = time.time()
            load.running = scheduler_stats.num_running_reqs
            load.waiting = scheduler_stats.num_waiting_reqs
            load.kv_cache_usage = scheduler_stats.kv_cache_usage
            prefix = scheduler_stats.prefix_cache_stats
            if prefix is not None:
                load.prefix_cache_hits += prefix.hits
                load.prefix_cache_queries += prefix.queries
            load.on_change()

        def log_engine_initialized(self) -> None:
            pass

    return LoadRecorder
