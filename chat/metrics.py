"""Prometheus metrics: the app's own, beside vLLM's engine metrics, served at /metrics.

vLLM registers its `vllm:*` metrics (time to first token, inter-token latency, queue time,
requests running and waiting, KV-cache use, generated tokens) in prometheus_client's default
registry; the app adds what only it sees: what the reader waited for, and how each reply ended.
Recording is a few dictionary lookups per token: cheap enough for the streaming path.

With several UI workers (`--ui-workers`) every process writes its samples to one folder
(prometheus_client's multiprocess mode, `PROMETHEUS_MULTIPROC_DIR`, set by the supervisor) and
/metrics from any of them reads them all: counters and histograms summed over the processes, the
gauge of replies in flight summed over the live ones, and one series per UI worker only where the
workers differ (`chat_ui_worker_up`).
"""

from __future__ import annotations

import os
import time
from collections import deque

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from chat.auth import Login
from chat.stats import ReplyStats

_LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.8, 1, 1.5, 2, 3, 5, 8, 13, 20, 30, 60)

STREAMS_IN_FLIGHT = Gauge("chat_streams_in_flight", "Replies being streamed to readers now.", ["preset"],
                          multiprocess_mode="livesum")
TIME_TO_FIRST_TOKEN = Histogram(
    "chat_time_to_first_token_seconds",
    "From a message arriving at the app to its first token, as the app saw it.",
    ["preset"],
    buckets=_LATENCY_BUCKETS,
)
INTER_TOKEN_LATENCY = Histogram(
    "chat_inter_token_latency_seconds",
    "Gap between consecutive streamed chunks of one reply, as the app saw it.",
    ["preset"],
    buckets=_LATENCY_BUCKETS,
)
REPLIES = Counter(
    "chat_replies_total",
    "Replies by how they ended: finished, max_tokens, context_full, stopped_by_user, disconnected, "
    "timed_out, engine_failed, unloaded, error.",
    ["preset", "finish"],
)
REJECTED = Counter(
    "chat_requests_rejected_total",
    "Requests refused before generating, by reason: busy, input (too long), or the error's kind.",
    ["preset", "reason"],
)
REPLIES_STARTED = Counter(
    "chat_replies_started_total",
    "Replies run into a log (chat/live.py), by what started them: page (a page's socket, as its Chat tab's "
    "message was sent), turn (the Chat tab's Gradio turn: no socket, or its page's start not there yet), "
    "api (a /chat client).",
    ["started_by"],
)
ENGINE_RESTARTS = Counter("chat_engine_restarts_total", "Engines restarted after their process died.", ["preset"])
UI_WORKER_UP = Gauge("chat_ui_worker_up", "1 while the UI worker serves, 0 while it starts or is replaced.",
                     ["ui_worker"], multiprocess_mode="mostrecent")


RECENT_FIRST_TOKENS: deque[tuple[float, str, float]] = deque(maxlen=10_000)  # (monotonic, preset, s)


def first_token(preset: str, seconds: float) -> None:
    TIME_TO_FIRST_TOKEN.labels(preset).observe(seconds)
    RECENT_FIRST_TOKENS.append((time.monotonic(), preset, seconds))


def reply_finished(stats: ReplyStats) -> None:
    REPLIES.labels(stats.preset, stats.finish.name.lower()).inc()


def rejected(preset: str, reason: str) -> None:
    REJECTED.labels(preset, reason).inc()


def reply_started(started_by: str) -> None:
    REPLIES_STARTED.labels(started_by).inc()


def _registry() -> CollectorRegistry:
    """This process's metrics, or with several processes writing to one folder, all of theirs."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        return REGISTRY
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def routes(login: Login | None = None) -> list[BaseRoute]:
    async def metrics(request: Request) -> Response:
        if login is not None and not await login.allows(request):
            return Response("Log in first.", status_code=401, headers={"WWW-Authenticate": 'Basic realm="chat"'})
        return Response(generate_latest(_registry()), media_type=CONTENT_TYPE_LATEST)

    return [Route("/metrics", metrics, methods=["GET"])]
