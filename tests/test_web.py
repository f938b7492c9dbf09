"""/healthz's answer for the whole app, on its own: with several UI workers it says ok only once
every worker has ended its first start (the workers' states come from the supervisor)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
import pytest
from starlette.applications import Starlette

from chat.live import ReplyStore
from chat.registry import EngineView
from chat.web import routes

pytestmark = pytest.mark.unit


def healthz(workers: list[dict]) -> tuple[int, dict]:
    ready = EngineView(key="k", preset="P", state="ready", status="Ready")
    registry = SimpleNamespace(overview=lambda: [ready], workers=lambda: workers)
    app = Starlette(routes=[r for r in routes(SimpleNamespace(registry=registry), ReplyStore()) if r.path == "/healthz"])

    async def ask() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
            return await client.get("/healthz")

    response = asyncio.run(ask())
    return response.status_code, response.json()


def test_one_process_with_its_engine_ready_is_ok():
    assert healthz([]) == (200, {"status": "ok", "engines": [
        {"preset": "P", "state": "ready", "status": "Ready", "running": 0, "waiting": 0, "kv_cache_usage": 0.0,
         "unfinished": 0, "streams": 0, "start_seconds": None}]})


def test_at_the_apps_start_it_waits_for_every_worker():
    code, body = healthz([{"index": 0, "state": "serving"}, {"index": 1, "state": "starting"}])
    assert code == 503 and body["status"] == "unavailable"
    assert body["reason"] == "1 of 2 UI workers are still starting."


def test_a_worker_being_replaced_later_does_not_take_the_app_down():
    code, body = healthz([{"index": 0, "state": "serving"}, {"index": 1, "state": "restarting"}])
    assert code == 200 and body["status"] == "ok" and "reason" not in body
