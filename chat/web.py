"""HTTP routes served beside the Gradio UI on the same server: health, the engine line the Chat
tab shows, and the WebSocket API."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import BaseRoute, Route

from chat import api
from chat.api_schema import GRACE_S
from chat.auth import Login
from chat.capacity_run import CapacityLab
from chat.engine import EngineState
from chat.live import ReplyStore
from chat.service import ChatService

NO_STORE = {"Cache-Control": "no-store"}


def routes(
    service: ChatService, logs: ReplyStore, login: Login | None = None, grace_s: float = GRACE_S,
    lab: CapacityLab | None = None,
) -> list[BaseRoute]:
    """/healthz (for load balancers: states and counts only), /livez, /status and the /chat WebSocket API."""
    async def healthz(request: Request) -> JSONResponse:
        """200 when every loaded engine is ready (and, with several UI workers, each has ended its
        first start); 503 with the reason while one starts or failed. With a login, strangers learn
        only whether the app serves."""
        views = service.registry.overview()
        workers = service.registry.workers()
        starting = sum(w["state"] == "starting" for w in workers)  # the app's first start only
        healthy = bool(views) and all(v.state in (EngineState.READY.value, EngineState.SLEEPING.value) for v in views)
        reason = "; ".join(v.status for v in views) or "No engine is loaded yet."
        if healthy and starting:
            healthy, reason = False, f"{starting} of {len(workers)} UI workers are still starting."
        body: dict[str, Any] = {"status": "ok" if healthy else "unavailable"}
        if login is not None and not await login.allows(request):
            return JSONResponse(body, status_code=200 if healthy else 503, headers=NO_STORE)
        body["engines"] = [
            {"preset": v.preset, "state": v.state, "status": v.status, "running": v.running, "waiting": v.waiting,
             "kv_cache_usage": v.kv_cache_usage, "unfinished": v.unfinished, "streams": v.streams,
             "start_seconds": v.start_seconds}
            for v in views
        ]
        if workers:
            body["workers"] = workers
        if not healthy:
            body["reason"] = reason
        return JSONResponse(body, status_code=200 if healthy else 503, headers=NO_STORE)

    async def livez(request: Request) -> PlainTextResponse:
        """200 while this process serves: what the front door's health checks ask each UI worker."""
        return PlainTextResponse("ok", headers=NO_STORE)

    async def status(request: Request) -> JSONResponse:
        """The Chat tab's engine line for `?preset=NAME`, which the page asks for every few seconds
        (chat/ui/engine_line.js): a plain request, where a Gradio event would cost the page a
        redraw of every component and the server a trip through its queue."""
        if login is not None and not await login.allows(request):
            return JSONResponse({"error": "Log in first."}, status_code=401)
        line = service.engine_line(request.query_params.get("preset") or None)
        return JSONResponse({"line": line, "banner": lab.banner() if lab is not None else ""}, headers=NO_STORE)

    return [
        Route("/healthz", healthz, methods=["GET"]),
        Route("/livez", livez, methods=["GET"]),
        Route("/status", status, methods=["GET"]),
        *api.routes(service, logs, allows=login.allows if login else None, grace_s=grace_s),
    ]
